//! The ProvisioningRequest class the node serves, [`CLASS`] (issue 33: "admit only what can be
//! rented"). Kueue's ProvisioningRequest admission check creates a request per Workload; the
//! node plans all its Pods at once, in one provider and region, under the Pods' price limits and
//! policies, and holds their budget ([`Holds`]). Where its runner runs the Pods, it then rents a
//! machine for each, all or none, and waits for their runners (`ahead`), before it says
//! `Provisioned`. Kueue then admits the Workload, and each of its Pods (which carry
//! [`CONSUME_ANNOTATION`]) takes a held machine, or, with budget only, one held reservation
//! just before it rents as usual.
//!
//! Not here: the ProvisioningRequest CRD (Kueue and cluster-autoscaler ship it), the Pod
//! controller, the held machines' bindings and the hold table it takes from
//! (`neocloud-controller`).

mod ahead;
mod controller;
mod decide;
pub mod params;
mod restore;
mod status;
#[cfg(test)]
mod tests;
pub mod types;

pub use controller::{Provisioner, ProvisioningConfig};
pub use decide::Outcome;
pub use neocloud_controller::holds::{CONSUME_ANNOTATION, HeldPlace, Holds, prefer, regions};
pub use types::{PodSet, ProvisioningRequest, ProvisioningRequestSpec, ProvisioningRequestStatus};

use kube::ResourceExt;

/// The `provisioningClassName` the node serves.
pub const CLASS: &str = "rent.cloud.aibrix.ai";

/// The annotation naming the consumed request's class.
pub const CLASS_ANNOTATION: &str = "autoscaling.x-k8s.io/provisioning-class-name";

/// The key a request's hold is kept under: `namespace/name`.
pub fn key(req: &ProvisioningRequest) -> String {
    format!("{}/{}", req.namespace().unwrap_or_default(), req.name_any())
}
