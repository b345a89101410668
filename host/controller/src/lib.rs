//! The controllers of NeoCloud Node: Pods bound to the virtual node become rentals, and rentals
//! are mirrored back into Pods ([`reconcile`]: the Pod controller, the binding controller, the
//! runners' state, relays and receipts), with what they share: the external names every rental
//! carries ([`naming`]), where a runner's egress goes in the cluster ([`egress`]), and generic
//! add-ons to kube-runtime ([`runtime`]), installing the CRDs ([`crds`]), and the budget held for
//! ProvisioningRequests, which the Pod controller takes ([`holds`]).
//!
//! Not here: the BurstPolicy controller (`neocloud-burst-policy`), the Node object and its
//! heartbeat, configuration, leadership and the sweeper (`neocloud-node`, which wires these
//! together), the ProvisioningRequest controller (`neocloud-provisioning`), and the servers
//! runners and kubectl talk to (`neocloud-remote`). Decisions are
//! made in the broker and the policy engines, cloud APIs are the providers'.

pub mod crds;
pub mod egress;
pub mod holds;
pub mod naming;
pub mod reconcile;
pub mod runtime;
