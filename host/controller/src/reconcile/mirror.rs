//! Mirroring a rented instance onto its Pod: the instance's state as the Pod's phase,
//! conditions and container status (with the runner's account of runs and probes, and the
//! kubelet's CrashLoopBackOff wording), repricing, and the back-off that keeps a failing provider
//! from being asked again at once. Not how a run's end is handled (`endings`).

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use neocloud_core::{FailureClass, InstancePhase, InstanceState, ProviderId};

use super::attempts::rfc3339;
use super::endings::replacements;
use super::pod_status::{Container, DesiredPod, LastState, Probed};
use super::recorder::write_status;
use super::release::binding_key;
use super::runners::{InPlace, RunnerStatus};
use super::{Error, Reconciler, Said};
use neocloud_api::{BindingPhase, CloudPodBinding, CloudPodBindingStatus};
use neocloud_remote::callback::Termination;

impl Reconciler {
    /// Mirrors the rented instance into the binding and the Pod.
    pub(super) async fn mirror(
        &self,
        pod: &Pod,
        b: CloudPodBinding,
        status: CloudPodBindingStatus,
    ) -> Result<Action, Error> {
        let (provider_id, instance_id) = match (&status.provider, &status.instance_id) {
            (Some(p), Some(i)) => (p.parse::<ProviderId>().ok(), i.clone()),
            _ => (None, String::new()),
        };
        let provider = provider_id
            .and_then(|p| self.renter.catalog.provider(p))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "binding {}: status.provider {:?} is not enabled on this node",
                    binding_key(&b),
                    status.provider
                ))
            })?;
        if let Some((left, why)) = self.backing_off(provider_id) {
            tracing::debug!(pod = %pod.name_any(), %why, "not polling the instance while its provider backs off");
            return Ok(Action::requeue(left));
        }
        let instance = provider.get(&instance_id).await?;
        self.mirror_instance(pod, b, status, instance, None).await
    }

    /// Mirrors `instance`, the binding's instance as its provider just reported it (`None`:
    /// the provider no longer knows it), into the binding and the Pod. `said` is an event about
    /// the instance still to publish (a rental or an adoption just made): a running instance's
    /// goes out beside the binding's write, before the Pod's; any other's at once.
    pub(super) async fn mirror_instance(
        &self,
        pod: &Pod,
        b: CloudPodBinding,
        mut status: CloudPodBindingStatus,
        instance: Option<InstanceState>,
        said: Option<Said>,
    ) -> Result<Action, Error> {
        let provider_id = status
            .provider
            .as_deref()
            .and_then(|p| p.parse::<ProviderId>().ok());
        let instance_id = status.instance_id.clone().unwrap_or_default();
        let runner = self
            .runner_status(pod, provider_id, status.runner_rental)
            .await;
        let said = match (&instance, runner) {
            (Some(i), None) if i.phase == InstancePhase::Running => said,
            _ => {
                if let Some((reason, note)) = said {
                    self.event(pod, false, reason, note).await;
                }
                None
            }
        };
        let (reason, message) = match &instance {
            // Checked first: once the lost instance is being deleted it reads as gone.
            _ if runner == Some(RunnerStatus::NeverCalled) => (
                "RunnerLost",
                format!(
                    "the runner on {} instance {instance_id} never called back within {}s; the \
                     instance is terminated",
                    status.provider.as_deref().unwrap_or_default(),
                    self.cfg
                        .runners
                        .as_ref()
                        .map_or(0, |r| r.boot_timeout().as_secs())
                ),
            ),
            _ if runner == Some(RunnerStatus::Lost) => (
                "RunnerLost",
                format!(
                    "the runner on {} instance {instance_id} stopped sending heartbeats; the \
                     instance is terminated",
                    status.provider.as_deref().unwrap_or_default()
                ),
            ),
            // The runner's exit code decides, whatever the instance now says: a container whose
            // runner ran the workload stops when it ends.
            // A runner that restarts in place applied the restart policy: this end is final.
            Some(i) if let Some(RunnerStatus::Finished(code)) = runner => {
                return self.exited(pod, &b, status, i, code, true).await;
            }
            Some(i) if let Some(RunnerStatus::Exited(code)) = runner => {
                return self.exited(pod, &b, status, i, code, false).await;
            }
            // A provider that ran the workload itself (a remote cluster's Pod) reports how it
            // ended, which decides as a runner's report would.
            Some(i) if let Some(code) = i.exit_code => {
                return self.exited(pod, &b, status, i, code, false).await;
            }
            Some(i) if i.phase == InstancePhase::Running => {
                if let Some(RunnerStatus::Booting | RunnerStatus::Starting) = runner {
                    let message = format!(
                        "{} is up; waiting for its runner to start the container",
                        describe(i)
                    );
                    self.set_pod(pod, &DesiredPod::pending("ContainerCreating", message))
                        .await?;
                    return Ok(Action::requeue(self.cfg.poll_interval));
                }
                let repriced = self.reprice(&b, &status, i);
                let change = status.phase != BindingPhase::Running || repriced;
                let mut started = None;
                if change {
                    if repriced {
                        status.price_per_hour = Some(i.price_per_hour);
                    }
                    status.phase = BindingPhase::Running;
                    status.reason = Some("Running".into());
                    status.message = Some(format!("{} is running", describe(i)));
                    if b.status.as_ref().map(|s| s.phase) != Some(BindingPhase::Running) {
                        started = Some(format!(
                            "{} is running; ports: {}",
                            describe(i),
                            endpoints(i)
                        ));
                    }
                }
                // The events go out beside the binding's write, if any (each is stamped when it
                // starts, so `Rented` still reads before `Started`), and before the Pod's.
                let write = async {
                    if change {
                        write_status(&self.client, &b, &status).await?;
                    }
                    Ok::<(), kube::Error>(())
                };
                let events = async {
                    if let Some((reason, note)) = said {
                        self.event(pod, false, reason, note).await;
                    }
                    if let Some(note) = &started {
                        self.event(pod, false, "Started", note.clone()).await;
                    }
                    self.unhealthy_events(pod).await;
                };
                if started.is_some() {
                    // The start is told once: a pass that read a binding older than its own last
                    // write (the cache lags behind it) is refused the write (its resourceVersion
                    // is stale) and tells nothing; the pass after it reads `Running`.
                    write.await?;
                    events.await;
                    trace_wait(&status, i);
                    if let Some(created) = pod.metadata.creation_timestamp.as_ref() {
                        let waited = k8s_openapi::jiff::Timestamp::now()
                            .duration_since(created.0)
                            .try_into()
                            .unwrap_or_default();
                        self.metrics.observe_time_to_running(i.provider, waited);
                    }
                } else {
                    let (written, ()) = tokio::join!(write, events);
                    written?;
                }
                let mut want = self.running_pod(pod, i, replacements(&status), runner);
                // A workload the node can open sessions to (its runner's, or a remote cluster's
                // Pod) gets a cluster address: its relay's.
                if (runner.is_some() || provider_id == Some(ProviderId::Kube))
                    && let Some(relay) = self.ensure_relay(pod).await?
                {
                    want.pod_ip = relay.ip;
                    want.relay_ready = Some(relay.ready);
                }
                if self.set_pod(pod, &want).await?
                    && matches!(want.container, Container::BackOff { .. })
                {
                    let note = format!(
                        "Back-off restarting failed container {} in pod {}",
                        container_name(pod),
                        kubelet_pod(pod)
                    );
                    self.event(pod, true, "BackOff", note).await;
                }
                return Ok(Action::requeue(self.cfg.running_poll_interval));
            }
            Some(i) if i.refused_capacity() => {
                return self.refused(pod, &b, status, i).await;
            }
            Some(i)
                if matches!(
                    i.phase,
                    InstancePhase::Pending | InstancePhase::Starting | InstancePhase::Unknown
                ) =>
            {
                let message = format!("waiting for {} ({})", describe(i), provider_said(i));
                self.set_pod(pod, &DesiredPod::pending("Provisioning", message))
                    .await?;
                return Ok(Action::requeue(self.cfg.poll_interval));
            }
            Some(i) if i.reclaimed() => (
                "Preempted",
                format!(
                    "{} was reclaimed by {} ({})",
                    describe(i),
                    i.provider,
                    i.provider_status
                ),
            ),
            Some(i) if i.phase == InstancePhase::Failed => (
                "InstanceFailed",
                // What the provider said of it too: a refused pull names the image there.
                format!("{} failed: {}", describe(i), provider_said(i)),
            ),
            Some(i) => (
                "InstanceStopped",
                format!("{} is {} ({})", describe(i), i.phase, i.provider_status),
            ),
            None => (
                "InstanceLost",
                format!("{provider_id:?} no longer knows instance {instance_id}"),
            ),
        };
        let restart = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) != Some("Never");
        let replaced = replacements(&status);
        // Only a reclaim is a preemption; an on-demand instance that stopped or vanished
        // without us is lost (policies count the two apart).
        let class = if reason == "Preempted" {
            self.event(pod, true, reason, message.clone()).await;
            FailureClass::Preempted
        } else {
            FailureClass::Lost
        };
        if restart && replaced < self.max_replacements(pod) {
            // A machine that ended by itself may have been ended by its workload (a container
            // provider stops one whose process exited): rented again after a back-off. One
            // lost or reclaimed is rented again at once.
            if matches!(reason, "InstanceStopped" | "InstanceFailed") {
                return self.rerent(pod, &b, status, message).await;
            }
            // A gang member: its fallback policy may end the whole gang instead.
            if let Some(gave_up) = self.gang_ends(pod, &status, class, &message) {
                return self.end_gang(pod, &b, gave_up, message).await;
            }
            return self.replace(pod, &b, status, class, message).await;
        }
        self.event(pod, true, reason, message.clone()).await;
        self.fail(pod, &b, reason, message).await
    }

    /// How long `provider` still backs off (a 429 or repeated failures), and why.
    pub(super) fn backing_off(&self, provider: Option<ProviderId>) -> Option<(Duration, String)> {
        self.renter.catalog.backoff().remaining(provider?)
    }

    /// Whether the provider now reports a price for the running instance other than the one
    /// recorded (a rental recorded at the offer's price because the provider said 0 while it
    /// provisioned): if so the budget and the cost ledger take the reported price from now on.
    pub(super) fn reprice(
        &self,
        b: &CloudPodBinding,
        status: &CloudPodBindingStatus,
        i: &InstanceState,
    ) -> bool {
        let reported = i.price_per_hour;
        if !(reported.is_finite() && reported > 0.0) || status.price_per_hour == Some(reported) {
            return false;
        }
        let key = binding_key(b);
        self.renter.budget.record_existing(&key, reported);
        self.renter.ledger.start(&key, reported, Utc::now());
        true
    }

    /// What a Pod whose instance runs says: its container running (since when its runner
    /// started it), or backing off before a restart in place (`CrashLoopBackOff`), with the
    /// restarts (`replaced` instances and the runner's restarts in place) and how the last run
    /// ended.
    pub(super) fn running_pod(
        &self,
        pod: &Pod,
        i: &InstanceState,
        replaced: usize,
        runner: Option<RunnerStatus>,
    ) -> DesiredPod {
        let in_place = self.in_place(pod);
        let restarts = replaced.saturating_add(in_place.restart_count as usize);
        let mut want = DesiredPod::running().on(i, restarts);
        want.last_state = in_place.last.as_ref().map(last_state);
        match (runner, in_place.backoff_seconds) {
            (Some(RunnerStatus::BackOff), Some(seconds)) => {
                want.container = Container::BackOff {
                    message: format!(
                        "back-off {} restarting failed container={} pod={}",
                        go_duration(seconds),
                        container_name(pod),
                        kubelet_pod(pod)
                    ),
                };
            }
            _ => want.started_at = in_place.started_at.map(rfc3339),
        }
        // A remote cluster's kubelet probes its Pod: its `Ready` is the container's.
        if i.provider == ProviderId::Kube
            && let Some(ready) = i.ready
        {
            want.probed = Some(Probed {
                ready,
                started: true,
            });
        }
        if runner == Some(RunnerStatus::Running) {
            // Until the runner's first report, a probed container is neither ready nor (with a
            // startup probe) started, as on a kubelet.
            want.probed = match self.runner_probes(pod) {
                Some(p) => Some(Probed {
                    ready: p.ready,
                    started: p.started,
                }),
                None => super::probes::for_runner(pod).map(|p| Probed {
                    ready: p.readiness.is_none() && p.startup.is_none(),
                    started: p.startup.is_none(),
                }),
            };
        }
        want
    }

    /// What the Pod's runner last said of its probes.
    pub(super) fn runner_probes(&self, pod: &Pod) -> Option<neocloud_protocol::ProbeStatus> {
        let uid = pod.uid().unwrap_or_default();
        self.cfg.runners.as_ref()?.probes(&uid)
    }

    /// Publishes the `Unhealthy` events of the probes that failed since the last reconcile,
    /// as a kubelet words them (repeats fold into a series).
    pub(super) async fn unhealthy_events(&self, pod: &Pod) {
        let uid = pod.uid().unwrap_or_default();
        let Some(runners) = self.cfg.runners.as_ref() else {
            return;
        };
        for note in runners.take_unhealthy(&uid) {
            self.event(pod, true, "Unhealthy", note).await;
        }
    }

    /// What the Pod's runner last said of its restarts in place.
    pub(super) fn in_place(&self, pod: &Pod) -> InPlace {
        let uid = pod.uid().unwrap_or_default();
        self.cfg
            .runners
            .as_ref()
            .map(|r| r.in_place(&uid))
            .unwrap_or_default()
    }
}

/// The Pod's first container's name.
pub(super) fn container_name(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

/// Whole seconds as Go prints a `time.Duration` (kubelet's messages do): `10s`, `1m20s`,
/// `5m0s`, `1h0m0s`.
pub(super) fn go_duration(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// A Pod as a kubelet names it in messages: `name_namespace(uid)`.
pub(super) fn kubelet_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.name_any(),
        pod.namespace().unwrap_or_default(),
        pod.uid().unwrap_or_default()
    )
}

/// A runner's account of a run as the Pod's `lastState`.
pub(super) fn last_state(t: &Termination) -> LastState {
    LastState {
        exit_code: t.exit_code,
        reason: t.reason.clone(),
        started_at: rfc3339(t.started_at),
        finished_at: rfc3339(t.finished_at),
    }
}

/// `8888 at 1.2.3.4:31000, 22 at 1.2.3.4:31001`, or `none yet`.
pub(super) fn endpoints(i: &InstanceState) -> String {
    if i.endpoints.is_empty() {
        return "none yet".to_owned();
    }
    i.endpoints
        .iter()
        .map(|e| format!("{} at {}:{}", e.container_port, e.host, e.port))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `runpod instance abc (1x A40, $0.4400/h, region)`.
pub(super) fn describe(i: &InstanceState) -> String {
    format!(
        "{} instance {} ({}x {}, ${:.4}/h, {})",
        i.provider,
        i.id,
        i.gpu_count,
        i.gpu.name(),
        i.price_per_hour,
        i.region
    )
}

/// The provider's status of an instance, with its own words where it gives them:
/// `ErrImagePull: failed to pull ...`, or `loading`.
pub(super) fn provider_said(i: &InstanceState) -> String {
    match i.message.as_deref() {
        Some(said) if !said.is_empty() => format!("{}: {said}", i.provider_status),
        _ => i.provider_status.clone(),
    }
}

/// Closes the placement's trace with the wait from the rental to the instance Running: a span
/// from the last rental's answer to now, under the binding's `traceparent`.
pub(super) fn trace_wait(status: &CloudPodBindingStatus, i: &InstanceState) {
    let Some(traceparent) = status.traceparent.as_deref() else {
        return;
    };
    let Some(rented) = status.rented_at() else {
        return;
    };
    let start = std::time::SystemTime::from(rented);
    neocloud_telemetry::telemetry::record_after(
        traceparent,
        "wait for running",
        start,
        vec![
            opentelemetry::KeyValue::new("neocloud.provider", i.provider.to_string()),
            opentelemetry::KeyValue::new("neocloud.instance", i.id.clone()),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_waits_read_as_kubelet_prints_them() {
        let printed: Vec<String> = [10, 40, 80, 300, 3600].map(go_duration).into();
        assert_eq!(printed, ["10s", "40s", "1m20s", "5m0s", "1h0m0s"]);
    }
}
