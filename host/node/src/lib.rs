//! NeoCloud Node: a Kubernetes virtual node that turns GPU Pods into instances rented from GPU
//! clouds. This library holds what the `neocloud-node` binary wires together: the custom
//! resources, and (as they land) the node, reconcilers, sweeper, runner callback and kubelet API.
//!
//! It is not where decisions are made: placement, fallback and pricing live in the broker and the
//! policy engines, cloud APIs in the providers.

pub mod crd;
pub mod run;
pub mod sweeper;
pub mod vnode;

// The controllers and the BurstPolicy controller live in their own crates; these paths stay
// for callers.
pub use neocloud_burst_policy as policies;
pub use neocloud_controller::{egress, holds, naming, reconcile, runtime};
pub use neocloud_provisioning as provisioning;

// Metrics and traces live in their own crate; these paths stay for callers.
pub use neocloud_telemetry::{metrics, telemetry};

// The servers remote workloads talk to live in their own crate; these paths stay for callers.
pub use {
    neocloud_kubelet as kubelet,
    neocloud_remote::{callback, tls},
};
