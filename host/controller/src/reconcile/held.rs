//! Machines rented ahead of their Pods, for a ProvisioningRequest (issue 33): each is a binding
//! labelled [`HELD_LABEL`] (the request's UID), owned by the request, named `held-<uid>-<n>`
//! (its `spec.podName` is that name: no Pod has it yet), rented through the broker like a Pod's,
//! every attempt written first, with a runner that waits for a Pod. A Pod that consumes the
//! request takes one: its own binding is written with the machine's instance first, then the
//! machine's runner is handed the Pod's workload, and the held binding is deleted; its
//! instance, now named by the Pod's binding, is not released with it.
//!
//! The binding controller releases a held binding's instance once the request holds nothing
//! (deleted, expired, failed, or a new leader that did not rent it) and no other binding of the
//! node names its instance: a machine is never left rented for nobody, and never released
//! under a Pod that took it.
//!
//! Not deciding which requests get machines, nor when a booking ends: the ProvisioningRequest
//! controller (`neocloud-provisioning`).

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use neocloud_broker::{Broker, BrokerError, Placement, Planner};
use neocloud_core::{InstanceState, RegistryCredential, WorkloadSpec};

use super::attempts::rfc3339;
use super::files::PodFiles;
use super::pods::summary;
use super::recorder::{BindingRecorder, write_status};
use super::release::{Release, binding_key};
use super::{Error, FINALIZER, NODE_LABEL, Reconciler, Said};
use crate::holds::{HELD_LABEL, HeldMachine, HeldPlace};
use neocloud_api::{
    AttemptOutcome as RecordOutcome, AttemptRecord, BindingPhase, CloudPodBinding,
    CloudPodBindingSpec, CloudPodBindingStatus,
};

/// The request a machine is rented ahead for.
#[derive(Debug, Clone)]
pub struct HeldFor {
    /// Its namespace (the held bindings are made there).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Its owner reference, for the held bindings (deleted with it).
    pub owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
}

/// How renting one held machine ended.
#[derive(Debug)]
pub enum Held {
    /// It is rented (its runner boots and waits for a Pod).
    Rented(HeldMachine),
    /// It could not be: the reason (`NoOffer`, `OverBudget`, a failure class) and why. What
    /// was rented for it is being released.
    Failed(String, String),
}

/// The name of machine `n` held for the request with UID `uid`.
pub fn held_name(uid: &str, n: usize) -> String {
    format!("held-{uid}-{n}")
}

impl Reconciler {
    /// Whether this node's runner would run `pod` on `provider`: a machine can be rented ahead
    /// only there (without a runner, a container would start the workload before its Pod came).
    pub fn runner_runs(&self, provider: neocloud_core::ProviderId, pod: &Pod) -> bool {
        (self.cfg.runners.as_ref()).is_some_and(|r| r.runs(provider, pod))
    }

    /// Rents machine `n` for `req`, for a Pod like `pod` (a PodTemplate's), in `place` with
    /// `planner` (the template's, as `plan_pod` made it). Its binding is made first, and each
    /// attempt is written to it before the provider is called. A failure releases what was
    /// rented for it before it returns.
    pub async fn rent_held(
        &self,
        req: &HeldFor,
        n: usize,
        pod: &Pod,
        (w, planner): (WorkloadSpec, Planner),
        place: HeldPlace,
    ) -> Result<Held, Error> {
        let Some(runners) = self.cfg.runners.as_ref() else {
            let why = "this node runs no runner to wait on a machine".to_owned();
            return Ok(Held::Failed("RunnerUnavailable".into(), why));
        };
        let b = self.held_binding(req, n, &w).await?;
        let slot = b.spec.pod_uid.clone();
        let login = match super::pull_secrets::resolve(&self.client, pod, &w.image).await {
            Ok(login) => login,
            Err(e) => return self.held_failed(&b, super::pull_secrets::REASON, e).await,
        };
        let container = super::runner_workload::container_runner(pod);
        let boot = match runners.boot_held(&slot, container) {
            Ok(boot) => boot,
            Err(e) => return self.held_failed(&b, "RunnerUnavailable", e).await,
        };
        let mut status = b.status.clone().unwrap_or_default();
        status.runner_rental = Some(1);
        let key = binding_key(&b);
        let broker = Broker {
            planner: crate::holds::confine(planner, place),
            renter: self.renter.clone(),
        };
        // No environment: the Pod's is given to the runner when a Pod takes the machine.
        let placement = Placement {
            binding: &key,
            external_name: &b.spec.external_name,
            workload: &w,
            env: &[],
            history: &[],
            boot: Some(&boot),
            registry_login: login.as_ref(),
        };
        let decider = super::recorder::DEFAULT_POLICY.to_owned();
        let recorder =
            BindingRecorder::new(self, pod, decider, b.clone(), status).held_for(&req.uid);
        let result = broker.place(&placement, &recorder).await;
        recorder.flush().await?;
        let b = recorder.binding();
        let mut status = recorder.status();
        let (rental, _) = match result {
            Ok(rented) => rented,
            Err(e) => {
                let (reason, why) = held_failure(&e);
                return self.held_failed(&b, &reason, why).await;
            }
        };
        let i = &rental.instance;
        status.phase = BindingPhase::Provisioning;
        status.reason = Some("Held".into());
        status.message = Some(format!(
            "{} rented ahead for ProvisioningRequest {}/{}; waiting for a Pod",
            super::mirror::describe(i),
            req.namespace,
            req.name
        ));
        status.provider = Some(i.provider.as_str().to_owned());
        status.instance_id = Some(i.id.clone());
        status.gpu = Some(format!("{}x {}", i.gpu_count, i.gpu.name()));
        status.price_per_hour = Some(i.price_per_hour);
        let offer_id = status.attempts.last().map(|a| a.offer_id.clone());
        status.offer_id.clone_from(&offer_id);
        write_status(&self.client, &b, &status).await?;
        Ok(Held::Rented(HeldMachine {
            namespace: req.namespace.clone(),
            binding: b.name_any(),
            slot,
            provider: i.provider,
            instance_id: i.id.clone(),
            offer_id: offer_id.unwrap_or_default(),
            usd_per_hour: i.price_per_hour,
            image: w.image.clone(),
            gpu_count: w.gpu.count,
        }))
    }

    /// Makes (or finds, after a conflict) the binding of machine `n` held for `req`.
    async fn held_binding(
        &self,
        req: &HeldFor,
        n: usize,
        w: &WorkloadSpec,
    ) -> Result<CloudPodBinding, Error> {
        let name = held_name(&req.uid, n);
        let slot = format!("{}-{n}", req.uid);
        let mut b = CloudPodBinding::new(
            &name,
            CloudPodBindingSpec {
                pod_name: name.clone(),
                pod_uid: slot.clone(),
                external_name: self.cfg.cluster.external_name(&slot),
                cluster_id: self.cfg.cluster.to_string(),
                workload: summary(w),
                policy: None,
            },
        );
        b.metadata.namespace = Some(req.namespace.clone());
        b.metadata.owner_references = Some(vec![req.owner.clone()]);
        b.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        b.metadata.labels = Some(
            [
                (NODE_LABEL.to_owned(), self.cfg.node_name.clone()),
                (HELD_LABEL.to_owned(), req.uid.clone()),
            ]
            .into_iter()
            .collect(),
        );
        let api: Api<CloudPodBinding> = Api::namespaced(self.client.clone(), &req.namespace);
        match api.create(&PostParams::default(), &b).await {
            Ok(b) => Ok(b),
            Err(kube::Error::Api(s)) if s.code == 409 => api.get(&name).await.map_err(Error::from),
            Err(e) => Err(e.into()),
        }
    }

    /// Says why machine `b` could not be rented, and deletes its binding (the binding
    /// controller releases whatever was rented under it).
    async fn held_failed(
        &self,
        b: &CloudPodBinding,
        reason: &str,
        why: impl ToString,
    ) -> Result<Held, Error> {
        let why = why.to_string();
        self.delete_held(b).await?;
        Ok(Held::Failed(reason.to_owned(), why))
    }

    /// Deletes a held binding: the binding controller releases its instance (unless a Pod's
    /// binding names it) and then drops the finalizer.
    pub async fn delete_held(&self, b: &CloudPodBinding) -> Result<(), Error> {
        let api: Api<CloudPodBinding> =
            Api::namespaced(self.client.clone(), &b.namespace().unwrap_or_default());
        match api.delete(&b.name_any(), &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the held binding `name` of `namespace`, if it is there.
    pub async fn delete_held_named(&self, namespace: &str, name: &str) -> Result<(), Error> {
        let api: Api<CloudPodBinding> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(name).await? {
            Some(b) => self.delete_held(&b).await,
            None => Ok(()),
        }
    }

    /// How long a runner has to call in (zero without runners).
    pub fn runner_boot_timeout(&self) -> std::time::Duration {
        (self.cfg.runners.as_ref()).map_or(std::time::Duration::ZERO, |r| r.boot_timeout())
    }

    /// Whether the runner of the held machine `slot` has called in (the machine is up).
    pub fn held_up(&self, slot: &str) -> bool {
        (self.cfg.runners.as_ref())
            .and_then(|r| r.held(slot))
            .is_some_and(|h| h.called_in && !h.lost)
    }

    /// Whether the runner of the held machine `slot` was lost (the machine is gone).
    pub fn held_lost(&self, slot: &str) -> bool {
        (self.cfg.runners.as_ref())
            .and_then(|r| r.held(slot))
            .is_some_and(|h| h.lost)
    }

    /// Gives `pod` the held `machine`: the Pod's binding is written with the machine's instance
    /// (a new attempt saying so, and the runner's next rental), the machine's budget and cost
    /// move to it, its runner is handed the Pod's workload, and the held binding is deleted.
    #[allow(clippy::too_many_arguments)] // what the Pod's runner is given
    pub(super) async fn take_held(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        mut status: CloudPodBindingStatus,
        machine: HeldMachine,
        w: &WorkloadSpec,
        env: &[(String, String)],
        files: &PodFiles,
        login: Option<&RegistryCredential>,
    ) -> Result<Action, Error> {
        let Some(provider) = self.renter.catalog.provider(machine.provider) else {
            return Ok(Action::requeue(self.cfg.release_poll));
        };
        let found: Option<InstanceState> = provider.get(&machine.instance_id).await?;
        let Some(instance) = found.filter(|i| !i.phase.is_terminal()) else {
            // Gone meanwhile (reclaimed): the Pod rents as any Pod at its next reconcile.
            tracing::info!(pod = %pod.name_any(), machine = %machine.key(), "the held machine is gone; renting instead");
            self.delete_held_named(&machine.namespace, &machine.binding)
                .await?;
            return Ok(Action::requeue(self.cfg.release_poll));
        };
        let rental = status.runner_rental.map_or(1, |r| r + 1);
        status.runner_rental = Some(rental);
        let now = rfc3339(Utc::now());
        let number = status.attempts.last().map_or(0, |a| a.number) + 1;
        let note = format!(
            "took {} rented ahead for it (binding {}), at ${:.4}/h",
            super::mirror::describe(&instance),
            machine.binding,
            machine.usd_per_hour
        );
        status.attempts.push(AttemptRecord {
            number,
            provider: machine.provider.as_str().to_owned(),
            offer_id: machine.offer_id.clone(),
            price_per_hour: machine.usd_per_hour,
            started_at: now.clone(),
            finished_at: Some(now),
            outcome: RecordOutcome::Created,
            failure_class: None,
            message: Some(note.clone()),
            action: None,
            decided_by: None,
            decision: None,
            retried: None,
        });
        status.provider = Some(machine.provider.as_str().to_owned());
        status.instance_id = Some(instance.id.clone());
        status.offer_id = Some(machine.offer_id.clone());
        status.gpu = Some(format!("{}x {}", instance.gpu_count, instance.gpu.name()));
        status.price_per_hour = Some(machine.usd_per_hour);
        status.phase = BindingPhase::Provisioning;
        status.reason = Some("Provisioning".into());
        status.message = Some(note.clone());
        // The Pod's binding names the instance first: from here the held binding's release
        // leaves it alone.
        let written = write_status(&self.client, b, &status).await?;
        let key = binding_key(&written);
        self.renter
            .budget
            .record_existing(&key, machine.usd_per_hour);
        self.renter.budget.release(&machine.key());
        // From now on the machine is the Pod's: the held binding's cost ends where the Pod's
        // begins, never both.
        let now = Utc::now();
        self.renter.ledger.stop(&machine.key(), now);
        self.renter.ledger.start(&key, machine.usd_per_hour, now);
        if let Some(runners) = &self.cfg.runners
            && let Err(e) = runners.hand_over(pod, &machine.slot, rental, w, env, files, login)
        {
            // The machine's runner was lost: the Pod follows it as lost and is placed again.
            tracing::warn!(pod = %pod.name_any(), machine = %machine.key(), error = %e, "the held machine's runner cannot be handed over");
        }
        self.metrics.record_rental(
            machine.provider,
            neocloud_telemetry::metrics::RentalOutcome::Adopted,
        );
        self.delete_held_named(&machine.namespace, &machine.binding)
            .await?;
        let said: Said = ("Rented", note);
        self.event(pod, false, said.0, said.1).await;
        let message = format!("waiting for {}", super::mirror::describe(&instance));
        self.set_pod(
            pod,
            &super::pod_status::DesiredPod::pending("Provisioning", message),
        )
        .await?;
        Ok(Action::requeue(self.cfg.poll_interval))
    }

    /// The binding controller's side of a held binding: kept while its request holds and it is
    /// not being deleted; otherwise its instance is released (unless a Pod's binding names it,
    /// the Pod having taken it), its receipt kept, and it is removed.
    pub(super) async fn reconcile_held(&self, b: &CloudPodBinding) -> Result<Action, Error> {
        let request = b.labels().get(HELD_LABEL).cloned().unwrap_or_default();
        let held = (self.cfg.holds.as_ref()).is_some_and(|h| h.holds_uid(&request));
        if held && b.metadata.deletion_timestamp.is_none() {
            // Looked at again: however the request stops holding (deleted, expired, failed,
            // its answer never written), its machines are released within a poll.
            return Ok(Action::requeue(self.cfg.poll_interval));
        }
        let _turn = self.turns.wait().await;
        let taken = self.taken_by_a_pod(b).await?;
        let slot = &b.spec.pod_uid;
        let waiting = (self.cfg.runners.as_ref()).and_then(|r| r.held(slot));
        if taken && waiting.is_some_and(|h| !h.handed && !h.lost) {
            // Its runner has not fetched the Pod's secrets yet: kept until it has (or is lost).
            return Ok(Action::requeue(self.cfg.poll_interval));
        }
        let done = if taken {
            self.finish_taken(b).await?;
            true
        } else {
            self.release_for_removal(b).await? == Release::Done
        };
        if !done {
            return Ok(Action::requeue(self.cfg.release_poll));
        }
        if let Some(runners) = &self.cfg.runners {
            runners.forget(&b.spec.pod_uid);
        }
        if b.metadata.deletion_timestamp.is_none() {
            self.delete_held(b).await?;
        }
        tracing::info!(binding = %binding_key(b), taken, "a held machine's binding is removed");
        Ok(Action::await_change())
    }

    /// Whether another binding of the node (a Pod's) names `b`'s instance.
    async fn taken_by_a_pod(&self, b: &CloudPodBinding) -> Result<bool, Error> {
        let Some(status) = b.status.as_ref() else {
            return Ok(false);
        };
        let Some(id) = status.instance_id.as_deref() else {
            return Ok(false);
        };
        let api: Api<CloudPodBinding> = Api::all(self.client.clone());
        let params = kube::api::ListParams::default()
            .labels(&format!("{NODE_LABEL}={}", self.cfg.node_name));
        let all = api.list(&params).await?;
        Ok(all.items.iter().any(|other| {
            other.uid() != b.uid()
                && (other.status.as_ref()).is_some_and(|s| {
                    s.instance_id.as_deref() == Some(id) && s.provider == status.provider
                })
        }))
    }

    /// A held binding whose machine a Pod took: its cost until then is kept as a receipt, and
    /// its finalizer dropped; the instance is the Pod's.
    async fn finish_taken(&self, b: &CloudPodBinding) -> Result<(), Error> {
        let key = binding_key(b);
        self.renter.ledger.stop(&key, Utc::now());
        let cost = self.renter.ledger.accrued_usd(&key, Utc::now());
        self.renter.ledger.forget(&key);
        let usd =
            cost.unwrap_or_else(|| (b.status.as_ref()).map_or(0.0, |s| s.cost_usd_at(Utc::now())));
        self.keep_receipt(b, usd).await?;
        self.drop_finalizer(b).await
    }
}

/// A held machine's failed rental, as a reason and a message.
fn held_failure(e: &BrokerError) -> (String, String) {
    let reason = match e {
        BrokerError::NoCandidates { .. } => "NoOffer".to_owned(),
        BrokerError::OffersTaken { .. } => "OffersTaken".to_owned(),
        BrokerError::GaveUp { attempts, .. } if super::attempts::ended_over_budget(attempts) => {
            "OverBudget".to_owned()
        }
        BrokerError::GaveUp { attempts, .. } => attempts
            .last()
            .and_then(|a| a.failure())
            .map_or_else(|| "GaveUp".to_owned(), super::attempts::class_reason),
        BrokerError::Policy(_) => "PolicyError".to_owned(),
        BrokerError::Record { .. } => "Released".to_owned(),
        BrokerError::Provider(_) => "ProviderError".to_owned(),
    };
    (reason, e.to_string())
}
