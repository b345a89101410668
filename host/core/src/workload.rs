//! The provider-neutral description of what a Pod wants to run and where it may run.
//!
//! Built from a Pod by [`crate::translate`]; consumed by the broker and the provider adapters.
//! Secret and ConfigMap references stay unresolved here: the node resolves them just before
//! renting, so this type never holds secret values.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::gpu::GpuModel;
use crate::provider_id::ProviderId;

/// Default container disk for Vast instances, in GiB (the specification's default).
pub const VAST_DEFAULT_DISK_GIB: u32 = 20;
/// Default minimum host reliability for Vast offers (the specification's default).
pub const VAST_DEFAULT_MIN_RELIABILITY: f64 = 0.95;

/// Everything needed to place and start one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    /// The container image.
    pub image: String,
    /// Entrypoint override (Kubernetes `command`); empty keeps the image's.
    pub command: Vec<String>,
    /// Arguments (Kubernetes `args`).
    pub args: Vec<String>,
    /// Environment variables in Pod order.
    pub env: Vec<EnvVar>,
    /// Whole Secrets or ConfigMaps imported as environment (Kubernetes `envFrom`).
    pub env_from: Vec<EnvFromRef>,
    /// Ports the container listens on.
    pub ports: Vec<PortSpec>,
    /// GPU count and acceptable models.
    pub gpu: GpuRequest,
    /// The container's other resources (CPU, memory, ...), as the Pod asks for them.
    #[serde(default, skip_serializing_if = "Resources::is_empty")]
    pub resources: Resources,
    /// Container disk in GiB (`cloud.aibrix.ai/disk-gb`), if set.
    pub disk_gib: Option<u32>,
    /// On-demand, spot or either.
    pub capacity_type: CapacityType,
    /// Acceptable regions; empty means anywhere.
    pub regions: Vec<String>,
    /// Allowed providers in preference order; empty means every enabled provider.
    pub providers: Vec<ProviderId>,
    /// The most this workload pays per hour for the whole instance.
    pub max_price_per_hour: Option<f64>,
    /// A CEL boolean expression every chosen offer must satisfy.
    pub constraint: Option<String>,
    /// A CEL number expression; higher ranks first.
    pub rank: Option<String>,
    /// The BurstPolicy to use instead of the node's default.
    pub policy: Option<String>,
    /// Provider-specific narrowing.
    pub hints: ProviderHints,
}

/// A container's requests and limits other than GPUs, by resource name, with each quantity as
/// the Pod wrote it (`cpu: "8"`, `memory: 64Gi`). A cloud sizes its instance by the GPU; a
/// remote cluster's Pod asks for these, so its scheduler fits it as the local one would have.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// `resources.requests`, GPUs left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    /// `resources.limits`, GPUs left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

impl Resources {
    /// Whether the Pod asks for nothing but GPUs.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.limits.is_empty()
    }
}

/// The GPUs a workload needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuRequest {
    /// GPUs per instance (the `nvidia.com/gpu` limit).
    pub count: u32,
    /// Acceptable models; empty means any model.
    pub accepted: Vec<GpuModel>,
}

impl GpuRequest {
    /// Whether an offered model is acceptable.
    pub fn accepts(&self, offered: &GpuModel) -> bool {
        self.accepted.is_empty() || self.accepted.iter().any(|a| a.accepts(offered))
    }

    /// Requested names the canonical table does not know (reported, never guessed).
    pub fn unknown_names(&self) -> Vec<&str> {
        self.accepted
            .iter()
            .filter(|g| !g.is_known())
            .map(GpuModel::name)
            .collect()
    }
}

/// Spot, on-demand, or either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    /// Not interruptible (the default).
    #[default]
    OnDemand,
    /// Interruptible, usually cheaper.
    Spot,
    /// Either.
    Any,
}

impl fmt::Display for CapacityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CapacityType::OnDemand => "on-demand",
            CapacityType::Spot => "spot",
            CapacityType::Any => "any",
        })
    }
}

/// One environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// The variable name.
    pub name: String,
    /// Its value, literal or still to be resolved.
    pub value: EnvValue,
}

/// The value of an environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "camelCase")]
pub enum EnvValue {
    /// A value written in the Pod spec.
    Literal {
        /// The value.
        value: String,
    },
    /// A key of a Secret in the Pod's namespace, not yet read.
    SecretKey(KeyRef),
    /// A key of a ConfigMap in the Pod's namespace, not yet read.
    ConfigMapKey(KeyRef),
}

/// An unresolved reference to one key of a Secret or ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// The object name.
    pub name: String,
    /// The key inside it.
    pub key: String,
    /// Whether a missing object or key is allowed (the variable is then left unset).
    pub optional: bool,
}

/// An unresolved `envFrom` import of a whole Secret or ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvFromRef {
    /// Secret or ConfigMap.
    pub kind: EnvFromKind,
    /// The object name.
    pub name: String,
    /// A prefix added to every imported key.
    pub prefix: Option<String>,
    /// Whether a missing object is allowed.
    pub optional: bool,
}

/// The kind of object an `envFrom` entry imports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EnvFromKind {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
}

/// A container port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortSpec {
    /// The port number inside the container.
    pub container_port: u16,
    /// TCP or UDP.
    pub protocol: PortProtocol,
    /// The port's name, if any.
    pub name: Option<String>,
}

/// A port protocol providers can expose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PortProtocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
}

/// Provider-specific narrowing from `cloud.aibrix.ai/vast-*` and `runpod-*` annotations.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHints {
    /// Vast.ai hints, with the specification's defaults.
    pub vast: VastHints,
    /// RunPod's secure or community cloud; `None` lets RunPod choose.
    pub runpod_cloud_type: Option<RunpodCloudType>,
    /// `cloud.aibrix.ai/runner: "false"`: a container provider runs the Pod's command itself,
    /// without the node's runner (no logs, no exit code; the behaviour before the runner).
    #[serde(default)]
    pub no_runner: bool,
    /// The container's probes, for a provider whose own kubelet runs them (a remote cluster's
    /// Pod); the runner runs them from the Pod itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_probes: Option<RemoteProbes>,
}

/// A container's probes as the Pod gives them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteProbes {
    /// `readinessProbe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<k8s_openapi::api::core::v1::Probe>,
    /// `livenessProbe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<k8s_openapi::api::core::v1::Probe>,
    /// `startupProbe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<k8s_openapi::api::core::v1::Probe>,
}

/// Vast.ai hints. Defaults: verified hosts, reliability at least 0.95, 20 GiB disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VastHints {
    /// Only verified hosts.
    pub verified: bool,
    /// Only this machine.
    pub machine_id: Option<u64>,
    /// Container disk in GiB.
    pub disk_gib: u32,
    /// Only this offer (ask id).
    pub offer_id: Option<u64>,
    /// Minimum host reliability.
    pub min_reliability: f64,
}

impl Default for VastHints {
    fn default() -> Self {
        VastHints {
            verified: true,
            machine_id: None,
            disk_gib: VAST_DEFAULT_DISK_GIB,
            offer_id: None,
            min_reliability: VAST_DEFAULT_MIN_RELIABILITY,
        }
    }
}

/// RunPod's clouds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RunpodCloudType {
    /// Secure cloud (RunPod's datacenters).
    Secure,
    /// Community cloud (third-party hosts).
    Community,
    /// Either.
    All,
}

impl RunpodCloudType {
    /// Whether an offer in `offered` satisfies this choice.
    pub fn allows(self, offered: RunpodCloudType) -> bool {
        self == RunpodCloudType::All || self == offered
    }
}
