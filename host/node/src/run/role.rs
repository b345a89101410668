//! Which replica leads, on the Pods themselves: the leader labels its own Pod
//! `cloud.aibrix.ai/leader=true` (and takes the label off any other Pod of its namespace that
//! still has it, such as a former leader that lost the Lease), and a replica that starts takes it
//! off its own Pod. A Service that selects the label routes to the leader only (the runner
//! callback's, `config/components/runner-callback`), while every healthy replica stays ready, so
//! rolling updates and `kubectl rollout status` work with a standby.
//!
//! Only in a Pod: without `POD_NAME` and `POD_NAMESPACE` there is nothing to label. A failure
//! is logged, not fatal: the leader leads without it, and says why the Service finds no leader.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

/// The label the leader's Pod carries.
pub const LEADER_LABEL: &str = "cloud.aibrix.ai/leader";

/// This replica's Pod, from the Downward API's `POD_NAME` and `POD_NAMESPACE`: the Pods of its
/// namespace, the namespace, and its name.
fn own_pod(client: &Client) -> Option<(Api<Pod>, String, String)> {
    let name = std::env::var("POD_NAME").ok().filter(|n| !n.is_empty())?;
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())?;
    Some((Api::namespaced(client.clone(), &namespace), namespace, name))
}

/// The image of this replica's own container (its Pod's first), which relay Pods run by
/// default; `None` outside a Pod or when the Pod cannot be read (said in the log).
pub async fn own_image(client: &Client) -> Option<String> {
    let (pods, namespace, name) = own_pod(client)?;
    match pods.get(&name).await {
        Ok(pod) => pod.spec?.containers.first()?.image.clone(),
        Err(error) => {
            tracing::warn!(pod = %format!("{namespace}/{name}"), %error,
                "could not read this replica's Pod for its image");
            None
        }
    }
}

async fn set(pods: &Api<Pod>, name: &str, leader: bool) -> kube::Result<()> {
    let value = if leader { json!("true") } else { json!(null) };
    pods.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {LEADER_LABEL: value}}})),
    )
    .await
    .map(|_| ())
}

/// A replica starting (a standby until it leads): its Pod is not the leader's.
pub async fn standing_by(client: &Client) {
    let Some((pods, namespace, name)) = own_pod(client) else {
        return;
    };
    if let Err(error) = set(&pods, &name, false).await {
        tracing::warn!(pod = %format!("{namespace}/{name}"), %error,
            "could not take the {LEADER_LABEL} label off this replica's Pod");
    }
}

/// This replica leads: its Pod gets the label, and no other Pod of its namespace keeps it.
pub async fn leading(client: &Client) {
    let Some((pods, namespace, name)) = own_pod(client) else {
        return;
    };
    if let Err(error) = set(&pods, &name, true).await {
        tracing::warn!(pod = %format!("{namespace}/{name}"), %error,
            "could not label this replica's Pod {LEADER_LABEL}=true; a Service selecting it \
             (the runner callback's) finds no leader");
    }
    let others = match pods
        .list(&ListParams::default().labels(&format!("{LEADER_LABEL}=true")))
        .await
    {
        Ok(list) => list.items,
        Err(error) => {
            tracing::warn!(%namespace, %error, "could not list the Pods labelled {LEADER_LABEL}");
            return;
        }
    };
    for pod in others {
        let Some(other) = pod.metadata.name.filter(|n| *n != name) else {
            continue;
        };
        match set(&pods, &other, false).await {
            Ok(()) => {
                tracing::info!(pod = %other, "took the {LEADER_LABEL} label off a former leader")
            }
            Err(error) => tracing::warn!(pod = %other, %error,
                "could not take the {LEADER_LABEL} label off a former leader"),
        }
    }
}
