//! Node objects that stand in for a cluster's machines where no kubelet runs (the remote GPU
//! clusters of the `kube` provider's tests): created with their labels and, in the same write,
//! the Ready condition and the capacity a kubelet would report, so the scheduler places Pods on
//! them.

use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

/// Creates Node `name` with `labels`, Ready with `allocatable` (also its capacity),
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

/// Creates the Node `metadata` describes with `status` already in it, in one write: the API
/// server keeps a Node's status on create (a kubelet registers its node so). A status patched in
/// a second write would race KWOK, which renders a managed node's Ready status from the node as
/// it last saw it: from the bare node it writes its default allocatable (`pods: "110"`), and
/// that patch can land after the second write (then a node meant to take no Pod takes 110).
pub(crate) async fn create_with_status(
    client: &Client,
    metadata: Value,
    status: Value,
) -> Result<Node, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": metadata, "status": status}))
        .map_err(kube::Error::SerdeError)?;
    nodes.create(&PostParams::default(), &node).await
}
