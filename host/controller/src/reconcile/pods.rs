//! The Pod controller's reconcile: from a Pod bound to the node to a binding and a rental, and
//! back to nothing on deletion. The rented instance's state is mirrored onto the Pod by
//! `mirror`, and a run's end is handled by `endings`. See the module documentation of
//! [`super`] for the flow.

use std::sync::Arc;

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use neocloud_broker::{CelFilter, CelRanker, Planner};
use neocloud_core::{WorkloadSpec, translate_pod};

use super::attempts::rfc3339;
use super::pod_status::{Container, DesiredPod, apply_body, stale_field};
use super::recorder::write_status;
use super::release::{Ending, Release, binding_key};
use super::{Error, FINALIZER, NODE_LABEL, Reconciler};
use neocloud_api::FIELD_MANAGER;
use neocloud_api::{
    BindingPhase, CloudPodBinding, CloudPodBindingSpec, CloudPodBindingStatus, PolicyRef,
    WorkloadSummary,
};
use neocloud_telemetry::metrics::{InstrumentedFilter, InstrumentedRanker};

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
        let Some(stale) = stale_field(pod, want) else {
            return Ok(false);
        };
        tracing::debug!(pod = %pod.name_any(), phase = want.phase, reason = ?want.reason, stale, "writing the Pod's status");
        let body = apply_body(pod, want, &self.cfg.host_ip, &rfc3339(Utc::now()));
        let namespace = pod.namespace().unwrap_or_default();
        let request = kube::core::Request::new(Pod::url_path(&(), Some(&namespace)))
            .patch_subresource(
                "status",
                &pod.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            );
        crate::runtime::send_unread(&self.client, request).await?;
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

    pub(super) fn translate(&self, pod: &Pod) -> Result<(WorkloadSpec, Planner), String> {
        let w = translate_pod(pod).map_err(|e| e.to_string())?;
        let runners = self.cfg.runners.as_deref();
        // Where the Pod may go: the enabled providers it allows.
        let kube = neocloud_core::ProviderId::Kube;
        let allowed: Vec<_> = (self.renter.catalog.provider_ids().into_iter())
            .filter(|p| w.providers.is_empty() || w.providers.contains(p))
            .collect();
        // A remote cluster's kubelet runs its probes itself.
        let only_remote = allowed.iter().all(|p| *p == kube);
        let refused = (!only_remote)
            .then(|| super::probes::unhonoured(pod, runners))
            .flatten();
        if let Some(refused) = refused {
            return Err(refused);
        }
        // Egress is carried by the runner only: a remote cluster's Pod has none.
        let remote_cluster = allowed.contains(&kube);
        if let Some(refused) = super::egress::unhonoured(pod, runners, remote_cluster) {
            return Err(refused);
        }
        if let Some(refused) = super::egress::forbidden(pod, self.policies.as_deref()) {
            return Err(refused);
        }
        if self.cfg.relays.is_some() {
            super::relays::tcp_ports(pod)?;
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
    pub(super) fn unwatched(&self, pod: &Pod) -> Option<String> {
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
                self.drop_relay(pod).await?;
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
            _ if status.instance_id.is_some() && self.gang_stale(pod) => {
                // Rented in a gang round that broke: released, to be rented with the gang.
                let key = Self::gang_key(pod).unwrap_or_default();
                let done = self.gang_release(&key, pod, &b, status).await?;
                Ok(done.unwrap_or_else(|| Action::requeue(self.cfg.release_poll)))
            }
            _ if status.instance_id.is_some() => self.mirror(pod, b, status).await,
            _ => self.place(pod, b, status).await,
        }
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
        self.drop_relay(pod).await?;
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
        if let Some(gang) = Self::gang_key(pod).and_then(|k| self.cfg.gangs.get(&k)) {
            gang.state.lock().released(&uid);
        }
        if let Some(runners) = &self.cfg.runners {
            runners.forget(&uid);
        }
        Ok(Action::await_change())
    }
}

/// A 404 (already gone) or 409 (another object now has the name) is success for a delete.
pub(super) fn ignore_gone<T>(r: Result<T, kube::Error>) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What the binding records of the workload.
pub(super) fn summary(w: &WorkloadSpec) -> WorkloadSummary {
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
