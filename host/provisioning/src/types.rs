//! The ProvisioningRequest kind (`autoscaling.x-k8s.io/v1`), as far as the node reads and writes
//! it: the pod sets and parameters of its spec, and the conditions and class details of its
//! status. Field names follow `cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1`.
//!
//! Not a CRD the node installs: Kueue and cluster-autoscaler ship it (the schema is theirs, so
//! none is generated here).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The request: capacity for `count` Pods of each template, of one provisioning class.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "autoscaling.x-k8s.io",
    version = "v1",
    kind = "ProvisioningRequest",
    plural = "provisioningrequests",
    namespaced,
    status = "ProvisioningRequestStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestSpec {
    /// The Pods to provision for: a PodTemplate of the request's namespace and how many.
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
    /// Who provisions it; the node serves [`super::CLASS`].
    #[serde(default)]
    pub provisioning_class_name: String,
    /// Class parameters (at most 100, each value up to 255 characters).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// `count` Pods like the template `pod_template_ref`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// The PodTemplate, in the request's namespace.
    pub pod_template_ref: Reference,
    /// How many Pods.
    #[serde(default)]
    pub count: i32,
}

/// A reference by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Reference {
    /// The object's name.
    #[serde(default)]
    pub name: String,
}

/// What the provisioner says.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestStatus {
    /// `Accepted`, `Provisioned`, `Failed`, `BookingExpired`, `CapacityRevoked`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Details of the class, read by Kueue's `podSetUpdates.nodeSelector`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub provisioning_class_details: BTreeMap<String, String>,
}

impl ProvisioningRequest {
    /// Whether condition `type_` is `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == "True")
        })
    }
}
