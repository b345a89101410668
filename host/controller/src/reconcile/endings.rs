//! How a Pod's run ends: an exit the runner or provider reported (restart in place, re-rent
//! after the back-off, or finish), a replacement of a lost or stopped instance within
//! `maxReplacements`, a refusal, and retiring the binding. Not the mirroring of a live instance
//! (`mirror`).

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use neocloud_core::{FailureClass, InstanceState};

use super::attempts::{class_reason, count_failed, rfc3339};
use super::mirror::{describe, last_state, provider_said};
use super::pod_status::{Container, DesiredPod};
use super::recorder::write_status;
use super::release::{Ending, Release, binding_key};
use super::rerent::{RERENT_BACKOFF, rerent_backoff};
use super::{Error, Reconciler};
use neocloud_api::{AttemptOutcome, BindingPhase, CloudPodBinding, CloudPodBindingStatus};

/// How many times a Pod's instance is replaced after it stopped, failed or was lost by the
/// provider, before the Pod fails, unless its BurstPolicy's `maxReplacements` says otherwise.
pub const MAX_REPLACEMENTS: usize = 5;

impl Reconciler {
    /// How many times the Pod may be rented again on a new machine: its BurstPolicy's
    /// `maxReplacements` when the policy is loaded and sets one, else [`MAX_REPLACEMENTS`].
    pub(super) fn max_replacements(&self, pod: &Pod) -> usize {
        let policy = self.workload(pod).ok().and_then(|(w, _)| w.policy);
        policy
            .and_then(|name| self.policies.as_ref()?.max_replacements(&name))
            .map_or(MAX_REPLACEMENTS, |n| n as usize)
    }

    /// The container ended with `code`. When its runner restarts in place (`in_place`) it
    /// applied the Pod's restartPolicy itself and this end is final; otherwise (a Pod the
    /// runner does not run, or an older runner) the node applies it: the Pod runs again on a
    /// new instance after a back-off. Else the binding ends (Succeeded on 0, Failed
    /// otherwise), the instance is released and the Pod ends with the code.
    pub(super) async fn exited(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        mut status: CloudPodBindingStatus,
        i: &InstanceState,
        code: i32,
        in_place: bool,
    ) -> Result<Action, Error> {
        let message = format!("the container on {} exited with code {code}", describe(i));
        let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
        let again = !in_place
            && match policy {
                Some("Never") => false,
                Some("OnFailure") => code != 0,
                _ => true,
            };
        let replaced = replacements(&status);
        if again && replaced < self.max_replacements(pod) {
            return self.rerent(pod, b, status, message).await;
        }
        let (phase, reason) = if code == 0 {
            (BindingPhase::Succeeded, "Completed")
        } else {
            (BindingPhase::Failed, "Error")
        };
        let current = if status.exit_code == Some(code) {
            b.clone()
        } else {
            status.exit_code = Some(code);
            write_status(&self.client, b, &status).await?
        };
        let ending = Ending {
            phase,
            reason: reason.to_owned(),
            message: message.clone(),
        };
        if let Release::Waiting(_) = self.release(&current, &ending).await? {
            return Ok(Action::requeue(self.cfg.release_poll));
        }
        let restarted = self.in_place(pod);
        let want = DesiredPod {
            phase: if code == 0 { "Succeeded" } else { "Failed" },
            reason: Some(reason.to_owned()),
            message: Some(message.clone()),
            container: Container::Terminated {
                reason: reason.to_owned(),
                exit_code: code,
            },
            last_state: restarted.last.as_ref().map(last_state),
            ..DesiredPod::running().on(i, replaced.saturating_add(restarted.restart_count as usize))
        };
        if self.set_pod(pod, &want).await? {
            self.event(pod, code != 0, reason, message).await;
        }
        Ok(Action::await_change())
    }

    /// The container ended on an instance whose runner cannot restart it in place, and the
    /// Pod's restartPolicy asks for it to run again: the instance is released now and another
    /// one rented after kubelet's back-off (10 s doubling to 5 min, by the replacements so far;
    /// see [`rerent_wait`](super::rerent::rerent_wait)), and the event names what the Pod has cost so far.
    pub(super) async fn rerent(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        status: CloudPodBindingStatus,
        message: String,
    ) -> Result<Action, Error> {
        let delay = rerent_backoff(replacements(&status));
        let spent = self
            .renter
            .ledger
            .accrued_usd(&binding_key(b), Utc::now())
            .unwrap_or(0.0);
        let note = format!(
            "{message}; renting another instance in {}s (restartPolicy is not Never; ${spent:.4} \
             spent on this pod so far)",
            delay.as_secs()
        );
        let class = FailureClass::Lost;
        let Some(_) = self
            .retire(b, status, class, &message, RERENT_BACKOFF, &note)
            .await?
        else {
            return Ok(Action::requeue(self.cfg.release_poll));
        };
        self.event(pod, true, RERENT_BACKOFF, note.clone()).await;
        self.set_pod(pod, &DesiredPod::pending(RERENT_BACKOFF, note))
            .await?;
        Ok(Action::requeue(delay))
    }

    /// The instance ended by itself and the Pod's restartPolicy asks for it to run again: the
    /// old instance is deleted and confirmed gone, the attempt that rented it records how it
    /// ended (so the fallback policy and CEL `attempts` see it), and the Pod is placed again.
    pub(super) async fn replace(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        status: CloudPodBindingStatus,
        class: FailureClass,
        message: String,
    ) -> Result<Action, Error> {
        let note = format!("{message}; renting a replacement (restartPolicy is not Never)");
        let Some(status) = self
            .retire(b, status, class, &message, "Replacing", &note)
            .await?
        else {
            return Ok(Action::requeue(self.cfg.release_poll));
        };
        self.event(pod, true, "Replacing", note.clone()).await;
        let mut want = DesiredPod::pending("Replacing", note);
        if class == FailureClass::Preempted {
            let times = count_failed(&status, &["preempted"]);
            want = want.preempted(format!("reclaimed {times} time(s); the last: {message}"));
        }
        self.set_pod(pod, &want).await?;
        Ok(Action::requeue(Duration::from_millis(100)))
    }

    /// The provider refused the instance for capacity after creating it (a remote cluster's
    /// scheduler found no node for its Pod once the rental had returned): nothing ran, so the
    /// rental failed as a refusal at creation does. The instance is deleted and confirmed gone,
    /// its attempt records the capacity failure, and the ladder is walked again (a remote
    /// cluster still refusing is then passed over within the creation's wait).
    pub(super) async fn refused(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        status: CloudPodBindingStatus,
        i: &InstanceState,
    ) -> Result<Action, Error> {
        let message = format!("{} was refused: {}", describe(i), provider_said(i));
        let reason = class_reason(FailureClass::Capacity);
        let note = format!("{message}; trying the next offer");
        let class = FailureClass::Capacity;
        if self
            .retire(b, status, class, &message, &reason, &note)
            .await?
            .is_none()
        {
            return Ok(Action::requeue(self.cfg.release_poll));
        }
        self.event(pod, true, &reason, note.clone()).await;
        self.set_pod(pod, &DesiredPod::pending(&reason, note))
            .await?;
        Ok(Action::requeue(Duration::from_millis(100)))
    }

    /// Deletes the binding's instance, stops its cost, and records its attempt as failed with
    /// `class` and `message`: the binding is Pending with nothing rented (`reason`, `note`),
    /// ready to be placed again. `None` while the instance is still being deleted.
    pub(super) async fn retire(
        &self,
        b: &CloudPodBinding,
        mut status: CloudPodBindingStatus,
        class: FailureClass,
        message: &str,
        reason: &str,
        note: &str,
    ) -> Result<Option<CloudPodBindingStatus>, Error> {
        if !self.delete_instances(b).await?.is_empty() {
            return Ok(None);
        }
        let key = binding_key(b);
        self.renter.budget.release(&key);
        self.renter.ledger.stop(&key, Utc::now());
        if let Some(a) = status
            .attempts
            .iter_mut()
            .rev()
            .find(|a| a.outcome == AttemptOutcome::Created)
        {
            a.outcome = AttemptOutcome::Failed;
            a.failure_class = Some(class.label().to_owned());
            a.message = Some(message.to_owned());
            a.finished_at = Some(rfc3339(Utc::now()));
        }
        status.provider = None;
        status.instance_id = None;
        status.offer_id = None;
        status.gpu = None;
        status.price_per_hour = None;
        status.phase = BindingPhase::Pending;
        status.reason = Some(reason.to_owned());
        status.message = Some(note.to_owned());
        write_status(&self.client, b, &status).await?;
        Ok(Some(status))
    }
}

/// How many instances of the binding were replaced after they stopped or were lost (listed
/// attempts and tallied ones).
pub(super) fn replacements(status: &CloudPodBindingStatus) -> usize {
    count_failed(status, &["preempted", "lost"])
}
