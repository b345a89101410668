//! Writing a binding's status, and the broker's [`AttemptRecorder`] that writes every attempt
//! into it before the provider is called, refuses to start an attempt once the Pod is being
//! deleted, and publishes a Pod event for each failed attempt.

use std::sync::Mutex;

use async_trait::async_trait;
use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use neocloud_broker::AttemptRecorder;
use neocloud_core::{Attempt, AttemptOutcome};
use serde_json::json;

use super::Reconciler;
use super::attempts::to_record;
use crate::crd::{BindingPhase, CloudPodBinding, CloudPodBindingStatus};
use crate::metrics::RentalOutcome;
use crate::vnode::FIELD_MANAGER;

/// Applies `status` as the binding's whole status (server-side apply: fields left out are
/// removed).
pub(super) async fn write_status(
    client: &kube::Client,
    b: &CloudPodBinding,
    status: &CloudPodBindingStatus,
) -> Result<CloudPodBinding, kube::Error> {
    let api: Api<CloudPodBinding> =
        Api::namespaced(client.clone(), &b.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "CloudPodBinding",
        "metadata": {"name": b.name_any(), "namespace": b.namespace()},
        "status": status,
    });
    api.patch_status(
        &b.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
}

/// Records attempts of one binding.
pub(super) struct BindingRecorder<'a> {
    pub r: &'a Reconciler,
    pub pod: &'a Pod,
    pub binding: &'a CloudPodBinding,
    pub status: Mutex<CloudPodBindingStatus>,
}

impl BindingRecorder<'_> {
    /// The status as last written.
    pub fn status(&self) -> CloudPodBindingStatus {
        self.status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Whether the Pod is still the live Pod this binding serves.
    async fn pod_is_live(&self) -> Result<bool, String> {
        let pods: Api<Pod> = Api::namespaced(
            self.r.client.clone(),
            &self.pod.namespace().unwrap_or_default(),
        );
        let pod = pods
            .get_opt(&self.pod.name_any())
            .await
            .map_err(|e| format!("failed to read the pod before renting: {e}"))?;
        Ok(pod.is_some_and(|p| {
            p.metadata.deletion_timestamp.is_none() && p.metadata.uid == self.pod.metadata.uid
        }))
    }
}

#[async_trait]
impl AttemptRecorder for BindingRecorder<'_> {
    async fn record(&self, attempt: &Attempt) -> Result<(), String> {
        if attempt.outcome == AttemptOutcome::InFlight && !self.pod_is_live().await? {
            return Err("the pod is being deleted; no further rental is started".to_owned());
        }
        let mut status = self.status();
        let record = to_record(attempt, Utc::now());
        match status
            .attempts
            .iter_mut()
            .find(|a| a.number == record.number)
        {
            Some(existing) => *existing = record,
            None => status.attempts.push(record),
        }
        status.phase = BindingPhase::Provisioning;
        status.reason = Some("Provisioning".to_owned());
        status.message = Some(format!(
            "attempt {} on {} offer {}",
            attempt.number, attempt.provider, attempt.offer_id
        ));
        write_status(&self.r.client, self.binding, &status)
            .await
            .map_err(|e| format!("failed to write attempt {}: {e}", attempt.number))?;
        if let Ok(mut s) = self.status.lock() {
            *s = status;
        }
        if let AttemptOutcome::Failed {
            class,
            code,
            message,
        } = &attempt.outcome
        {
            self.r
                .metrics
                .record_rental(attempt.provider, RentalOutcome::Failed(*class));
            let code = code
                .as_deref()
                .map(|c| format!(" [{c}]"))
                .unwrap_or_default();
            let note = format!(
                "attempt {} on {} offer {} at ${:.4}/h failed ({}): {message}{code}",
                attempt.number, attempt.provider, attempt.offer_id, attempt.price_per_hour, class
            );
            self.r.event(self.pod, true, "RentalFailed", note).await;
        }
        Ok(())
    }
}
