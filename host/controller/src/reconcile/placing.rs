//! Placing a Pod: the BurstPolicy it names resolved over the defaults and its own expressions,
//! an instance an earlier run rented looked up by name first, then planning and renting through
//! the broker with every attempt recorded, and the outcome written to the binding, the Pod and
//! its events.

use std::sync::Arc;

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use neocloud_broker::{
    Broker, BrokerError, FallbackPolicy, OfferFilter, Placement, Planner, Renter, fill_unreported,
};
use neocloud_core::{AttemptOutcome, InstancePhase, InstanceState, WorkloadSpec};
use tracing::Instrument as _;

use super::attempts::{attempted_providers, class_reason, ended_over_budget, from_record};
use super::gangs::Gate;
use super::mirror::{describe, provider_said};
use super::pod_status::DesiredPod;
use super::recorder::{BindingRecorder, write_status};
use super::release::binding_key;
use super::rented::rented_note;
use super::{Error, Reconciler, Said, env};
use neocloud_api::{BindingPhase, CloudPodBinding, CloudPodBindingStatus};
use neocloud_burst_policy::PolicyUnavailable;
use neocloud_telemetry::metrics::RentalOutcome;

impl Reconciler {
    /// The planner and fallback of the `BurstPolicy` the workload names, if any, with the Pod's
    /// own expressions on top: its constraint must hold as well as the policy's, and its rank,
    /// if it has one, replaces the policy's. Also returns ` under policy <name> (<digest>)` for
    /// events.
    pub(super) fn with_policy(
        &self,
        w: &WorkloadSpec,
        pod_planner: Planner,
    ) -> Result<(Planner, Arc<dyn FallbackPolicy>, String), PolicyUnavailable> {
        let Some(name) = &w.policy else {
            return Ok((
                pod_planner,
                Arc::clone(&self.renter.fallback),
                String::new(),
            ));
        };
        let registry = self
            .policies
            .as_ref()
            .ok_or_else(|| PolicyUnavailable::NotLoaded {
                name: name.clone(),
                error: "this node runs without a policy registry".to_owned(),
            })?;
        let resolved = registry.resolve(name, &self.planner, &self.renter.fallback, w)?;
        let mut planner = resolved.planner;
        if w.constraint.is_some() {
            planner.filter = Arc::new(BothFilters(planner.filter, pod_planner.filter));
        }
        if w.rank.is_some() {
            planner.ranker = pod_planner.ranker;
        }
        let span = tracing::Span::current();
        span.record("neocloud.policy", name.as_str());
        span.record("neocloud.policy.digest", resolved.digest.as_str());
        let note = format!(" under policy {name} ({})", resolved.digest);
        Ok((planner, resolved.fallback, note))
    }

    /// The workload a Pod translates to and the planner it is placed with, its `BurstPolicy`
    /// resolved, exactly as the Pod controller places it; or the reason (`NamespaceNotWatched`,
    /// `Unsupported`, or the policy's) and why. For planning Pods that are not there yet (a ProvisioningRequest's
    /// templates): nothing is cached.
    pub fn plan_pod(&self, pod: &Pod) -> Result<(WorkloadSpec, Planner), (String, String)> {
        if let Some(why) = self.unwatched(pod) {
            return Err(("NamespaceNotWatched".to_owned(), why));
        }
        let (w, planner) = self
            .translate(pod)
            .map_err(|why| ("Unsupported".to_owned(), why))?;
        let (planner, _, _) = self
            .with_policy(&w, planner)
            .map_err(|e| (e.reason().to_owned(), e.to_string()))?;
        Ok((w, planner))
    }

    /// The renter: the catalog, the budget and the ledger the Pods are rented against.
    pub fn renter(&self) -> &Renter {
        &self.renter
    }

    /// The virtual node's name.
    pub fn node_name(&self) -> &str {
        &self.cfg.node_name
    }

    /// Plans and rents (after looking for an instance an earlier run may have rented), in the
    /// placement's trace when traces are exported.
    pub(super) async fn place(
        &self,
        pod: &Pod,
        b: CloudPodBinding,
        status: CloudPodBindingStatus,
    ) -> Result<Action, Error> {
        let span = tracing::info_span!(
            target: neocloud_telemetry::telemetry::TARGET,
            "place pod",
            "k8s.namespace.name" = %pod.namespace().unwrap_or_default(),
            "k8s.pod.name" = %pod.name_any(),
            "k8s.pod.uid" = %pod.uid().unwrap_or_default(),
            "neocloud.binding" = %b.spec.external_name,
            "neocloud.policy" = tracing::field::Empty,
            "neocloud.policy.digest" = tracing::field::Empty,
        );
        // Boxed: the placement's future is large, and waits for its turn in the queue.
        Box::pin(self.place_traced(pod, b, status))
            .instrument(span)
            .await
    }

    async fn place_traced(
        &self,
        pod: &Pod,
        b: CloudPodBinding,
        mut status: CloudPodBindingStatus,
    ) -> Result<Action, Error> {
        // A Pod whose container exited waits out the back-off before it is rented again.
        if let Some(left) = super::rerent::rerent_wait(&status, Utc::now()) {
            tracing::debug!(pod = %pod.name_any(), ?left, "waiting out the back-off before renting again");
            return Ok(Action::requeue(left));
        }
        // An instance of unknown fate is looked up before anything is rented: while a provider
        // it may live on backs off, the Pod waits rather than rent elsewhere.
        if let Some((left, why)) = attempted_providers(&status)
            .into_iter()
            .find_map(|p| self.backing_off(Some(p)))
        {
            tracing::debug!(pod = %pod.name_any(), %why, "waiting for a provider's back-off");
            return Ok(Action::requeue(left));
        }
        if let Some(found) = self.find_rented(&b, &status).await? {
            return self.adopt(pod, &b, status, found).await;
        }
        // No instance lives under the name: a rental counted as in flight when the budget was
        // rebuilt (see `rebuild`) spends nothing. Only such a binding (its last attempt in
        // flight or created) is released here: one read from a cache behind a rental this process made
        // must not free what that rental spends (its write conflicts, and the next reconcile
        // sees the instance).
        if super::rebuild::rental_in_flight(&status).is_some() {
            self.renter.budget.release(&binding_key(&b));
        }
        let translated =
            tracing::info_span!(target: neocloud_telemetry::telemetry::TARGET, "translate")
                .in_scope(|| self.workload(pod));
        let (w, planner) = match translated {
            Ok(ok) => ok,
            Err(why) => return self.fail(pod, &b, "Unsupported", why).await,
        };
        let env = match env::resolve(&self.client, &pod.namespace().unwrap_or_default(), &w).await {
            Ok(env) => env,
            Err(e) => {
                return self
                    .wait(pod, &b, status, "CreateContainerConfigError", e.to_string())
                    .await;
            }
        };
        // The files of its ConfigMap, Secret and downward-API volumes: a missing object keeps
        // the Pod pending, as a kubelet's FailedMount does.
        let files = match super::files::resolve_pod(&self.client, pod).await {
            Ok(files) => files,
            Err(e) => {
                let reason = super::files::FAILED_MOUNT;
                return self.wait(pod, &b, status, reason, e.to_string()).await;
            }
        };
        // The login for a private image: a pull secret that cannot be used keeps the Pod
        // pending, and nothing is rented.
        let registry_login = match super::pull_secrets::resolve(&self.client, pod, &w.image).await {
            Ok(login) => login,
            Err(e) => {
                let reason = super::pull_secrets::REASON;
                return self.wait(pod, &b, status, reason, e.to_string()).await;
            }
        };
        let (planner, fallback, policy) = match self.with_policy(&w, planner) {
            Ok(resolved) => resolved,
            Err(e) => {
                return self.wait(pod, &b, status, e.reason(), e.to_string()).await;
            }
        };
        // A gang member waits for its gang, and then rents in the gang's place only.
        let (member, planner) = match self.gang_gate(pod, &b, &status).await? {
            Gate::Done(action) => return Ok(action),
            Gate::Solo => (None, planner),
            Gate::Member { key, round, place } => {
                (Some((key, round)), crate::holds::confine(planner, place))
            }
        };
        // A Pod admitted through a ProvisioningRequest takes a machine rented ahead for it, if
        // the request holds one (see `held`).
        if member.is_none()
            && let Some(machine) = (self.cfg.holds.as_ref()).and_then(|h| {
                h.take_machine_for(pod, |m| m.image == w.image && m.gpu_count == w.gpu.count)
            })
        {
            let login = registry_login.as_ref();
            return Box::pin(self.take_held(pod, &b, status, machine, &w, &env, &files, login))
                .await;
        }
        // The Pod says nothing while it is planned (it is Pending, as the API server made it):
        // what it says next is the outcome (Running, Provisioning, Waiting, NoOffer...), one
        // write instead of two. A Pod waiting keeps its reason while it is planned again.
        let history: Vec<_> = status
            .attempts
            .iter()
            .filter_map(|a| from_record(a, None))
            .collect();
        // The rental boots the runner (a VM from user_data, a container from its start command);
        // registering the workload as the binding's next rental issues the runner's one-time
        // token and voids every credential of an earlier rental of this Pod. The number is in
        // the status the recorder writes before the first provider call, so a new leader
        // believes the same rental.
        let boot = match &self.cfg.runners {
            Some(runners) => {
                let rental = status.runner_rental.map_or(1, |r| r + 1);
                status.runner_rental = Some(rental);
                match runners.boot(pod, rental, &w, &env, &files, registry_login.as_ref()) {
                    Ok(boot) => Some(boot),
                    Err(e) => {
                        return self
                            .wait(pod, &b, status, "RunnerUnavailable", e.to_string())
                            .await;
                    }
                }
            }
            None => None,
        };
        let key = binding_key(&b);
        // A Pod admitted by Kueue through a ProvisioningRequest takes (drops) the budget held
        // for it just before it reserves its own, and prefers the place the request was planned
        // in (see `crate::provisioning`).
        let held = (self.cfg.holds.as_ref())
            .filter(|_| member.is_none())
            .and_then(|h| h.take_for(pod));
        let planner = match held {
            Some(place) => crate::holds::prefer(planner, place),
            None => planner,
        };
        let broker = Broker {
            planner,
            renter: Renter {
                fallback,
                ..self.renter.clone()
            },
        };
        let placement = Placement {
            binding: &key,
            external_name: &b.spec.external_name,
            workload: &w,
            env: &env,
            history: &history,
            boot: boot.as_ref(),
            registry_login: registry_login.as_ref(),
        };
        if let Some(traceparent) =
            neocloud_telemetry::telemetry::traceparent(&tracing::Span::current())
        {
            status.traceparent = Some(traceparent);
        }
        let decider = w
            .policy
            .clone()
            .unwrap_or_else(|| super::recorder::DEFAULT_POLICY.to_owned());
        let recorder = BindingRecorder::new(self, pod, decider, b.clone(), status);
        let result = broker.place(&placement, &recorder).await;
        // Everything from here starts from the binding as the recorder last wrote it, with every
        // attempt of this round in it.
        let b = recorder.binding();
        let status = recorder.status();
        if let (Some((key, round)), Err(e)) = (&member, &result)
            && let Some((reason, message)) = gang_failure(e)
        {
            recorder.flush().await?;
            let b = recorder.binding();
            let status = recorder.status();
            return self
                .gang_failed(pod, &b, status, (key, *round), &reason, message)
                .await;
        }
        match result {
            Ok((rental, plan)) => {
                let outcome = if rental.adopted {
                    RentalOutcome::Adopted
                } else {
                    RentalOutcome::Created
                };
                self.metrics
                    .record_rental(rental.instance.provider, outcome);
                let note = rented_note(&rental, &plan, history.len(), &policy);
                self.provisioning(pod, &b, status, &rental.instance, ("Rented", note))
                    .await
            }
            Err(BrokerError::NoCandidates { explanation }) => {
                self.wait(pod, &b, status, "NoOffer", explanation).await
            }
            Err(BrokerError::OffersTaken { .. }) => {
                let message = "every offer planned was taken by other renters; planning again \
                               with fresh offers"
                    .to_owned();
                self.wait(pod, &b, status, "Planning", message).await?;
                Ok(Action::requeue(self.cfg.release_poll))
            }
            Err(BrokerError::GaveUp {
                reason, attempts, ..
            }) if ended_over_budget(&attempts) => {
                // The guard's refusal says what runs and what was asked; the ladder's reason
                // only that no candidate was left.
                let refusal = attempts.last().and_then(|a| match &a.outcome {
                    AttemptOutcome::Failed { message, .. } => Some(message.clone()),
                    _ => None,
                });
                let message = refusal.map_or(reason, |m| format!("{m}; planning again later"));
                self.wait(pod, &b, status, "OverBudget", message).await
            }
            Err(BrokerError::GaveUp {
                reason, attempts, ..
            }) => {
                recorder.flush().await?;
                let b = recorder.binding();
                let why = attempts
                    .last()
                    .and_then(|a| a.failure())
                    .map(class_reason)
                    .unwrap_or_else(|| "GaveUp".to_owned());
                let made = attempts.len() - history.len();
                let message = format!("gave up after {made} attempts: {reason}");
                self.fail(pod, &b, &why, message).await
            }
            Err(BrokerError::Policy(e)) => {
                self.wait(pod, &b, status, "PolicyError", e.to_string())
                    .await
            }
            Err(BrokerError::Record { message, .. }) => {
                // The Pod is going away (or the API server refused a write): look again.
                tracing::info!(pod = %key, %message, "renting stopped");
                Ok(Action::requeue(self.cfg.release_poll))
            }
            Err(BrokerError::Provider(e)) => Err(e.into()),
        }
    }

    /// A live instance under the binding's external name on a provider it attempted.
    async fn find_rented(
        &self,
        b: &CloudPodBinding,
        status: &CloudPodBindingStatus,
    ) -> Result<Option<InstanceState>, Error> {
        for id in attempted_providers(status) {
            if let Some(provider) = self.renter.catalog.provider(id)
                && let Some(found) = provider.find_by_name(&b.spec.external_name).await?
                && !found.phase.is_terminal()
            {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Takes over an instance found by name (rented before a crash).
    async fn adopt(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        status: CloudPodBindingStatus,
        mut found: InstanceState,
    ) -> Result<Action, Error> {
        let key = binding_key(b);
        let provider = found.provider.as_str();
        if let Some(last) = status
            .attempts
            .iter()
            .rev()
            .find(|a| a.provider == provider)
        {
            fill_unreported(&mut found, last.price_per_hour, None);
        }
        self.renter
            .budget
            .record_existing(&key, found.price_per_hour);
        self.renter
            .ledger
            .start(&key, found.price_per_hour, Utc::now());
        self.metrics
            .record_rental(found.provider, RentalOutcome::Adopted);
        let note = format!("found {} by its name", describe(&found));
        self.provisioning(pod, b, status, &found, ("Adopted", note))
            .await
    }

    /// Records a rented instance in the binding and the Pod, and says so in an event (`said`:
    /// its reason and note). The event goes out beside the binding's write and before the Pod's:
    /// whoever sees the Pod's new status finds the event too.
    async fn provisioning(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        mut status: CloudPodBindingStatus,
        i: &InstanceState,
        said: Said,
    ) -> Result<Action, Error> {
        status.phase = BindingPhase::Provisioning;
        status.reason = Some("Provisioning".into());
        status.message = Some(format!("{} is {}", describe(i), provider_said(i)));
        status.provider = Some(i.provider.as_str().to_owned());
        status.instance_id = Some(i.id.clone());
        status.gpu = Some(format!("{}x {}", i.gpu_count, i.gpu.name()));
        status.price_per_hour = Some(i.price_per_hour);
        if let Some(a) = status.attempts.last() {
            status.offer_id = Some(a.offer_id.clone());
        }
        // An instance running at once, with no runner to wait for, is mirrored now: the
        // binding is written once, with the instance and its Running phase. (The attempt in
        // flight is already written: a crash before this write adopts the instance by name.)
        let runner = self
            .cfg
            .runners
            .as_ref()
            .is_some_and(|r| r.runs(i.provider, pod));
        if i.phase == InstancePhase::Running && !runner {
            return Box::pin(self.mirror_instance(
                pod,
                b.clone(),
                status,
                Some(i.clone()),
                Some(said),
            ))
            .await;
        }
        let (reason, note) = said;
        let (written, ()) = tokio::join!(
            write_status(&self.client, b, &status),
            self.event(pod, false, reason, note)
        );
        written?;
        let message = format!("waiting for {}", describe(i));
        self.set_pod(pod, &DesiredPod::pending("Provisioning", message))
            .await?;
        Ok(Action::requeue(self.cfg.poll_interval))
    }
}

/// A gang member's rental that failed, as a reason and a message: every outcome but a rental,
/// a record the API server refused (the Pod is going away) and a provider's error (its outcome
/// is unknown, and the Pod looks for its instance again).
fn gang_failure(e: &BrokerError) -> Option<(String, String)> {
    let reason = match e {
        BrokerError::NoCandidates { .. } => "NoOffer".to_owned(),
        BrokerError::OffersTaken { .. } => "OffersTaken".to_owned(),
        BrokerError::GaveUp { attempts, .. } if ended_over_budget(attempts) => {
            "OverBudget".to_owned()
        }
        BrokerError::GaveUp { attempts, .. } => attempts
            .last()
            .and_then(|a| a.failure())
            .map_or_else(|| "GaveUp".to_owned(), class_reason),
        BrokerError::Policy(_) => "PolicyError".to_owned(),
        BrokerError::Record { .. } | BrokerError::Provider(_) => return None,
    };
    Some((reason, e.to_string()))
}

/// Two constraints that must both hold (a policy's and the Pod's own).
#[derive(Debug)]
struct BothFilters(Arc<dyn OfferFilter>, Arc<dyn OfferFilter>);

impl OfferFilter for BothFilters {
    fn accepts(
        &self,
        w: &WorkloadSpec,
        o: &neocloud_core::Offer,
        attempts: &[neocloud_core::Attempt],
    ) -> Result<bool, neocloud_broker::PolicyError> {
        Ok(self.0.accepts(w, o, attempts)? && self.1.accepts(w, o, attempts)?)
    }
}
