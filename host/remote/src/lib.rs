//! What the runners on rented machines talk to, on every cloud: the runner callback server
//! ([`callback`]: tokens, workload, status, heartbeats, usage, logs, the `kubectl exec` and
//! `port-forward` sessions the runner dials back for, egress) with the cloud-init `user_data`
//! and container start command that start the runner, over the node's TLS ([`tls`]) within a
//! listener's bounds ([`serving`]), which the kubelet API shares.
//!
//! Not the kubelet API or the relays (the `neocloud-kubelet` crate, which reads the logs and
//! opens the sessions this crate holds), and not the reconciler, the providers or the policies:
//! the node (`neocloud-node`) decides what to rent and feeds these servers; they only serve what
//! a binding's runner reports.

pub mod callback;
pub mod serving;
pub mod tls;
