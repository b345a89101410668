//! A BurstPolicy's status as the node computes it (loaded, digest, errors, the `Loaded`
//! condition, observedGeneration) and writing it with server-side apply.
//!
//! The condition's `lastTransitionTime` is kept from the current status while its `status` does
//! not change, so writing the same outcome again is a no-op for the API server (no new event,
//! no write loop between node replicas).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::load::LoadedPolicy;
use neocloud_api::FIELD_MANAGER;
use neocloud_api::{BurstPolicy, BurstPolicyStatus, PolicyError};

/// The condition type.
pub const LOADED: &str = "Loaded";

/// The status for a load outcome of `bp`'s current generation.
pub(crate) fn status_for(
    bp: &BurstPolicy,
    outcome: Result<&LoadedPolicy, &[PolicyError]>,
) -> BurstPolicyStatus {
    let generation = bp.metadata.generation;
    let (loaded, digest, errors, reason, message) = match outcome {
        Ok(p) => (
            true,
            Some(p.digest.clone()),
            Vec::new(),
            "Loaded",
            format!("loaded {} with digest {}", p.describe(), p.digest),
        ),
        Err(errors) => (
            false,
            None,
            errors.to_vec(),
            "LoadFailed",
            errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    let status = if loaded { "True" } else { "False" };
    let previous = bp
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == LOADED));
    let since = match previous {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(Timestamp::now()),
    };
    BurstPolicyStatus {
        loaded,
        digest,
        errors,
        conditions: vec![Condition {
            type_: LOADED.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }],
        observed_generation: generation,
    }
}

/// Applies `status` as `bp`'s whole status, unless it already is.
pub(crate) async fn write(
    client: &kube::Client,
    bp: &BurstPolicy,
    status: &BurstPolicyStatus,
) -> Result<(), kube::Error> {
    if bp.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api: Api<BurstPolicy> = Api::all(client.clone());
    let body = json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": bp.name_any()},
        "status": status,
    });
    api.patch_status(
        &bp.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}
