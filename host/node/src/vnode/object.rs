//! The `Node` object and its status, built from configuration and the current health. Pure:
//! the heartbeat sends what these functions build.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::config::NodeConfig;
use super::heartbeat::Health;

pub use neocloud_api::FIELD_MANAGER;

/// Labels that NodeRestriction forbids a `system:node:<name>` identity to set; the node sets them
/// only when it runs under another identity (a ServiceAccount).
pub const RESTRICTED_LABELS: [&str; 1] = ["kubernetes.io/role"];

/// The Node as registered: labels and the taint. Status is sent separately. With
/// `restricted_labels` false, [`RESTRICTED_LABELS`] are left out.
pub fn node_object(cfg: &NodeConfig, restricted_labels: bool) -> Node {
    let mut labels = labels(cfg);
    if !restricted_labels {
        labels.retain(|k, _| !RESTRICTED_LABELS.contains(&k.as_str()));
    }
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![taint(cfg)]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The labels a scheduler and an operator select the node by.
fn labels(cfg: &NodeConfig) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("type".to_owned(), "virtual-kubelet".to_owned()),
        ("kubernetes.io/role".to_owned(), "agent".to_owned()),
        ("kubernetes.io/hostname".to_owned(), cfg.name.clone()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
    ]);
    for p in &cfg.providers {
        labels.insert(format!("cloud.aibrix.ai/provider-{p}"), "true".to_owned());
    }
    labels
}

/// The node's own taint.
pub(crate) fn taint(cfg: &NodeConfig) -> Taint {
    Taint {
        key: cfg.taint.key.clone(),
        value: Some(cfg.taint.value.clone()),
        effect: cfg.taint.effect.clone(),
        time_added: None,
    }
}

/// The status the node reports now: capacity, its `Ready` condition, addresses, kubelet port.
/// Only the `Ready` condition is ours; conditions written by others are left alone by the
/// server-side apply that sends this.
pub fn node_status(cfg: &NodeConfig, health: &Health, now: Timestamp) -> NodeStatus {
    let resources = BTreeMap::from([
        ("pods".to_owned(), Quantity(cfg.max_pods.to_string())),
        (
            "nvidia.com/gpu".to_owned(),
            Quantity(health.gpus.min(cfg.max_gpus).to_string()),
        ),
        ("cpu".to_owned(), Quantity("1000".to_owned())),
        ("memory".to_owned(), Quantity("4Ti".to_owned())),
    ]);
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(vec![ready_condition(health, now)]),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: cfg.address.clone(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: cfg.name.clone(),
            },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(cfg.kubelet_port),
            }),
        }),
        node_info: Some(system_info()),
        ..Default::default()
    }
}

fn ready_condition(health: &Health, now: Timestamp) -> NodeCondition {
    let (status, reason) = if health.healthy {
        ("True", "ProvidersHealthy")
    } else {
        ("False", "ProvidersUnhealthy")
    };
    NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(health.message.clone()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(health.since)),
    }
}

fn system_info() -> NodeSystemInfo {
    let version = env!("CARGO_PKG_VERSION");
    NodeSystemInfo {
        architecture: "amd64".into(),
        operating_system: "linux".into(),
        os_image: "neocloud-node".into(),
        kernel_version: "n/a".into(),
        container_runtime_version: format!("neocloud://{version}"),
        kubelet_version: format!("v1.35.0-neocloud-{version}"),
        kube_proxy_version: String::new(),
        boot_id: String::new(),
        machine_id: String::new(),
        system_uuid: String::new(),
        swap: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NodeConfig {
        let mut cfg = NodeConfig::named("gpu-burst");
        cfg.providers = vec!["runpod".into(), "vast".into()];
        cfg.max_gpus = 8;
        cfg
    }

    #[test]
    fn the_node_carries_the_virtual_kubelet_labels_and_one_label_per_provider() {
        let node = node_object(&cfg(), true);
        let labels = node.metadata.labels.unwrap();
        assert_eq!(labels["type"], "virtual-kubelet");
        assert_eq!(labels["kubernetes.io/role"], "agent");
        assert_eq!(labels["cloud.aibrix.ai/provider-runpod"], "true");
        assert_eq!(labels["cloud.aibrix.ai/provider-vast"], "true");
        let taints = node.spec.unwrap().taints.unwrap();
        assert_eq!(taints[0].key, "virtual-kubelet.io/provider");
    }

    #[test]
    fn restricted_labels_can_be_left_out_for_a_node_identity() {
        let labels = node_object(&cfg(), false).metadata.labels.unwrap();
        assert!(!labels.contains_key("kubernetes.io/role"));
        assert_eq!(labels["type"], "virtual-kubelet");
    }

    #[test]
    fn allocatable_gpus_never_exceed_the_configured_ceiling() {
        let now = Timestamp::now();
        let plenty = Health {
            healthy: true,
            message: "ok".into(),
            gpus: 500,
            since: now,
        };
        let status = node_status(&cfg(), &plenty, now);
        assert_eq!(status.allocatable.unwrap()["nvidia.com/gpu"].0, "8");
        let few = Health { gpus: 3, ..plenty };
        assert_eq!(
            node_status(&cfg(), &few, now).capacity.unwrap()["nvidia.com/gpu"].0,
            "3"
        );
    }

    #[test]
    fn an_unhealthy_node_reports_ready_false_with_the_reason() {
        let now = Timestamp::now();
        let health = Health {
            healthy: false,
            message: "runpod: 401".into(),
            gpus: 0,
            since: now,
        };
        let cond = &node_status(&cfg(), &health, now).conditions.unwrap()[0];
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_deref()),
            ("False", Some("ProvidersUnhealthy"))
        );
        assert_eq!(cond.message.as_deref(), Some("runpod: 401"));
    }
}
