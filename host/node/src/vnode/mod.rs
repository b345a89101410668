//! The virtual node as the cluster sees it: the `Node` object (labels, taint, capacity,
//! addresses, kubelet endpoint), its `Ready` condition, and its Lease in `kube-node-lease`.
//!
//! Readiness follows provider health: while no enabled provider is healthy the node reports
//! `Ready=False` and stops renewing its Lease, so the controller manager taints it and the
//! scheduler sends no new Pods. This module does not place Pods; the reconciler does.

mod config;
mod heartbeat;
mod object;

pub use config::{NodeConfig, TaintConfig};
pub use heartbeat::{Health, Heartbeat};
pub use object::{FIELD_MANAGER, RESTRICTED_LABELS, node_object, node_status};
