//! What a provider reports about an instance we rented: its phase and the facts the node mirrors
//! into the binding and the Pod status.
//!
//! Not for provider wire formats; adapters translate those into these types.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::gpu::GpuModel;
use crate::provider_id::ProviderId;

/// The provider-neutral lifecycle phase of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstancePhase {
    /// Accepted by the provider, not yet scheduled or pulling its image.
    Pending,
    /// Booting or pulling the image.
    Starting,
    /// Running the workload.
    Running,
    /// Stopped (by us, the workload exiting, or a spot eviction); still billed for storage.
    Stopped,
    /// Failed and will never run (Vast `exited`/`offline`, RunPod `ERROR`).
    Failed,
    /// Being deleted.
    Terminating,
    /// Deleted; no longer billed.
    Terminated,
    /// The provider reports a state we cannot map (kept in [`InstanceState::provider_status`]).
    Unknown,
}

impl InstancePhase {
    /// Whether the instance will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, InstancePhase::Failed | InstancePhase::Terminated)
    }
}

impl fmt::Display for InstancePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            InstancePhase::Pending => "pending",
            InstancePhase::Starting => "starting",
            InstancePhase::Running => "running",
            InstancePhase::Stopped => "stopped",
            InstancePhase::Failed => "failed",
            InstancePhase::Terminating => "terminating",
            InstancePhase::Terminated => "terminated",
            InstancePhase::Unknown => "unknown",
        };
        f.write_str(s)
    }
}

/// A network endpoint of a running instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// The port inside the container.
    pub container_port: u16,
    /// The public host or IP.
    pub host: String,
    /// The public port.
    pub port: u16,
}

/// One instance as the provider reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceState {
    /// The provider.
    pub provider: ProviderId,
    /// The provider's instance id.
    pub id: String,
    /// Our deterministic external name (RunPod/Lambda `name`, Vast `label`).
    pub external_name: String,
    /// The neutral phase.
    pub phase: InstancePhase,
    /// The provider's own status string, verbatim, for messages.
    pub provider_status: String,
    /// A human-readable reason, if the provider gave one.
    pub message: Option<String>,
    /// GPU model and count.
    pub gpu: GpuModel,
    /// Number of GPUs.
    pub gpu_count: u32,
    /// What the instance costs per hour while it runs.
    pub price_per_hour: f64,
    /// Region or datacenter.
    pub region: String,
    /// Public endpoints, once running.
    pub endpoints: Vec<Endpoint>,
    /// The instance's public IP address, once the provider reports one (the Pod's `podIP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<String>,
    /// When the provider created it, if reported.
    pub created_at: Option<DateTime<Utc>>,
    /// Rented as spot (interruptible, bid): the provider may reclaim it at any time (Vast.ai's
    /// `is_bid`, RunPod's `interruptible`).
    #[serde(default)]
    pub interruptible: bool,
    /// The workload's exit code, where the provider itself ran the workload and reports how it
    /// ended (a remote cluster's Pod); `None` for clouds, whose workloads the runner reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Whether the workload is ready, where the provider itself probes it (a remote cluster's
    /// Pod, its `Ready` condition); `None` for clouds, whose workloads the runner probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
}

impl InstanceState {
    /// Whether the provider took the instance back: an interruptible instance that stopped
    /// without us stopping it, or one the provider says it preempted (Lambda's `preempted`).
    pub fn reclaimed(&self) -> bool {
        self.phase == InstancePhase::Stopped
            && (self.interruptible || self.provider_status.eq_ignore_ascii_case("preempted"))
    }

    /// Whether the provider refused the instance for capacity after it was created: a remote
    /// cluster's Pod its scheduler finds no node for ([`UNSCHEDULABLE`]). Nothing runs; the
    /// rental failed as a refusal at creation does.
    pub fn refused_capacity(&self) -> bool {
        self.phase == InstancePhase::Pending && self.provider_status == UNSCHEDULABLE
    }
}

/// The provider status of an instance its provider's scheduler cannot place (the reason a
/// Kubernetes scheduler gives a Pod that no node fits).
pub const UNSCHEDULABLE: &str = "Unschedulable";
