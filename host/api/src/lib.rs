//! The node's custom resources, group `cloud.aibrix.ai`, version `v1alpha1`, generated from Rust
//! types with schemars:
//!
//! - [`CloudPodBinding`] (namespaced, owned by its Pod, same name): the durable record of one
//!   Pod's rental: its external name, constraints, policy and every attempt.
//! - [`CloudPodReceipt`] (namespaced, named after the Pod and its UID): what a deleted Pod's
//!   rentals cost, kept for the configured retention for `cost report`.
//! - [`BurstPolicy`] (cluster-scoped): a placement, fallback and pricing policy as a Wasm
//!   component or CEL rules, with its load status.
//!
//! This crate only defines the types and their CRDs (no IO): the controller (`neocloud-node`,
//! which re-exports it as `neocloud_node::crd` and installs the CRDs), its CLIs and the tests
//! share it; the reconcilers own the objects' lifecycle.

mod binding;
mod policy;
mod receipt;

pub use binding::{
    AttemptOutcome, AttemptRecord, AttemptTally, BindingPhase, CloudPodBinding,
    CloudPodBindingSpec, CloudPodBindingStatus, PolicyRef, RetriedRequests, WorkloadSummary,
    gpu_model,
};
pub use policy::{
    BurstPolicy, BurstPolicySpec, BurstPolicyStatus, CelRules, ConfigMapKeyRef, EgressRules,
    FailurePolicy, PolicyError, PolicyMode, SecretRef, SignatureRequirement, WasmSource,
};
pub use receipt::{CloudPodReceipt, CloudPodReceiptSpec, RECEIPT_CLUSTER_LABEL, receipt_name};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every NeoCloud Node resource.
pub const GROUP: &str = "cloud.aibrix.ai";

/// The field manager of everything the node writes with server-side apply (its Node, Pods'
/// status, bindings, receipts, BurstPolicy status), so that its fields are told from others'.
pub const FIELD_MANAGER: &str = "neocloud-node";

/// Every CRD the node needs, in the order they should be applied.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        CloudPodBinding::crd(),
        CloudPodReceipt::crd(),
        BurstPolicy::crd(),
    ]
}

/// Every CRD as one multi-document YAML stream, as `make manifests` writes it.
pub fn to_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
