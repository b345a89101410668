//! Registering the Node and keeping it alive: the status (with our `Ready` condition) is applied
//! on every beat, and the Lease in `kube-node-lease` is renewed only while providers are healthy.
//!
//! Everything is written as the node's own identity (`system:node:<name>`), which the Node
//! authorizer and NodeRestriction confine to this Node and this Lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

use super::config::NodeConfig;
use super::object::{FIELD_MANAGER, node_object, node_status, taint};

/// The namespace that holds node Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// How many times registration reads and writes the Node before a conflict is an error.
const REGISTER_TRIES: u32 = 5;

/// What the node knows of its providers right now.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// True while at least one enabled provider answers with our credentials.
    pub healthy: bool,
    /// Why, in a sentence; shown as the `Ready` condition's message.
    pub message: String,
    /// GPUs the node can offer now (from the catalog, within the budget).
    pub gpus: u32,
    /// When `healthy` last changed.
    pub since: Timestamp,
}

/// Registers the Node and sends its heartbeats.
#[derive(Debug)]
pub struct Heartbeat {
    nodes: Api<Node>,
    leases: Api<Lease>,
    cfg: NodeConfig,
    health: watch::Receiver<Health>,
}

impl Heartbeat {
    /// A heartbeat for `cfg.name`, following `health`. `client` should authenticate as
    /// `system:node:<name>`.
    pub fn new(client: Client, cfg: NodeConfig, health: watch::Receiver<Health>) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, LEASE_NAMESPACE),
            cfg,
            health,
        }
    }

    /// Creates the Node, or, if it exists, restores our labels and our taint without touching
    /// taints others added (such as the controller manager's `not-ready`). Under a node identity,
    /// NodeRestriction refuses [`super::RESTRICTED_LABELS`]; the node then registers without
    /// them and says so in its log.
    pub async fn register(&self) -> Result<Node, kube::Error> {
        match self.register_with(true).await {
            Err(kube::Error::Api(s)) if s.code == 403 && refuses_labels(&s.message) => {
                tracing::warn!(node = %self.cfg.name, reason = %s.message,
                    "registering without labels a node identity may not set");
                self.register_with(false).await
            }
            other => other,
        }
    }

    /// Creates or updates the Node. The controller manager writes to a new Node within moments
    /// of its creation (taints, annotations), so an update can lose the race; like the kubelet,
    /// it then reads the Node again and retries, a bounded number of times.
    async fn register_with(&self, restricted_labels: bool) -> Result<Node, kube::Error> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.register_once(restricted_labels).await {
                Err(kube::Error::Api(s)) if s.code == 409 && tries < REGISTER_TRIES => {
                    tracing::debug!(node = %self.cfg.name, tries, reason = %s.message,
                        "node changed under us while registering; reading it again");
                }
                other => return other,
            }
        }
    }

    async fn register_once(&self, restricted_labels: bool) -> Result<Node, kube::Error> {
        let wanted = node_object(&self.cfg, restricted_labels);
        let Some(mut node) = self.nodes.get_opt(&self.cfg.name).await? else {
            return self.nodes.create(&PostParams::default(), &wanted).await;
        };
        let labels = node.metadata.labels.get_or_insert_default();
        labels.extend(wanted.metadata.labels.unwrap_or_default());
        let taints = node
            .spec
            .get_or_insert_default()
            .taints
            .get_or_insert_default();
        let ours = taint(&self.cfg);
        if !taints
            .iter()
            .any(|t| t.key == ours.key && t.effect == ours.effect)
        {
            taints.push(ours);
        }
        self.nodes
            .replace(&self.cfg.name, &PostParams::default(), &node)
            .await
    }

    /// One beat: applies the status, and renews the Lease if healthy. Returns whether the Lease
    /// was renewed.
    pub async fn beat(&self) -> Result<bool, kube::Error> {
        let health = self.health.borrow().clone();
        let now = Timestamp::now();
        let status = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.cfg.name},
            "status": node_status(&self.cfg, &health, now),
        });
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        self.nodes
            .patch_status(&self.cfg.name, &pp, &Patch::Apply(&status))
            .await?;
        if health.healthy {
            self.renew_lease(now).await?;
        }
        Ok(health.healthy)
    }

    async fn renew_lease(&self, now: Timestamp) -> Result<(), kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.cfg.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.cfg.name.clone()),
                lease_duration_seconds: Some(4 * self.cfg.lease_renew_seconds as i32),
                renew_time: Some(MicroTime(now)),
                ..Default::default()
            }),
        };
        let mut body = serde_json::to_value(&lease).map_err(kube::Error::SerdeError)?;
        body["apiVersion"] = "coordination.k8s.io/v1".into();
        body["kind"] = "Lease".into();
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        self.leases
            .patch(&self.cfg.name, &pp, &Patch::Apply(&body))
            .await
            .map(|_| ())
    }

    /// Beats every `lease_renew_seconds`, and at once whenever health changes, until the health
    /// sender is dropped. A failed beat is logged and retried on the next tick.
    pub async fn run(mut self) {
        let period = Duration::from_secs(u64::from(self.cfg.lease_renew_seconds.max(1)));
        loop {
            if let Err(e) = self.beat().await {
                tracing::warn!(node = %self.cfg.name, error = %e, "node heartbeat failed");
            }
            tokio::select! {
                changed = self.health.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(period) => {}
            }
        }
    }
}

/// Whether a 403 is NodeRestriction refusing labels: "is not allowed to set the following
/// labels" on create, "is not allowed to modify labels" on update.
fn refuses_labels(message: &str) -> bool {
    message.contains("not allowed to set the following labels")
        || message.contains("not allowed to modify labels")
}
