//! NeoCloud Node: a Kubernetes virtual node that turns GPU Pods into instances rented from GPU
//! clouds. This library holds what the `neocloud-node` binary wires together: the custom
//! resources, and (as they land) the node, reconcilers, sweeper, runner callback and kubelet API.
//!
//! It is not where decisions are made: placement, fallback and pricing live in the broker and the
//! policy engines, cloud APIs in the providers.

pub mod crd;
pub mod egress;
pub mod metrics;
pub mod naming;
pub mod policies;
pub mod reconcile;
pub mod run;
pub mod runtime;
pub mod sweeper;
pub mod telemetry;
pub mod vnode;

// The servers remote workloads talk to live in their own crate; these paths stay for callers.
pub use {
    neocloud_kubelet as kubelet,
    neocloud_remote::{callback, tls},
};
