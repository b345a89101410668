//! NeoCloud Node: a Kubernetes virtual node that turns GPU Pods into instances rented from GPU
//! clouds. This library holds what the `neocloud-node` binary wires together: the custom
//! resources, and (as they land) the node, reconcilers, sweeper, runner callback and kubelet API.
//!
//! It is not where decisions are made: placement, fallback and pricing live in the broker and the
//! policy engines, cloud APIs in the providers.

pub mod callback;
pub mod crd;
pub mod kubelet;
pub mod metrics;
pub mod naming;
pub mod policies;
pub mod policy_cli;
pub mod provider_cli;
pub mod reconcile;
pub mod run;
pub mod smoke;
pub mod sweeper;
pub mod tls;
pub mod vnode;
