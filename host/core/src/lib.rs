//! Domain types of NeoCloud Node: what a workload asks for, what a cloud offers, what happened
//! when we tried to rent it, and how failures are classified.
//!
//! This crate does no IO and links no heavy dependency (no kube client, no wasmtime, no HTTP):
//! every other crate speaks in these types, so they stay small, serialisable and pure.

pub mod attempt;
pub mod failure;
pub mod files;
pub mod gpu;
pub mod gpu_table;
pub mod instance;
pub mod offer;
pub mod pricing;
pub mod provider_id;
pub mod pull_secret;
pub mod translate;
pub mod workload;

pub use attempt::{Attempt, AttemptOutcome, FallbackAction};
pub use failure::FailureClass;
pub use gpu::GpuModel;
pub use instance::{Endpoint, InstancePhase, InstanceState, UNSCHEDULABLE};
pub use offer::{Offer, OfferCapacity, OfferQuery};
pub use pricing::PriceDecision;
pub use provider_id::ProviderId;
pub use pull_secret::RegistryCredential;
pub use translate::{PodRefused, Refusal, file_mounts, translate_pod};
pub use workload::{
    CapacityType, EnvFromKind, EnvFromRef, EnvValue, EnvVar, GpuRequest, KeyRef, PortProtocol,
    PortSpec, ProviderHints, RemoteProbes, Resources, RunpodCloudType, VastHints, WorkloadSpec,
};
