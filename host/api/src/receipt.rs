//! `CloudPodReceipt`: what one Pod's rentals cost, written when its binding goes (the Pod was
//! deleted and every instance is confirmed gone) and kept for the configured retention
//! (`spend.retentionDays`), so that `neocloud-node cost report` covers Pods that no longer
//! exist. A receipt is a record, never an intent: nothing is rented or released from one.

// kube-derive repeats keys such as `type_` across `printcolumn(...)` entries; clippy takes
// them for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label every receipt carries with its cluster identity: a node expires only its own.
pub const RECEIPT_CLUSTER_LABEL: &str = "cloud.aibrix.ai/cluster-id";

/// One finished Pod's bill.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cloud.aibrix.ai",
    version = "v1alpha1",
    kind = "CloudPodReceipt",
    namespaced,
    shortname = "cpr",
    category = "neocloud",
    printcolumn(name = "Pod", type_ = "string", json_path = ".spec.podName"),
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.provider"),
    printcolumn(name = "GPU", type_ = "string", json_path = ".spec.gpu"),
    printcolumn(name = "USD", type_ = "number", json_path = ".spec.costUsd"),
    printcolumn(name = "Ended", type_ = "date", json_path = ".spec.endedAt")
)]
#[serde(rename_all = "camelCase")]
pub struct CloudPodReceiptSpec {
    /// The Pod's name.
    pub pod_name: String,
    /// The Pod's UID (receipts of two Pods of the same name never collide).
    pub pod_uid: String,
    /// The cluster identity of the node that rented.
    pub cluster_id: String,
    /// The Pod's labels when it went (for `cost report --by label:KEY`); empty when the Pod was
    /// gone from the node's cache by then.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// The provider of the last instance, if one was rented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The GPUs of the last instance, as the binding recorded them (`1x A100-80GB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The last instance's id at its provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// When the binding was created (RFC 3339): where the Pod's spending could start.
    pub bound_at: String,
    /// When every instance was confirmed gone (RFC 3339).
    pub ended_at: String,
    /// What every instance of the Pod cost, USD.
    pub cost_usd: f64,
}

/// The receipt's name for a Pod: its name (cut to fit) and its UID.
pub fn receipt_name(pod_name: &str, pod_uid: &str) -> String {
    let room = 253usize.saturating_sub(pod_uid.len() + 1);
    let mut cut = pod_name.get(..room.min(pod_name.len())).unwrap_or(pod_name);
    cut = cut.trim_end_matches(['-', '.']);
    format!("{cut}-{pod_uid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_uid_and_stay_valid_subdomains() {
        let uid = "6b1f0c6e-2f7a-4a49-9c52-1c0f6f0e6a11";
        assert_eq!(receipt_name("train", uid), format!("train-{uid}"));
        let long = format!("{}.{}", "a".repeat(215), "b".repeat(30));
        let name = receipt_name(&long, uid);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(!name.contains(".-"), "{name}");
        assert!(name.ends_with(uid));
    }
}
