//! What the node writes on a ProvisioningRequest: its conditions (only the types it sets,
//! each keeping its transition time while its status stays) and its class details, as one
//! merge patch of the `/status` subresource guarded by the resourceVersion it was decided on.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::types::ProvisioningRequest;

/// One condition to set.
#[derive(Debug, Clone, PartialEq)]
pub struct Set {
    /// `Accepted`, `Provisioned`, `Failed`, `BookingExpired`.
    pub type_: &'static str,
    /// `True` or `False`.
    pub status: bool,
    /// CamelCase.
    pub reason: String,
    /// For people (and Kueue, which shows it on the Workload).
    pub message: String,
}

/// The request's conditions with `sets` applied at `now`: others' conditions are kept, and a
/// condition whose status does not change keeps its transition time.
pub fn conditions(req: &ProvisioningRequest, sets: &[Set], now: Timestamp) -> Vec<Condition> {
    let mut out: Vec<Condition> = req
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    for set in sets {
        let status = if set.status { "True" } else { "False" };
        let since = out
            .iter()
            .find(|c| c.type_ == set.type_ && c.status == status)
            .map_or(Time(now), |c| c.last_transition_time.clone());
        out.retain(|c| c.type_ != set.type_);
        out.push(Condition {
            type_: set.type_.to_owned(),
            status: status.to_owned(),
            reason: set.reason.clone(),
            message: set.message.clone(),
            last_transition_time: since,
            observed_generation: req.metadata.generation,
        });
    }
    out
}

/// Writes `sets` (and `details`, when any) on the request, refused with a conflict if it
/// changed since it was read.
pub async fn write(
    api: &Api<ProvisioningRequest>,
    req: &ProvisioningRequest,
    sets: &[Set],
    details: &BTreeMap<String, String>,
) -> kube::Result<()> {
    let mut status = json!({"conditions": conditions(req, sets, Timestamp::now())});
    if !details.is_empty() {
        status["provisioningClassDetails"] = json!(details);
    }
    let patch = json!({
        "metadata": {"resourceVersion": req.resource_version()},
        "status": status,
    });
    api.patch_status(
        &req.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ProvisioningRequestStatus;

    fn set(type_: &'static str, status: bool, reason: &str) -> Set {
        Set {
            type_,
            status,
            reason: reason.into(),
            message: format!("{type_} {reason}"),
        }
    }

    #[test]
    fn conditions_keep_others_and_unchanged_transition_times() {
        let then = Timestamp::from_second(1_000).unwrap();
        let mut req = ProvisioningRequest::new("r", Default::default());
        req.status = Some(ProvisioningRequestStatus {
            conditions: conditions(
                &req,
                &[
                    set("Accepted", true, "Accepted"),
                    set("Other", true, "Theirs"),
                ],
                then,
            ),
            ..Default::default()
        });
        let now = Timestamp::from_second(2_000).unwrap();
        let out = conditions(
            &req,
            &[
                set("Accepted", true, "Accepted"),
                set("Failed", true, "OverBudget"),
            ],
            now,
        );
        let by = |t: &str| out.iter().find(|c| c.type_ == t).unwrap();
        assert_eq!(by("Accepted").last_transition_time, Time(then));
        assert_eq!(by("Other").reason, "Theirs");
        assert_eq!(by("Failed").last_transition_time, Time(now));
        assert_eq!(by("Failed").status, "True");
        assert_eq!(out.len(), 3);
    }
}
