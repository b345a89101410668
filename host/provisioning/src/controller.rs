//! The ProvisioningRequest controller: watches requests of [`CLASS`], decides each once (see
//! `decide`) and says so in its status; holds again, as a new leader, what an earlier one held
//! (`restore`); releases a request's hold when it is deleted, and expires a booking its Pods did
//! not take in time (`BookingExpired`).
//!
//! Runs on the leader only, beside the reconciler, and only when the ProvisioningRequest API is
//! served: without it, it says so once in the log and waits for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::decide::Outcome;
use super::restore;
use super::status::{self, Set};
use super::types::ProvisioningRequest;
use super::{CLASS, key};
use neocloud_controller::holds::Holds;
use neocloud_controller::reconcile::Reconciler;

/// How the controller behaves.
#[derive(Debug, Clone)]
pub struct ProvisioningConfig {
    /// How long a booking waits for its Pods at most (a request's `ValidUntilSeconds` may
    /// shorten it).
    pub booking: Duration,
    /// How often bookings are checked for expiry and for a request that is gone.
    pub sweep: Duration,
    /// How often the API is looked for while it is not served.
    pub discovery: Duration,
    /// Whether a request's Pods get machines rented ahead where the node's runner runs them
    /// (see `ahead`); otherwise only their budget is held.
    pub rent_ahead: bool,
}

impl Default for ProvisioningConfig {
    fn default() -> Self {
        ProvisioningConfig {
            booking: Duration::from_secs(600),
            sweep: Duration::from_secs(1),
            discovery: Duration::from_secs(60),
            rent_ahead: true,
        }
    }
}

/// The controller.
pub struct Provisioner {
    pub(super) client: Client,
    pub(super) reconciler: Arc<Reconciler>,
    pub(super) holds: Arc<Holds>,
    pub(super) cfg: ProvisioningConfig,
}

impl std::fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioner")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A reconcile that could not finish; it is retried.
#[derive(Debug, thiserror::Error)]
#[error("kubernetes: {0}")]
pub struct Error(#[from] kube::Error);

impl Provisioner {
    /// A controller deciding with `reconciler`'s translation, policies, catalog and budget, and
    /// holding budget in `holds` (the table the reconciler's Pods take from).
    pub fn new(
        client: Client,
        reconciler: Arc<Reconciler>,
        holds: Arc<Holds>,
        cfg: ProvisioningConfig,
    ) -> Arc<Provisioner> {
        Arc::new(Provisioner {
            client,
            reconciler,
            holds,
            cfg,
        })
    }

    /// Runs until the task is dropped: waits for the API, then watches requests.
    pub async fn run(self: Arc<Self>) {
        self.wait_served().await;
        tracing::info!(class = CLASS, "serving ProvisioningRequests");
        let api: Api<ProvisioningRequest> = Api::all(self.client.clone());
        let holds = Arc::clone(&self.holds);
        let (reader, writer) = reflector::store();
        let stream = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .inspect_ok(move |event| {
                if let watcher::Event::Delete(req) = event {
                    release_deleted(&holds, req);
                }
            })
            .reflect(writer)
            .touched_objects();
        let controller = Controller::for_stream(stream, reader);
        let store = controller.store();
        let decisions = controller
            .run(reconcile, error_policy, Arc::clone(&self))
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "provisioning request reconcile");
                }
            });
        tokio::join!(decisions, Arc::clone(&self).sweep(store));
    }

    /// Returns once ProvisioningRequests are served; says once that they are not.
    async fn wait_served(&self) {
        let mut said = false;
        loop {
            match self
                .client
                .list_api_group_resources("autoscaling.x-k8s.io/v1")
                .await
            {
                Ok(list)
                    if list
                        .resources
                        .iter()
                        .any(|r| r.name == "provisioningrequests") =>
                {
                    return;
                }
                outcome => {
                    if !said {
                        let why = outcome.err().map(|e| e.to_string()).unwrap_or_default();
                        tracing::info!(class = CLASS, %why,
                            "ProvisioningRequests (autoscaling.x-k8s.io/v1) are not served; \
                             the class stays idle until they are (Kueue and cluster-autoscaler \
                             install the CRD)");
                        said = true;
                    }
                }
            }
            tokio::time::sleep(self.cfg.discovery).await;
        }
    }

    /// Every `sweep`: expires bookings past their time, and releases the holds of requests the
    /// cache no longer has (deleted while the watch was down).
    async fn sweep(self: Arc<Self>, store: Store<ProvisioningRequest>) {
        if store.wait_until_ready().await.is_err() {
            return;
        }
        loop {
            for (key, uid) in self.holds.expired(Instant::now()) {
                self.expire(&store, &key, &uid).await;
            }
            for (key, uid, machine) in self.holds.machines() {
                if self.reconciler.held_lost(&machine.slot) {
                    self.revoke(&store, &key, &uid, &machine).await;
                }
            }
            for (key, uid) in self.holds.keys() {
                let live = cached(&store, &key).is_some_and(|r| r.uid().as_deref() == Some(&uid));
                if !live && self.holds.release_uid(&key, &uid) {
                    tracing::info!(request = %key, "released the budget held for a request that is gone");
                }
            }
            tokio::time::sleep(self.cfg.sweep).await;
        }
    }

    /// Sets `CapacityRevoked` on request `key`, whose held `machine` was lost before a Pod took
    /// it (a spot reclaim, or the machine cut off: its runner went silent), and releases it.
    async fn revoke(
        &self,
        store: &Store<ProvisioningRequest>,
        key: &str,
        uid: &str,
        machine: &neocloud_controller::holds::HeldMachine,
    ) {
        let Some(req) = cached(store, key).filter(|r| r.uid().as_deref() == Some(uid)) else {
            return;
        };
        let set = Set {
            type_: "CapacityRevoked",
            status: true,
            reason: "CapacityRevoked".into(),
            message: format!(
                "{} instance {} held for a pod was lost (its runner went silent: reclaimed or \
                 cut off) before a pod took it; it is released",
                machine.provider, machine.instance_id
            ),
        };
        let api = Api::namespaced(self.client.clone(), &req.namespace().unwrap_or_default());
        if let Err(e) = status::write(&api, &req, &[set], &BTreeMap::new()).await {
            // Tried again at the next sweep.
            tracing::warn!(request = %key, error = %e, "failed to set CapacityRevoked");
            return;
        }
        self.holds.remove_machine(key, &machine.slot);
        if let Err(e) = (self.reconciler)
            .delete_held_named(&machine.namespace, &machine.binding)
            .await
        {
            tracing::warn!(request = %key, machine = %machine.key(), error = %e, "failed to release a lost held machine; its request's end releases it");
        }
        tracing::info!(request = %key, machine = %machine.key(), "a held machine was lost: CapacityRevoked");
    }

    /// Sets `BookingExpired` on request `key` and releases its hold.
    async fn expire(&self, store: &Store<ProvisioningRequest>, key: &str, uid: &str) {
        let untaken = self.holds.untaken(key);
        if let Some(req) = cached(store, key).filter(|r| r.uid().as_deref() == Some(uid)) {
            let set = Set {
                type_: "BookingExpired",
                status: true,
                reason: "BookingExpired".into(),
                message: format!(
                    "{untaken} of the pods did not come within the booking; what was held for \
                     them (budget, or machines rented ahead) is released"
                ),
            };
            let api = Api::namespaced(self.client.clone(), &req.namespace().unwrap_or_default());
            if let Err(e) = status::write(&api, &req, &[set], &BTreeMap::new()).await {
                // Tried again at the next sweep.
                tracing::warn!(request = %key, error = %e, "failed to set BookingExpired");
                return;
            }
        }
        self.holds.release_uid(key, uid);
        tracing::info!(request = %key, untaken, "booking expired; its budget is released");
    }
}

fn cached(store: &Store<ProvisioningRequest>, key: &str) -> Option<Arc<ProvisioningRequest>> {
    let (ns, name) = key.split_once('/')?;
    store.get(&ObjectRef::new(name).within(ns))
}

fn release_deleted(holds: &Holds, req: &ProvisioningRequest) {
    let key = key(req);
    if holds.release_uid(&key, &req.uid().unwrap_or_default()) {
        tracing::info!(request = %key, "request deleted; its held budget is released");
    }
}

/// Whether the node has already answered this request (a new attempt is a new request).
fn decided(req: &ProvisioningRequest) -> bool {
    req.is_true("Provisioned") || restore::ended(req)
}

async fn reconcile(req: Arc<ProvisioningRequest>, p: Arc<Provisioner>) -> Result<Action, Error> {
    if req.spec.provisioning_class_name != CLASS {
        return Ok(Action::await_change());
    }
    // Another node's request: not this node's to answer, hold or release.
    let node = p.reconciler.node_name();
    if super::params::node_name(&req.spec.parameters).is_some_and(|n| n != node) {
        return Ok(Action::await_change());
    }
    if req.metadata.deletion_timestamp.is_some() {
        release_deleted(&p.holds, &req);
        return Ok(Action::await_change());
    }
    let key = key(&req);
    let uid = req.uid().unwrap_or_default();
    let held = p.holds.keys().contains(&(key.clone(), uid.clone()));
    // Decided already (by this leader or an earlier one, whose hold this one takes up), or held
    // by a decision whose status this cache has not seen yet.
    if decided(&req) {
        if !held {
            p.restore(&req).await?;
        }
        return Ok(Action::await_change());
    }
    if held {
        return Ok(Action::await_change());
    }
    let outcome = p.decide(&req).await?;
    let (sets, details) = answer(&req, &outcome, p.reconciler.node_name());
    let api = Api::namespaced(p.client.clone(), &req.namespace().unwrap_or_default());
    if let Err(e) = status::write(&api, &req, &sets, &details).await {
        // Nothing is held for an answer nobody saw.
        p.holds.release_uid(&key, &uid);
        return Err(e.into());
    }
    match &outcome {
        Outcome::Held { place, .. } => tracing::info!(request = %key, place = %place.describe(),
            usd_per_hour = place.usd_per_hour(), "budget held for a provisioning request"),
        Outcome::Checked { place } => tracing::info!(request = %key, place = %place.describe(),
            "capacity checked for a provisioning request"),
        Outcome::Failed { reason, message } => tracing::info!(request = %key, %reason, %message,
            "provisioning request refused"),
    }
    Ok(Action::await_change())
}

/// The conditions and class details that say `outcome`.
fn answer(
    req: &ProvisioningRequest,
    outcome: &Outcome,
    node: &str,
) -> (Vec<Set>, BTreeMap<String, String>) {
    let accepted = Set {
        type_: "Accepted",
        status: true,
        reason: "Accepted".into(),
        message: format!("class {CLASS} of node {node}"),
    };
    let set = |type_, status, reason: &str, message: String| Set {
        type_,
        status,
        reason: reason.to_owned(),
        message,
    };
    match outcome {
        Outcome::Held {
            place,
            until,
            machines,
        } => {
            let message = if *machines > 0 {
                format!(
                    "{machines} machines rented and held for the pods on {} until {}; each pod \
                     takes one",
                    place.describe(),
                    restore::instant(until)
                )
            } else {
                format!(
                    "budget of ${:.4}/h held for {} pods on {} until {}; the machines are \
                     rented when the pods arrive",
                    place.usd_per_hour(),
                    place.picks.len(),
                    place.describe(),
                    restore::instant(until)
                )
            };
            let mut details = BTreeMap::from([
                ("RequestKey".to_owned(), req.uid().unwrap_or_default()),
                ("NodeName".to_owned(), node.to_owned()),
                ("Provider".to_owned(), place.provider.as_str().to_owned()),
                ("Region".to_owned(), place.region.clone()),
                (restore::BOOKED_UNTIL.to_owned(), restore::instant(until)),
                (
                    restore::POD_USD_PER_HOUR.to_owned(),
                    restore::prices(place.picks.iter().map(|p| p.usd_per_hour)),
                ),
            ]);
            details.retain(|_, v| !v.is_empty());
            let reason = if *machines > 0 {
                "Rented"
            } else {
                "BudgetHeld"
            };
            let provisioned = set("Provisioned", true, reason, message);
            (vec![accepted, provisioned], details)
        }
        Outcome::Checked { place } => {
            let message = format!(
                "capacity check only, nothing held: {} pods fit on {} at ${:.4}/h within the budget",
                place.picks.len(),
                place.describe(),
                place.usd_per_hour()
            );
            let provisioned = set("Provisioned", true, "CapacityAvailable", message);
            (vec![accepted, provisioned], BTreeMap::new())
        }
        Outcome::Failed { reason, message } => {
            let no = set("Provisioned", false, reason, message.clone());
            let failed = set("Failed", true, reason, message.clone());
            (vec![accepted, no, failed], BTreeMap::new())
        }
    }
}

// The signature is the one `Controller::run` takes.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(req: Arc<ProvisioningRequest>, e: &Error, _: Arc<Provisioner>) -> Action {
    tracing::warn!(request = %key(&req), error = %e, "provisioning request reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}
