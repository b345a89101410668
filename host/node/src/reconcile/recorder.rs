//! Writing a binding's status, and the broker's [`AttemptRecorder`] that writes every attempt
//! into it before the provider is called, refuses to start an attempt once the Pod is being
//! deleted, and publishes a Pod event for each failed attempt, each fallback decision
//! (`FallbackDecided`, recorded on the attempt it answers with the deciding policy's name) and
//! each wait (`Waiting`, with what it waits for and until when).
//!
//! The recorder keeps the binding as last written, so whatever the reconciler writes after
//! renting starts from it and never drops an attempt.

use std::sync::Mutex;

use async_trait::async_trait;
use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use neocloud_broker::{AttemptRecorder, Decision, NextStep, Wait, record::seconds};
use neocloud_core::{Attempt, AttemptOutcome, FailureClass};
use serde_json::json;

use super::Reconciler;
use super::attempts::{BUDGET_EXCEEDED_CODE, rfc3339, to_record, upsert};
use super::pod_status::DesiredPod;
use crate::crd::{BindingPhase, CloudPodBinding, CloudPodBindingStatus};
use crate::metrics::RentalOutcome;
use crate::vnode::FIELD_MANAGER;

/// Applies `status` as the binding's whole status (server-side apply: fields left out are
/// removed), so callers pass a status that starts from the latest binding.
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
    /// Who decides fallbacks: the BurstPolicy's name, or `default`.
    pub policy: String,
    latest: Mutex<CloudPodBinding>,
}

impl<'a> BindingRecorder<'a> {
    /// A recorder for `binding` whose status is `status` (the binding's, maybe just changed).
    pub fn new(
        r: &'a Reconciler,
        pod: &'a Pod,
        policy: String,
        mut binding: CloudPodBinding,
        status: CloudPodBindingStatus,
    ) -> Self {
        binding.status = Some(status);
        BindingRecorder {
            r,
            pod,
            policy,
            latest: Mutex::new(binding),
        }
    }

    /// The binding as last written (its status included).
    pub fn binding(&self) -> CloudPodBinding {
        self.latest
            .lock()
            .map(|b| b.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// The status as last written.
    pub fn status(&self) -> CloudPodBindingStatus {
        self.binding().status.unwrap_or_default()
    }

    /// Writes `status` and keeps the binding the API server returned.
    async fn write(&self, status: &CloudPodBindingStatus) -> Result<(), kube::Error> {
        let written = write_status(&self.r.client, &self.binding(), status).await?;
        if let Ok(mut latest) = self.latest.lock() {
            *latest = written;
        }
        Ok(())
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

    /// Who made `decision`.
    fn decider(&self, decision: &Decision) -> String {
        if decision.by_policy {
            self.policy.clone()
        } else {
            "node".to_owned()
        }
    }
}

#[async_trait]
impl AttemptRecorder for BindingRecorder<'_> {
    async fn record(&self, attempt: &Attempt) -> Result<(), String> {
        if attempt.outcome == AttemptOutcome::InFlight && !self.pod_is_live().await? {
            return Err("the pod is being deleted; no further rental is started".to_owned());
        }
        let mut status = self.status();
        upsert(&mut status, to_record(attempt, Utc::now()));
        let refused_by_budget = matches!(&attempt.outcome,
            AttemptOutcome::Failed { code: Some(code), .. } if code == BUDGET_EXCEEDED_CODE);
        // A budget refusal calls no provider: a Pod waiting OverBudget keeps saying so.
        if !refused_by_budget {
            status.phase = BindingPhase::Provisioning;
            status.reason = Some("Provisioning".to_owned());
            status.message = Some(format!(
                "attempt {} on {} offer {}",
                attempt.number, attempt.provider, attempt.offer_id
            ));
        }
        self.write(&status)
            .await
            .map_err(|e| format!("failed to write attempt {}: {e}", attempt.number))?;
        if let AttemptOutcome::Failed {
            class,
            code,
            message,
        } = &attempt.outcome
        {
            self.r
                .metrics
                .record_rental(attempt.provider, RentalOutcome::Failed(*class));
            if code.as_deref() == Some(BUDGET_EXCEEDED_CODE) {
                // Not a provider's answer: the Pod's single OverBudget event says it, instead of
                // one event per candidate per retry while it waits.
                return Ok(());
            }
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

    async fn decided(&self, decision: &Decision) -> Result<(), String> {
        let by = self.decider(decision);
        let sentence = decision.describe();
        let mut status = self.status();
        if let Some(a) = status
            .attempts
            .iter_mut()
            .find(|a| a.number == decision.attempt)
        {
            a.action = Some(decision.action_label().to_owned());
            a.decided_by = Some(by.clone());
            a.decision = Some(sentence.clone());
        }
        let who = if decision.by_policy {
            format!("policy {by} chose to")
        } else if decision.class == FailureClass::OfferTaken {
            "the offer was taken by another renter, so the node chose to".to_owned()
        } else {
            "the node chose to".to_owned()
        };
        let note = format!(
            "after attempt {} failed ({}), {who} {sentence}",
            decision.attempt, decision.class
        );
        let over_budget = status.attempts.iter().any(|a| {
            a.number == decision.attempt
                && a.message
                    .as_deref()
                    .is_some_and(|m| m.ends_with(&format!("[{BUDGET_EXCEEDED_CODE}]")))
        });
        if over_budget {
            // Moving past candidates the budget refuses is the guard's doing, said once by the
            // Pod's OverBudget event; the attempts keep the refusals.
            return Ok(());
        }
        tracing::info!(pod = %self.pod.name_any(), attempt = decision.attempt, action = decision.action_label(), decided_by = %by, "{note}");
        self.write(&status).await.map_err(|e| {
            format!(
                "failed to record the decision after attempt {}: {e}",
                decision.attempt
            )
        })?;
        self.r.event(self.pod, false, "FallbackDecided", note).await;
        if let NextStep::Try { offer, after, .. } = &decision.next
            && *after >= std::time::Duration::from_secs(1)
        {
            let until = Utc::now() + chrono::Duration::from_std(*after).unwrap_or_default();
            let wait = Wait {
                duration: *after,
                until,
                reason: wait_reason(
                    decision,
                    &by,
                    &format!("{} offer {}", offer.provider, offer.id),
                ),
            };
            self.waiting(&wait).await;
        }
        Ok(())
    }

    async fn waiting(&self, wait: &Wait) {
        let message = format!(
            "waiting {} (until {}) for {}",
            seconds(wait.duration),
            rfc3339(wait.until),
            wait.reason
        );
        tracing::info!(pod = %self.pod.name_any(), "{message}");
        if let Err(e) = self
            .r
            .set_pod(self.pod, &DesiredPod::pending("Waiting", message.clone()))
            .await
        {
            tracing::debug!(error = %e, "failed to say the pod is waiting");
        }
        self.r.event(self.pod, false, "Waiting", message).await;
    }
}

/// What a decision's wait is for.
fn wait_reason(d: &Decision, by: &str, next: &str) -> String {
    match d.class {
        FailureClass::RateLimited => format!(
            "the provider's rate limit to pass (attempt {} was answered 429) before trying {next}",
            d.attempt
        ),
        FailureClass::Transient | FailureClass::Timeout => {
            format!(
                "a backoff after a {} failure before trying {next} again",
                d.class
            )
        }
        _ => format!("the wait policy {by} asked for before trying {next}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neocloud_core::FallbackAction;
    use std::time::Duration;

    #[test]
    fn a_rate_limit_wait_names_the_refused_attempt_and_the_next_offer() {
        let d = Decision {
            attempt: 3,
            class: FailureClass::RateLimited,
            action: FallbackAction::Wait {
                duration: Duration::from_secs(30),
            },
            by_policy: true,
            next: NextStep::Stop {
                reason: String::new(),
            },
        };
        assert_eq!(
            wait_reason(&d, "default", "lambda offer gpu_1x_a10/us-east-1"),
            "the provider's rate limit to pass (attempt 3 was answered 429) before trying lambda offer gpu_1x_a10/us-east-1"
        );
    }
}
