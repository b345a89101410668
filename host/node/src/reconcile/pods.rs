//! The Pod controller's reconcile: from a Pod bound to the node to a binding, a rental and a
//! mirrored status, and back to nothing on deletion. See the module documentation of
//! [`super`] for the flow.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use neocloud_broker::{CelFilter, CelRanker, Planner};
use neocloud_core::{
    FailureClass, InstancePhase, InstanceState, ProviderId, WorkloadSpec, translate_pod,
};

use super::attempts::{class_reason, count_failed, rfc3339};
use super::pod_status::{Container, DesiredPod, LastState, Probed, apply_body, is_current};
use super::recorder::write_status;
use super::release::{Ending, Release, binding_key};
use super::rerent::{RERENT_BACKOFF, rerent_backoff};
use super::runners::{InPlace, RunnerStatus};
use super::{Error, FINALIZER, NODE_LABEL, Reconciler, Said};
use crate::callback::Termination;
use crate::crd::{
    AttemptOutcome, BindingPhase, CloudPodBinding, CloudPodBindingSpec, CloudPodBindingStatus,
    PolicyRef, WorkloadSummary,
};
use crate::metrics::{InstrumentedFilter, InstrumentedRanker};
use crate::vnode::FIELD_MANAGER;

/// How many times a Pod's instance is replaced after it stopped, failed or was lost by the
/// provider, before the Pod fails, unless its BurstPolicy's `maxReplacements` says otherwise.
pub const MAX_REPLACEMENTS: usize = 5;

/// Reconciles one Pod bound to the node.
pub(super) async fn reconcile(pod: Arc<Pod>, r: Arc<Reconciler>) -> Result<Action, Error> {
    // A due Pod without a turn waits in line and is reconciled again when its turn comes; the
    // reconcile itself (a future of about 20 KiB) is allocated only once it has its turn.
    let key = kube::runtime::reflector::ObjectRef::from_obj(&*pod);
    let Some(_turn) = r.turns.pod(&key).await else {
        return Ok(Action::await_change());
    };
    Box::pin(reconcile_turn(pod, r)).await
}

async fn reconcile_turn(pod: Arc<Pod>, r: Arc<Reconciler>) -> Result<Action, Error> {
    let ns = pod
        .namespace()
        .ok_or_else(|| Error::Invalid(format!("pod {} has no namespace", pod.name_any())))?;
    let uid = pod.uid().unwrap_or_default();
    let bindings: Api<CloudPodBinding> = Api::namespaced(r.client.clone(), &ns);
    let binding = r.binding(&ns, &pod.name_any()).await?;
    if pod.metadata.deletion_timestamp.is_some() {
        return r.delete_pod(&pod, binding).await;
    }
    let binding = match binding {
        // An earlier Pod's binding: the binding controller releases it; then this Pod gets one.
        Some(b) if b.spec.pod_uid != uid => return Ok(Action::requeue(r.cfg.release_poll)),
        Some(b) => b,
        None if is_terminal(&pod) => return Ok(Action::await_change()),
        None => match r.create_binding(&pod, &bindings).await? {
            Some(b) => b,
            None => return Ok(Action::await_change()),
        },
    };
    Box::pin(r.drive(&pod, binding)).await
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

impl Reconciler {
    /// Writes the Pod's status when it says something else.
    pub(super) async fn set_pod(&self, pod: &Pod, want: &DesiredPod) -> Result<bool, Error> {
        if is_current(pod, want) {
            return Ok(false);
        }
        let body = apply_body(pod, want, &self.cfg.host_ip, &rfc3339(Utc::now()));
        let namespace = pod.namespace().unwrap_or_default();
        let request = kube::core::Request::new(Pod::url_path(&(), Some(&namespace)))
            .patch_subresource(
                "status",
                &pod.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            );
        super::send_unread(&self.client, request).await?;
        Ok(true)
    }

    /// The workload and its planner, or the reason the Pod cannot run (naming the field):
    /// translated and its expressions compiled once per Pod generation and annotations (see
    /// [`Translations`](super::Translations)).
    pub(super) fn workload(&self, pod: &Pod) -> Result<(WorkloadSpec, Planner), String> {
        let uid = pod.uid().unwrap_or_default();
        let print = super::fingerprint(pod);
        if let Some(hit) = self.translations.get(&uid, print) {
            return hit;
        }
        let translated = self.translate(pod);
        self.translations.put(uid, print, translated.clone());
        translated
    }

    fn translate(&self, pod: &Pod) -> Result<(WorkloadSpec, Planner), String> {
        let w = translate_pod(pod).map_err(|e| e.to_string())?;
        let kube = neocloud_core::ProviderId::Kube;
        let remote_cluster = self.provider(kube).is_some()
            && (w.providers.is_empty() || w.providers.contains(&kube));
        let runners = self.cfg.runners.as_deref();
        if let Some(refused) = super::probes::unhonoured(pod, runners, remote_cluster) {
            return Err(refused);
        }
        let mut planner = self.planner.clone();
        if let Some(src) = &w.constraint {
            let expr = self.cel.compile_constraint(src).map_err(|e| {
                format!(
                    "pod is not supported: metadata.annotations[cloud.aibrix.ai/constraints]: {e}"
                )
            })?;
            planner.filter = Arc::new(InstrumentedFilter::new(
                Arc::new(CelFilter::new(expr, &w)),
                "pod-constraints",
                Arc::clone(&self.metrics),
            ));
        }
        if let Some(src) = &w.rank {
            let expr = self.cel.compile_rank(src).map_err(|e| {
                format!("pod is not supported: metadata.annotations[cloud.aibrix.ai/rank]: {e}")
            })?;
            planner.ranker = Arc::new(InstrumentedRanker::new(
                Arc::new(CelRanker::new(expr, &w)),
                "pod-rank",
                Arc::clone(&self.metrics),
            ));
        }
        Ok((w, planner))
    }

    /// Creates the Pod's binding, or refuses the Pod (status and event) and returns `None`.
    pub(super) async fn create_binding(
        &self,
        pod: &Pod,
        bindings: &Api<CloudPodBinding>,
    ) -> Result<Option<CloudPodBinding>, Error> {
        if let Some(why) = self.unwatched(pod) {
            self.refuse(pod, "NamespaceNotWatched", why).await?;
            return Ok(None);
        }
        let w = match self.workload(pod) {
            Ok((w, _)) => w,
            Err(why) => {
                self.refuse(pod, "Unsupported", why).await?;
                return Ok(None);
            }
        };
        let uid = pod.uid().unwrap_or_default();
        let owner = pod
            .controller_owner_ref(&())
            .ok_or_else(|| Error::Invalid(format!("pod {} has no name or uid", pod.name_any())))?;
        let mut b = CloudPodBinding::new(
            &pod.name_any(),
            CloudPodBindingSpec {
                pod_name: pod.name_any(),
                pod_uid: uid.clone(),
                external_name: self.cfg.cluster.external_name(&uid),
                cluster_id: self.cfg.cluster.to_string(),
                workload: summary(&w),
                policy: w.policy.as_ref().map(|name| PolicyRef {
                    name: name.clone(),
                    digest: self.policies.as_ref().and_then(|r| r.digest(name)),
                }),
            },
        );
        b.metadata.namespace = pod.namespace();
        b.metadata.owner_references = Some(vec![owner]);
        b.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        b.metadata.labels = Some(
            [(NODE_LABEL.to_owned(), self.cfg.node_name.clone())]
                .into_iter()
                .collect(),
        );
        match bindings.create(&PostParams::default(), &b).await {
            Ok(b) => Ok(Some(b)),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                Ok(bindings.get_opt(&pod.name_any()).await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Why the Pod's namespace is not served, if it is not (`watchNamespaces`).
    fn unwatched(&self, pod: &Pod) -> Option<String> {
        let watched = self.cfg.watch_namespaces.as_ref()?;
        let ns = pod.namespace().unwrap_or_default();
        (!watched.contains(&ns)).then(|| {
            format!(
                "namespace {ns:?} is not one the node serves (watchNamespaces: {})",
                watched.join(", ")
            )
        })
    }

    /// Leaves the Pod Pending with `reason` (status and, once, an event); nothing is rented.
    async fn refuse(&self, pod: &Pod, reason: &'static str, why: String) -> Result<(), Error> {
        let want = DesiredPod::pending(reason, why.clone());
        if self.set_pod(pod, &want).await? {
            self.event(pod, true, reason, format!("{why}; nothing was rented"))
                .await;
        }
        Ok(())
    }

    /// Moves a live Pod with a binding one step on.
    async fn drive(&self, pod: &Pod, b: CloudPodBinding) -> Result<Action, Error> {
        let status = b.status.clone().unwrap_or_default();
        let ending_phase = match status.phase {
            BindingPhase::Releasing => status.ending,
            p @ (BindingPhase::Released | BindingPhase::Failed | BindingPhase::Succeeded) => {
                Some(p)
            }
            _ => None,
        };
        match ending_phase {
            Some(phase) => {
                let ending = Ending {
                    phase,
                    reason: status.reason.clone().unwrap_or_else(|| "Released".into()),
                    message: status.message.clone().unwrap_or_default(),
                };
                if b.finalizers().iter().any(|f| f == FINALIZER)
                    && let Release::Waiting(_) = self.release(&b, &ending).await?
                {
                    return Ok(Action::requeue(self.cfg.release_poll));
                }
                let mut want = match phase {
                    BindingPhase::Succeeded => DesiredPod {
                        phase: "Succeeded",
                        ..DesiredPod::failed(&ending.reason, ending.message.clone())
                    },
                    _ => DesiredPod::failed(&ending.reason, ending.message.clone()),
                };
                if let Some(exit_code) = status.exit_code {
                    want.container = Container::Terminated {
                        reason: ending.reason.clone(),
                        exit_code,
                    };
                }
                // A release that finishes here was decided (and its event published) when it
                // started, unless it was interrupted before the Pod was told.
                if self.set_pod(pod, &want).await? && phase == BindingPhase::Failed {
                    self.event(pod, true, &ending.reason, ending.message).await;
                }
                Ok(Action::await_change())
            }
            _ if status.instance_id.is_some() => self.mirror(pod, b, status).await,
            _ => self.place(pod, b, status).await,
        }
    }

    /// Mirrors the rented instance into the binding and the Pod.
    async fn mirror(
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
                        trace_wait(&status, i);
                        if let Some(created) = pod.metadata.creation_timestamp.as_ref() {
                            let waited = k8s_openapi::jiff::Timestamp::now()
                                .duration_since(created.0)
                                .try_into()
                                .unwrap_or_default();
                            self.metrics.observe_time_to_running(i.provider, waited);
                        }
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
                    if let Some(note) = started {
                        self.event(pod, false, "Started", note).await;
                    }
                    self.unhealthy_events(pod).await;
                };
                let (written, ()) = tokio::join!(write, events);
                written?;
                let want = self.running_pod(pod, i, replacements(&status), runner);
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
    fn reprice(
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
    fn running_pod(
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
        if runner == Some(RunnerStatus::Running) {
            want.probed = self.runner_probes(pod).map(|p| Probed {
                ready: p.ready,
                started: p.started,
            });
        }
        want
    }

    /// What the Pod's runner last said of its probes.
    fn runner_probes(&self, pod: &Pod) -> Option<neocloud_protocol::ProbeStatus> {
        let uid = pod.uid().unwrap_or_default();
        self.cfg.runners.as_ref()?.probes(&uid)
    }

    /// Publishes the `Unhealthy` events of the probes that failed since the last reconcile,
    /// as a kubelet words them (repeats fold into a series).
    async fn unhealthy_events(&self, pod: &Pod) {
        let uid = pod.uid().unwrap_or_default();
        let Some(runners) = self.cfg.runners.as_ref() else {
            return;
        };
        for note in runners.take_unhealthy(&uid) {
            self.event(pod, true, "Unhealthy", note).await;
        }
    }

    /// How many times the Pod may be rented again on a new machine: its BurstPolicy's
    /// `maxReplacements` when the policy is loaded and sets one, else [`MAX_REPLACEMENTS`].
    fn max_replacements(&self, pod: &Pod) -> usize {
        let policy = self.workload(pod).ok().and_then(|(w, _)| w.policy);
        policy
            .and_then(|name| self.policies.as_ref()?.max_replacements(&name))
            .map_or(MAX_REPLACEMENTS, |n| n as usize)
    }

    /// What the Pod's runner last said of its restarts in place.
    fn in_place(&self, pod: &Pod) -> InPlace {
        let uid = pod.uid().unwrap_or_default();
        self.cfg
            .runners
            .as_ref()
            .map(|r| r.in_place(&uid))
            .unwrap_or_default()
    }

    /// The container ended with `code`. When its runner restarts in place (`in_place`) it
    /// applied the Pod's restartPolicy itself and this end is final; otherwise (a Pod the
    /// runner does not run, or an older runner) the node applies it: the Pod runs again on a
    /// new instance after a back-off. Else the binding ends (Succeeded on 0, Failed
    /// otherwise), the instance is released and the Pod ends with the code.
    async fn exited(
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
    async fn rerent(
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
    async fn replace(
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
    async fn refused(
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
    async fn retire(
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

    /// Ends the binding as Failed: releases whatever it rented, then fails the Pod.
    pub(super) async fn fail(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        reason: &str,
        message: String,
    ) -> Result<Action, Error> {
        let ending = Ending {
            phase: BindingPhase::Failed,
            reason: reason.to_owned(),
            message: message.clone(),
        };
        if let Release::Waiting(_) = self.release(b, &ending).await? {
            return Ok(Action::requeue(self.cfg.release_poll));
        }
        if self
            .set_pod(pod, &DesiredPod::failed(reason, message.clone()))
            .await?
        {
            self.event(pod, true, reason, message).await;
        }
        Ok(Action::await_change())
    }

    /// Leaves the Pod Pending for `reason` and plans again after the retry interval.
    pub(super) async fn wait(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        mut status: CloudPodBindingStatus,
        reason: &str,
        message: String,
    ) -> Result<Action, Error> {
        status.phase = BindingPhase::Pending;
        status.reason = Some(reason.to_owned());
        status.message = Some(message.clone());
        // Also writes what this round recorded without a write of its own (budget refusals).
        if b.status.as_ref() != Some(&status) {
            write_status(&self.client, b, &status).await?;
        }
        if self
            .set_pod(pod, &DesiredPod::pending(reason, message.clone()))
            .await?
        {
            self.event(pod, true, reason, message).await;
        }
        Ok(Action::requeue(self.cfg.retry_interval))
    }

    /// A Pod being deleted: release, finalize the binding, then remove the Pod as its kubelet
    /// would (grace period 0, guarded by its UID).
    async fn delete_pod(
        &self,
        pod: &Pod,
        binding: Option<CloudPodBinding>,
    ) -> Result<Action, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let uid = pod.uid();
        if let Some(b) = binding.filter(|b| Some(&b.spec.pod_uid) == uid.as_ref()) {
            if let Release::Waiting(why) = self.release_for_removal(&b).await? {
                tracing::debug!(pod = %binding_key(&b), %why, "release not confirmed yet");
                return Ok(Action::requeue(self.cfg.release_poll));
            }
            let bindings: Api<CloudPodBinding> = Api::namespaced(self.client.clone(), &ns);
            ignore_gone(
                bindings
                    .delete(&b.name_any(), &DeleteParams::default())
                    .await,
            )?;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        ignore_gone(pods.delete(&pod.name_any(), &dp).await)?;
        let uid = pod.uid().unwrap_or_default();
        self.translations.forget(&uid);
        if let Some(runners) = &self.cfg.runners {
            runners.forget(&uid);
        }
        Ok(Action::await_change())
    }
}

/// The Pod's first container's name.
fn container_name(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

/// Whole seconds as Go prints a `time.Duration` (kubelet's messages do): `10s`, `1m20s`,
/// `5m0s`, `1h0m0s`.
fn go_duration(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// A Pod as a kubelet names it in messages: `name_namespace(uid)`.
fn kubelet_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.name_any(),
        pod.namespace().unwrap_or_default(),
        pod.uid().unwrap_or_default()
    )
}

/// A runner's account of a run as the Pod's `lastState`.
fn last_state(t: &Termination) -> LastState {
    LastState {
        exit_code: t.exit_code,
        reason: t.reason.clone(),
        started_at: rfc3339(t.started_at),
        finished_at: rfc3339(t.finished_at),
    }
}

/// How many instances of the binding were replaced after they stopped or were lost (listed
/// attempts and tallied ones).
pub(super) fn replacements(status: &CloudPodBindingStatus) -> usize {
    count_failed(status, &["preempted", "lost"])
}

/// `8888 at 1.2.3.4:31000, 22 at 1.2.3.4:31001`, or `none yet`.
fn endpoints(i: &InstanceState) -> String {
    if i.endpoints.is_empty() {
        return "none yet".to_owned();
    }
    i.endpoints
        .iter()
        .map(|e| format!("{} at {}:{}", e.container_port, e.host, e.port))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A 404 (already gone) or 409 (another object now has the name) is success for a delete.
fn ignore_gone<T>(r: Result<T, kube::Error>) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
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

/// What the binding records of the workload.
fn summary(w: &WorkloadSpec) -> WorkloadSummary {
    WorkloadSummary {
        image: w.image.clone(),
        gpu_count: w.gpu.count,
        gpu_models: w.gpu.accepted.iter().map(|g| g.name().to_owned()).collect(),
        max_price_per_hour: w.max_price_per_hour,
        capacity_type: w.capacity_type.to_string(),
        providers: w.providers.iter().map(|p| p.as_str().to_owned()).collect(),
        regions: w.regions.clone(),
    }
}

/// Closes the placement's trace with the wait from the rental to the instance Running: a span
/// from the last rental's answer to now, under the binding's `traceparent`.
fn trace_wait(status: &CloudPodBindingStatus, i: &InstanceState) {
    let Some(traceparent) = status.traceparent.as_deref() else {
        return;
    };
    let Some(rented) = status.rented_at() else {
        return;
    };
    let start = std::time::SystemTime::from(rented);
    crate::telemetry::record_after(
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
