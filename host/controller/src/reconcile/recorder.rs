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
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use neocloud_broker::{AttemptRecorder, Decision, NextStep, Wait, WaitDecider, record::seconds};
use neocloud_core::{Attempt, AttemptOutcome, FailureClass};
use neocloud_providers::retries::{Retry, summary};

use super::Reconciler;
use super::attempts::{BUDGET_EXCEEDED_CODE, rfc3339, to_record, upsert};
use super::pod_status::DesiredPod;
use neocloud_api::{BindingPhase, CloudPodBinding, CloudPodBindingStatus, RetriedRequests};
use neocloud_telemetry::metrics::RentalOutcome;

/// The name a decision of the built-in fallback is recorded under.
pub(super) const DEFAULT_POLICY: &str = "default";

/// Replaces the binding's whole status with `status` (a `PUT` of the status subresource),
/// guarded by `b`'s resourceVersion: a status computed from a binding that changed since it was
/// read (a stale cache, another writer) is refused with a 409 Conflict and the reconcile starts
/// again from the current binding, never decides twice. A status equal to `b`'s is not written.
///
/// A replace rather than a server-side apply: the node owns the whole status, and an apply of
/// a custom resource costs the API server several times a replace (its field sets are merged
/// and diffed), which bounded how many Pods a second the node could start.
pub(super) async fn write_status(
    client: &kube::Client,
    b: &CloudPodBinding,
    status: &CloudPodBindingStatus,
) -> Result<CloudPodBinding, kube::Error> {
    if b.status.as_ref() == Some(status) {
        return Ok(b.clone());
    }
    let api: Api<CloudPodBinding> =
        Api::namespaced(client.clone(), &b.namespace().unwrap_or_default());
    let mut next = b.clone();
    next.status = Some(status.clone());
    // The cache drops managedFields; an empty list in a replace keeps the server's as they are.
    api.replace_status(&b.name_any(), &PostParams::default(), &next)
        .await
}

/// Records attempts of one binding.
pub(super) struct BindingRecorder<'a> {
    pub r: &'a Reconciler,
    pub pod: &'a Pod,
    /// Who decides fallbacks: the BurstPolicy's name, or `default`.
    pub policy: String,
    /// For a machine rented ahead of its Pod (`pod` is then its PodTemplate's), the UID of the
    /// ProvisioningRequest it is held for: renting goes on while the request holds, and the
    /// events are the held binding's.
    pub held_for: Option<String>,
    latest: Mutex<Latest>,
}

/// The binding as last written, and a status not written yet (budget refusals: they call no
/// provider, so they are written with whatever is written next, not one request each).
struct Latest {
    written: CloudPodBinding,
    unwritten: Option<CloudPodBindingStatus>,
}

impl<'a> BindingRecorder<'a> {
    /// A recorder for `binding` whose status is `status` (the binding's, maybe just changed).
    pub fn new(
        r: &'a Reconciler,
        pod: &'a Pod,
        policy: String,
        binding: CloudPodBinding,
        status: CloudPodBindingStatus,
    ) -> Self {
        let unwritten = (binding.status.as_ref() != Some(&status)).then_some(status);
        BindingRecorder {
            r,
            pod,
            policy,
            held_for: None,
            latest: Mutex::new(Latest {
                written: binding,
                unwritten,
            }),
        }
    }

    fn latest<T>(&self, f: impl FnOnce(&mut Latest) -> T) -> T {
        match self.latest.lock() {
            Ok(mut l) => f(&mut l),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// The binding as last written (its status included).
    pub fn binding(&self) -> CloudPodBinding {
        self.latest(|l| l.written.clone())
    }

    /// The status to write next: as last written, with what is not written yet. Writing it
    /// against [`BindingRecorder::binding`] records everything this round decided.
    pub fn status(&self) -> CloudPodBindingStatus {
        self.latest(|l| {
            l.unwritten
                .clone()
                .or_else(|| l.written.status.clone())
                .unwrap_or_default()
        })
    }

    /// Writes `status` and keeps the binding the API server returned.
    async fn write(&self, status: &CloudPodBindingStatus) -> Result<(), kube::Error> {
        let written = write_status(&self.r.client, &self.binding(), status).await?;
        self.latest(|l| {
            l.written = written;
            l.unwritten = None;
        });
        Ok(())
    }

    /// Writes what is not written yet, if anything.
    pub async fn flush(&self) -> Result<(), kube::Error> {
        match self.latest(|l| l.unwritten.clone()) {
            Some(status) => self.write(&status).await,
            None => Ok(()),
        }
    }

    /// Keeps `status` to be written with the next write.
    fn keep(&self, status: CloudPodBindingStatus) {
        self.latest(|l| l.unwritten = Some(status));
    }

    /// The same recorder for a machine rented ahead for the request with UID `request`.
    pub fn held_for(mut self, request: &str) -> Self {
        self.held_for = Some(request.to_owned());
        self
    }

    /// An event about the Pod, or for a held machine about its binding.
    async fn say(&self, warning: bool, reason: &str, note: String) {
        if self.held_for.is_some() {
            self.r.event(&self.binding(), warning, reason, note).await;
        } else {
            self.r.event(self.pod, warning, reason, note).await;
        }
    }

    /// Whether the Pod is still the live Pod this binding serves (for a held machine: whether
    /// its request still holds).
    async fn pod_is_live(&self) -> Result<bool, String> {
        if let Some(request) = &self.held_for {
            let holds = self.r.cfg.holds.as_ref();
            return Ok(holds.is_some_and(|h| h.holds_uid(request)));
        }
        let uid = self.pod.uid().unwrap_or_default();
        self.r
            .pod_lives(
                &self.pod.namespace().unwrap_or_default(),
                &self.pod.name_any(),
                &uid,
            )
            .await
            .map_err(|e| format!("failed to read the pod before renting: {e}"))
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
            let gone = if self.held_for.is_some() {
                "the request is no longer held; no further rental is started"
            } else {
                "the pod is being deleted; no further rental is started"
            };
            return Err(gone.to_owned());
        }
        let mut status = self.status();
        upsert(&mut status, to_record(attempt, Utc::now()));
        let refused_by_budget = matches!(&attempt.outcome,
            AttemptOutcome::Failed { code: Some(code), .. } if code == BUDGET_EXCEEDED_CODE);
        // A budget refusal calls no provider: a Pod waiting OverBudget keeps saying so, and the
        // refusal is written with the next write (the next attempt, or the wait that ends the
        // round), not in a request of its own.
        if refused_by_budget || matches!(attempt.outcome, AttemptOutcome::Rented { .. }) {
            // A created instance is written with the binding's instance fields right after
            // (`provisioning`); the attempt in flight, written before the provider was called,
            // is what finds it again after a crash.
            self.keep(status);
        } else {
            status.phase = BindingPhase::Provisioning;
            status.reason = Some("Provisioning".to_owned());
            status.message = Some(format!(
                "attempt {} on {} offer {}",
                attempt.number, attempt.provider, attempt.offer_id
            ));
            self.write(&status)
                .await
                .map_err(|e| format!("failed to write attempt {}: {e}", attempt.number))?;
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
            self.say(true, "RentalFailed", note).await;
        }
        Ok(())
    }

    async fn retried(&self, attempt: &Attempt, retries: &[Retry]) {
        let mut status = self.status();
        let Some(record) = status
            .attempts
            .iter_mut()
            .find(|a| a.number == attempt.number)
        else {
            return;
        };
        record.retried = Some(retried_requests(retries));
        // Written with the attempt's outcome, which follows at once.
        self.keep(status);
        let note = format!(
            "attempt {} on {} offer {}: the provider's API was asked again {}",
            attempt.number,
            attempt.provider,
            attempt.offer_id,
            summary(retries)
        );
        tracing::info!(pod = %self.pod.name_any(), attempt = attempt.number, retries = retries.len(), "{note}");
        self.say(true, "ProviderRetried", note).await;
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
            // Pod's OverBudget event; the attempts keep the refusals (written with the next
            // write, like the refusal itself).
            self.keep(status);
            return Ok(());
        }
        tracing::info!(pod = %self.pod.name_any(), attempt = decision.attempt, action = decision.action_label(), decided_by = %by, "{note}");
        self.write(&status).await.map_err(|e| {
            format!(
                "failed to record the decision after attempt {}: {e}",
                decision.attempt
            )
        })?;
        self.say(false, "FallbackDecided", note).await;
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
                    *after,
                ),
                decided_by: wait_decider(decision, &by, *after),
            };
            self.waiting(&wait).await;
        }
        Ok(())
    }

    async fn waiting(&self, wait: &Wait) {
        let message = format!(
            "waiting {} (until {}) for {}; the wait was set by {}",
            seconds(wait.duration),
            rfc3339(wait.until),
            wait.reason,
            wait.decided_by
        );
        tracing::info!(pod = %self.pod.name_any(), "{message}");
        if self.held_for.is_none()
            && let Err(e) = (self.r)
                .set_pod(self.pod, &DesiredPod::pending("Waiting", message.clone()))
                .await
        {
            tracing::debug!(error = %e, "failed to say the pod is waiting");
        }
        self.say(false, "Waiting", message).await;
    }
}

/// The binding's record of `retries`.
fn retried_requests(retries: &[Retry]) -> RetriedRequests {
    RetriedRequests {
        count: retries.len() as u32,
        causes: retries.iter().map(Retry::cause).collect(),
        asked_seconds: retries
            .iter()
            .filter_map(|r| r.asked.map(|d| d.as_secs_f64()))
            .collect(),
        waited_seconds: retries.iter().map(|r| r.waited.as_secs_f64()).collect(),
    }
}

/// Who set the length of the wait `after` that follows `decision`, made by `by`: a policy the
/// user named owns its waits; the built-in fallback waits what the provider's `Retry-After`
/// asked when that is what it chose, and its own backoff otherwise.
fn wait_decider(decision: &Decision, by: &str, after: std::time::Duration) -> WaitDecider {
    if decision.by_policy && by != DEFAULT_POLICY {
        return WaitDecider::Policy(by.to_owned());
    }
    match decision.retry_after {
        Some(asked) if decision.class == FailureClass::RateLimited && asked == after => {
            WaitDecider::RetryAfter
        }
        _ => WaitDecider::NodeBackoff,
    }
}

/// What a decision's wait is for.
fn wait_reason(d: &Decision, by: &str, next: &str, after: std::time::Duration) -> String {
    match d.class {
        FailureClass::RateLimited => {
            let asked = match d.retry_after {
                Some(asked) if asked != after => {
                    format!(", whose Retry-After asked for {}", seconds(asked))
                }
                _ => String::new(),
            };
            format!(
                "the provider's rate limit to pass (attempt {} was answered 429{asked}) before trying {next}",
                d.attempt
            )
        }
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
            retry_after: None,
            next: NextStep::Stop {
                reason: String::new(),
            },
        };
        assert_eq!(
            wait_reason(
                &d,
                "default",
                "lambda offer gpu_1x_a10/us-east-1",
                Duration::from_secs(30)
            ),
            "the provider's rate limit to pass (attempt 3 was answered 429) before trying lambda offer gpu_1x_a10/us-east-1"
        );
    }

    fn decision(class: FailureClass, retry_after: Option<u64>, by_policy: bool) -> Decision {
        Decision {
            attempt: 1,
            class,
            action: FallbackAction::NextOffer,
            by_policy,
            retry_after: retry_after.map(Duration::from_secs),
            next: NextStep::Stop {
                reason: String::new(),
            },
        }
    }

    #[test]
    fn a_wait_names_who_set_its_length() {
        let secs = Duration::from_secs;
        let rate_limited = decision(FailureClass::RateLimited, Some(2), true);
        assert_eq!(
            wait_decider(&rate_limited, DEFAULT_POLICY, secs(2)),
            WaitDecider::RetryAfter
        );
        assert_eq!(
            wait_decider(&rate_limited, "my-fallback", secs(20)),
            WaitDecider::Policy("my-fallback".into())
        );
        let no_retry_after = decision(FailureClass::RateLimited, None, true);
        assert_eq!(
            wait_decider(&no_retry_after, DEFAULT_POLICY, secs(30)),
            WaitDecider::NodeBackoff
        );
        let transient = decision(FailureClass::Transient, None, true);
        assert_eq!(
            wait_decider(&transient, DEFAULT_POLICY, secs(1)),
            WaitDecider::NodeBackoff
        );
        assert_eq!(
            WaitDecider::LaunchSpacing.to_string(),
            "the provider's launch spacing"
        );
    }

    #[test]
    fn a_policy_wait_longer_than_the_retry_after_says_what_the_provider_asked() {
        let d = decision(FailureClass::RateLimited, Some(2), true);
        let reason = wait_reason(
            &d,
            "my-fallback",
            "runpod offer A40",
            Duration::from_secs(20),
        );
        assert!(
            reason.contains("answered 429, whose Retry-After asked for 2s"),
            "{reason}"
        );
    }

    #[test]
    fn retried_requests_keep_each_cause_and_wait_in_order() {
        let retry = |status, asked: Option<u64>, waited_ms| Retry {
            status: Some(status),
            error: None,
            asked: asked.map(Duration::from_secs),
            waited: Duration::from_millis(waited_ms),
        };
        let r = retried_requests(&[retry(429, Some(2), 2000), retry(503, None, 500)]);
        assert_eq!(r.count, 2);
        assert_eq!(r.causes, vec!["429", "503"]);
        assert_eq!(r.asked_seconds, vec![2.0]);
        assert_eq!(r.waited_seconds, vec![2.0, 0.5]);
    }
}
