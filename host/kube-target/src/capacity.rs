//! A remote cluster's free GPUs, from its Nodes and the Pods bound to them: per node,
//! allocatable `nvidia.com/gpu` minus what its live Pods request, with the GPU product and memory
//! that NVIDIA's GPU feature discovery publishes as node labels.
//!
//! Pure: the caller passes what its watches cached. Not for prices (see [`crate::offers`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The extended resource GPUs are scheduled by.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// GPU feature discovery's label for the GPU product, e.g. `NVIDIA-A100-SXM4-80GB`.
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// GPU feature discovery's label for the memory of one GPU, in MiB.
pub const MEMORY_LABEL: &str = "nvidia.com/gpu.memory";

/// Free GPUs of one product on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpus {
    /// The node.
    pub node: String,
    /// Its `nvidia.com/gpu.product` label.
    pub product: String,
    /// Memory per GPU in GiB, from `nvidia.com/gpu.memory` (MiB), if labelled.
    pub memory_gib: Option<u32>,
    /// Allocatable GPUs not requested by a live Pod.
    pub free: u32,
}

/// An integer quantity (`"4"`, `"4000m"`); `None` for anything else.
fn whole(q: &Quantity) -> Option<u32> {
    let s = q.0.trim();
    if let Some(milli) = s.strip_suffix('m') {
        let m: u64 = milli.parse().ok()?;
        return u32::try_from(m / 1000).ok();
    }
    s.parse().ok()
}

/// GPUs a Pod holds on its node: the larger of its containers' sum and its largest init
/// container, as the scheduler counts; requests, or limits where no request is given.
pub fn pod_gpus(pod: &Pod) -> u32 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| -> u32 {
        let r = c.resources.as_ref();
        r.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(GPU_RESOURCE))
            .or_else(|| {
                r.and_then(|r| r.limits.as_ref())
                    .and_then(|m| m.get(GPU_RESOURCE))
            })
            .and_then(whole)
            .unwrap_or(0)
    };
    let running: u32 = spec.containers.iter().map(of).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(of)
        .max()
        .unwrap_or(0);
    running.max(init)
}

/// Whether a Pod still holds its resources: bound, and neither `Succeeded` nor `Failed`.
fn holds(pod: &Pod) -> Option<&str> {
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    (!matches!(phase, Some("Succeeded" | "Failed"))).then_some(node)
}

/// Whether new Pods can land on the node: Ready, not cordoned, and no taint that repels
/// Pods other than the GPU taint our Pods tolerate.
fn schedulable(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return false;
    }
    let repelled = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|t| t.key != GPU_RESOURCE && (t.effect == "NoSchedule" || t.effect == "NoExecute"));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready && !repelled
}

/// Free GPUs per schedulable, GPU-labelled node, in node-name order. Nodes without a product
/// label or without allocatable GPUs are left out.
pub fn free_gpus<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Vec<NodeGpus> {
    let mut used: BTreeMap<&str, u32> = BTreeMap::new();
    for pod in pods {
        if let Some(node) = holds(pod) {
            *used.entry(node).or_default() += pod_gpus(pod);
        }
    }
    let mut out: Vec<NodeGpus> = nodes
        .into_iter()
        .filter(|n| schedulable(n))
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let labels = n.metadata.labels.as_ref()?;
            let product = labels.get(PRODUCT_LABEL)?.trim();
            if product.is_empty() {
                return None;
            }
            let allocatable = n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(GPU_RESOURCE))
                .and_then(whole)?;
            let memory_gib = labels
                .get(MEMORY_LABEL)
                .and_then(|m| m.trim().parse::<u32>().ok())
                .map(|mib| (mib + 512) / 1024);
            Some(NodeGpus {
                node: name.to_owned(),
                product: product.to_owned(),
                memory_gib,
                free: allocatable.saturating_sub(used.get(name).copied().unwrap_or(0)),
            })
        })
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn node(name: &str, product: &str, gpus: u32, ready: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {PRODUCT_LABEL: product, MEMORY_LABEL: "81920"}},
            "status": {
                "allocatable": {GPU_RESOURCE: gpus.to_string(), "cpu": "64"},
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
            }
        }))
        .unwrap()
    }

    pub(crate) fn pod_on(node: &str, gpus: u32, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{node}-{gpus}-{phase}"), "namespace": "w"},
            "spec": {"nodeName": node, "containers": [
                {"name": "a", "resources": {"limits": {GPU_RESOURCE: gpus.to_string()}}},
                {"name": "b", "resources": {"requests": {"cpu": "1"}}}
            ]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn free_gpus_are_allocatable_minus_what_live_pods_hold() {
        let nodes = [
            node("n1", "NVIDIA-A100-SXM4-80GB", 8, true),
            node("n2", "NVIDIA-H100-80GB-HBM3", 4, true),
        ];
        let pods = [
            pod_on("n1", 3, "Running"),
            pod_on("n1", 2, "Pending"),
            pod_on("n1", 4, "Succeeded"),
            pod_on("n2", 1, "Failed"),
        ];
        let free = free_gpus(&nodes, &pods);
        assert_eq!(free.len(), 2);
        assert_eq!((free[0].node.as_str(), free[0].free), ("n1", 3));
        assert_eq!(free[0].memory_gib, Some(80));
        assert_eq!((free[1].node.as_str(), free[1].free), ("n2", 4));
    }

    #[test]
    fn nodes_not_ready_cordoned_tainted_or_unlabelled_offer_nothing() {
        let mut cordoned = node("c", "A40", 2, true);
        cordoned.spec.get_or_insert_default().unschedulable = Some(true);
        let mut tainted = node("t", "A40", 2, true);
        tainted.spec.get_or_insert_default().taints = Some(vec![
            serde_json::from_value(
                json!({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}),
            )
            .unwrap(),
        ]);
        let mut gpu_taint = node("g", "A40", 2, true);
        gpu_taint.spec.get_or_insert_default().taints = Some(vec![
            serde_json::from_value(json!({"key": GPU_RESOURCE, "effect": "NoSchedule"})).unwrap(),
        ]);
        let mut unlabelled = node("u", "A40", 2, true);
        unlabelled.metadata.labels = None;
        let nodes = [
            node("r", "A40", 2, false),
            cordoned,
            tainted,
            gpu_taint,
            unlabelled,
        ];
        let free = free_gpus(&nodes, &[]);
        assert_eq!(
            free.iter().map(|f| f.node.as_str()).collect::<Vec<_>>(),
            ["g"]
        );
    }

    #[test]
    fn init_containers_count_as_the_scheduler_counts_them_and_quantities_parse() {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {"nodeName": "n", "containers": [
                {"name": "a", "resources": {"requests": {GPU_RESOURCE: "1"}, "limits": {GPU_RESOURCE: "1"}}}
            ], "initContainers": [
                {"name": "i", "resources": {"limits": {GPU_RESOURCE: "2000m"}}}
            ]}
        }))
        .unwrap();
        assert_eq!(pod_gpus(&pod), 2);
        assert_eq!(whole(&Quantity("1.5".into())), None);
    }
}
