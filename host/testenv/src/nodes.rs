//! Node objects that stand in for a cluster's machines where no kubelet runs (the remote GPU
//! clusters of the `kube` provider's tests): created with their labels, then given the Ready
//! condition and the capacity a kubelet would report, so the scheduler places Pods on them.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// Creates Node `name` with `labels` and marks it Ready with `allocatable` (also its capacity),
/// e.g. `{"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}`.
pub async fn ready_node(
    client: &Client,
    name: &str,
    labels: Value,
    allocatable: Value,
) -> Result<Node, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
        .map_err(kube::Error::SerdeError)?;
    nodes.create(&PostParams::default(), &node).await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "capacity": allocatable,
        "allocatable": allocatable,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
}
