//! Which cluster this node rents for: the configured `clusterId`, else one derived from the UID of
//! the `kube-system` namespace, so that two installs left at their defaults never share a prefix
//! (and never sweep each other's instances in a shared cloud account).
//!
//! Not here: the derivation itself ([`ClusterId::derived_from_uid`]) and the name rules.

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};

use crate::naming::ClusterId;

/// The namespace whose UID names the cluster: every cluster has it, for as long as it lives.
pub const IDENTITY_NAMESPACE: &str = "kube-system";

/// The configured id, else the derived one. Fails, naming `clusterId`, when there is none to
/// derive from: a node never falls back to a shared default.
pub async fn resolve(client: &Client, configured: Option<ClusterId>) -> anyhow::Result<ClusterId> {
    if let Some(id) = configured {
        tracing::info!(cluster = %id, "clusterId from the configuration");
        return Ok(id);
    }
    let uid = identity_uid(client).await.map_err(|reason| {
        anyhow::anyhow!(
            "clusterId: not set, and it cannot be derived from the UID of namespace \
             {IDENTITY_NAMESPACE}: {reason}; set clusterId in the node's configuration (1-16 of \
             [a-z0-9], unique among the clusters that share a cloud account), or allow the node \
             to get namespaces/{IDENTITY_NAMESPACE}"
        )
    })?;
    let id = ClusterId::derived_from_uid(&uid);
    tracing::info!(cluster = %id, namespace_uid = %uid, "clusterId derived from namespace {IDENTITY_NAMESPACE}");
    Ok(id)
}

async fn identity_uid(client: &Client) -> Result<String, String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = namespaces
        .get(IDENTITY_NAMESPACE)
        .await
        .map_err(|e| format!("failed to get it: {e}"))?;
    namespace
        .metadata
        .uid
        .filter(|uid| !uid.is_empty())
        .ok_or_else(|| "it has no UID".to_owned())
}
