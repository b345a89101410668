//! What remote workloads and their users talk to: the runner callback server that rented VMs
//! call (tokens, workload, state, heartbeats, logs) with the cloud-init `user_data` that starts
//! the runner, and the kubelet API that `kubectl logs` reaches through the API server, both over
//! the node's TLS ([`tls`]).
//!
//! Not the reconciler, the providers or the policies: the node (`neocloud-node`) decides what to
//! rent and feeds these servers; they only serve what a binding's runner reports.

pub mod callback;
pub mod kubelet;
pub mod relay;
pub mod serving;
pub mod tls;
