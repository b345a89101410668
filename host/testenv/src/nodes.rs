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
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({
        "capacity": allocatable,
        "allocatable": allocatable,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": now, "lastTransitionTime": now}],
    });
    create_with_status(client, json!({"name": name, "labels": labels}), status).await
}

/// Creates the Node `metadata` describes, then merges `status` into its status.
pub(crate) async fn create_with_status(
    client: &Client,
    metadata: Value,
    status: Value,
) -> Result<Node, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node =
        serde_json::from_value(json!({"metadata": metadata})).map_err(kube::Error::SerdeError)?;
    let created = nodes.create(&PostParams::default(), &node).await?;
    let name = created.metadata.name.unwrap_or_default();
    nodes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
}
