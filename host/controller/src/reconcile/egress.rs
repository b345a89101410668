//! The Pod's egress destinations (`cloud.aibrix.ai/egress`) on their way to its runner, and the
//! refusal of a Pod that names some when no runner would serve them (a node without runners, a
//! Pod a container provider runs natively, or one the `kube` provider may place), naming the
//! annotation. Egress is never silently dropped.
//!
//! Not the parsing (`neocloud_core::translate::egress`), not the carrying of connections (the
//! callback's `egress` route) nor the dialling (`crate::egress`).

use k8s_openapi::api::core::v1::Pod;
use neocloud_core::translate::{ANNOTATION_PREFIX, EGRESS_ANNOTATION};
use neocloud_protocol::EgressTarget;

use kube::ResourceExt;

use super::runners::Runners;
use neocloud_burst_policy::PolicyRegistry;

/// The destinations `pod` names, as its runner serves them (empty when none).
pub(super) fn for_runner(pod: &Pod) -> Vec<EgressTarget> {
    neocloud_core::translate::egress(pod)
        .into_iter()
        .map(|d| EgressTarget {
            service: d.service,
            namespace: d.namespace,
            port: d.port,
        })
        .collect()
}

/// Why the Pod's egress cannot be served on this node, naming the annotation; `None` when it
/// can, or when it names none. `remote_cluster` as for probes.
pub(super) fn unhonoured(
    pod: &Pod,
    runners: Option<&Runners>,
    remote_cluster: bool,
) -> Option<String> {
    if neocloud_core::translate::egress(pod).is_empty() {
        return None;
    }
    let why = super::probes::without_runner(pod, runners, remote_cluster)?;
    Some(format!(
        "pod is not supported: metadata.annotations[{ANNOTATION_PREFIX}{EGRESS_ANNOTATION}]: \
         egress is served by the runner, and {why}"
    ))
}

/// Why a destination the Pod names is not allowed by a BurstPolicy that governs its namespace
/// (`spec.egress`), naming the entry and the policy; `None` when every one is allowed.
pub(super) fn forbidden(pod: &Pod, policies: Option<&PolicyRegistry>) -> Option<String> {
    let named = neocloud_core::translate::egress(pod);
    if named.is_empty() {
        return None;
    }
    let namespace = pod.namespace().unwrap_or_default();
    let limits = policies?.egress_limits(&namespace);
    let (destination, policy) = named.iter().find_map(|d| {
        let (policy, _) = limits.iter().find(|(_, limit)| !limit.allows(d))?;
        Some((d, policy))
    })?;
    Some(format!(
        "pod is not supported: metadata.annotations[{ANNOTATION_PREFIX}{EGRESS_ANNOTATION}]: \
         {destination} is not allowed for namespace {namespace} by BurstPolicy {policy} \
         (spec.egress.allowed)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_naming_egress_on_a_node_without_runners_is_refused_naming_the_annotation() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"annotations": {"cloud.aibrix.ai/egress": "registry.ml:8080"}},
            "spec": {"containers": [{"name": "main", "image": "i", "command": ["sh"]}]},
        }))
        .unwrap();
        assert_eq!(
            for_runner(&pod),
            [EgressTarget {
                service: "registry".into(),
                namespace: "ml".into(),
                port: 8080
            }]
        );
        let refused = unhonoured(&pod, None, false).expect("no runner");
        assert_eq!(
            refused,
            "pod is not supported: metadata.annotations[cloud.aibrix.ai/egress]: egress is \
             served by the runner, and this node runs none (configure a runner)"
        );
        let plain: Pod = serde_json::from_value(json!({"spec": {"containers": []}})).unwrap();
        assert_eq!(unhonoured(&plain, None, false), None);
    }
}
