//! The reconciler: Pods bound to the virtual node become rentals, and rentals are mirrored back
//! into Pods.
//!
//! Two controllers share one [`Reconciler`]:
//! - the Pod controller watches Pods with `spec.nodeName=<node>`: it translates each into a
//!   workload, creates its `CloudPodBinding` (owned by the Pod, with a finalizer) before anything
//!   is rented, plans and rents through the broker with every attempt written to the binding
//!   before the provider is called, mirrors the instance into the binding and the Pod, and on
//!   graceful deletion releases the instance, waits until the provider confirms it gone,
//!   finalizes the binding and removes the Pod;
//! - the binding controller watches this node's bindings and releases those whose Pod is gone
//!   (force deletion) or is another Pod of the same name.
//!
//! Recovery needs no separate pass: after a restart both controllers see every object again,
//! and a binding with attempts but no instance is first looked up by its external name on every
//! provider it attempted, so an instance rented just before a crash is adopted, never rented
//! twice.

mod attempts;
mod bindings;
mod egress;
mod endings;
mod env;
mod files;
mod gangs;
mod held;
mod mirror;
mod objects;
mod placing;
pub(crate) mod pod_status;
mod pods;
mod probes;
mod pull_secrets;
mod rebuild;
mod receipts;
mod recorder;
mod relays;
mod release;
mod rented;
mod rerent;
mod runner_workload;
mod runners;
mod spend;
#[cfg(test)]
mod stale_tests;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use neocloud_broker::{Planner, Renter};
use neocloud_policy::cel::CelEngine;

use crate::naming::ClusterId;
use neocloud_api::CloudPodBinding;
use neocloud_burst_policy::PolicyRegistry;
use neocloud_telemetry::metrics::Metrics;

pub use attempts::class_reason;
pub use held::{Held, HeldFor, held_name};
pub use pod_status::{Container, DesiredPod};
pub use rebuild::{Rebuilt, rebuild_budget};
pub use relays::{RELAY_LABEL, Relays, relay_name, tcp_ports};
pub use runner_workload::{RUNNER_ANNOTATION, container_runner};
pub use runners::{RunnerStatus, Runners};

/// The label every binding carries with the name of the node that owns it.
pub const NODE_LABEL: &str = "cloud.aibrix.ai/node";

/// The finalizer that keeps a binding until its instance is confirmed gone.
pub const FINALIZER: &str = "cloud.aibrix.ai/instance";

/// How the reconciler behaves.
#[derive(Debug, Clone)]
pub struct ReconcilerConfig {
    /// The virtual node's name.
    pub node_name: String,
    /// The cluster identity in every external name.
    pub cluster: ClusterId,
    /// The node's address, reported as the Pods' `hostIP`.
    pub host_ip: String,
    /// Pods reconciled at once.
    pub concurrency: u16,
    /// How often a starting instance is polled.
    pub poll_interval: Duration,
    /// How often a running instance is polled (to notice it stopped, failed or was lost).
    /// Kept apart from `poll_interval` so that many running Pods do not crowd out new ones.
    pub running_poll_interval: Duration,
    /// How long a Pod with no offer (or over the budget) waits before planning again.
    pub retry_interval: Duration,
    /// How often a release is checked until the provider confirms the instance gone.
    pub release_poll: Duration,
    /// The VM runner for providers that rent bare VMs; without it their instances count as
    /// running when the VM is.
    pub runners: Option<Arc<Runners>>,
    /// The namespaces whose Pods are served; `None`: every one.
    pub watch_namespaces: Option<Vec<String>>,
    /// The Pod label whose value `neocloud_spend_usd_total`'s `team` label carries.
    pub team_label: Option<String>,
    /// How long a deleted Pod's `CloudPodReceipt` is kept; `None`: no receipts are written.
    pub receipt_retention: Option<Duration>,
    /// The relays that give burst Pods a cluster address; `None`: Pods report their
    /// instance's public IP.
    pub relays: Option<Arc<Relays>>,
    /// The budget held for admitted ProvisioningRequests, which their Pods take; `None`: the
    /// node serves no ProvisioningRequest class.
    pub holds: Option<Arc<crate::holds::Holds>>,
    /// The gangs of the node's Pods and the budget held for them (see `gangs`).
    pub gangs: Arc<crate::holds::gangs::Gangs>,
}

impl ReconcilerConfig {
    /// Defaults for a node named `node_name` in cluster `cluster`.
    pub fn new(node_name: impl Into<String>, cluster: ClusterId) -> Self {
        ReconcilerConfig {
            node_name: node_name.into(),
            cluster,
            host_ip: "127.0.0.1".to_owned(),
            concurrency: 16,
            poll_interval: Duration::from_secs(2),
            running_poll_interval: Duration::from_secs(30),
            retry_interval: Duration::from_secs(30),
            release_poll: Duration::from_secs(2),
            runners: None,
            watch_namespaces: None,
            team_label: None,
            receipt_retention: Some(Duration::from_secs(30 * 86_400)),
            relays: None,
            holds: None,
            gangs: crate::holds::gangs::Gangs::new(),
        }
    }
}

/// What both controllers share.
pub struct Reconciler {
    client: Client,
    cfg: ReconcilerConfig,
    planner: Planner,
    renter: Renter,
    cel: Arc<CelEngine>,
    events: crate::runtime::events::Publisher,
    metrics: Arc<Metrics>,
    policies: Option<Arc<PolicyRegistry>>,
    caches: std::sync::OnceLock<Caches>,
    /// Reconciles running at once, granted first come, first served (see [`turns`]).
    turns: Arc<crate::runtime::turns::Turns>,
    translations: Translations,
}

/// An event still to publish about a Pod: its reason and note.
type Said = (&'static str, String);

/// What a Pod translates to.
type Translated = Result<(neocloud_core::WorkloadSpec, Planner), String>;

/// Each live Pod's translation and compiled expressions, by UID, with the fingerprint of what
/// they were made from (the Pod's generation, which changes with its spec, and its
/// annotations, which hold the expressions and do not change the generation).
#[derive(Default)]
struct Translations(parking_lot::Mutex<std::collections::HashMap<String, (u64, Translated)>>);

impl Translations {
    fn get(&self, uid: &str, print: u64) -> Option<Translated> {
        let map = self.0.lock();
        map.get(uid)
            .filter(|(p, _)| *p == print)
            .map(|(_, t)| t.clone())
    }

    fn put(&self, uid: String, print: u64, t: Translated) {
        self.0.lock().insert(uid, (print, t));
    }

    fn forget(&self, uid: &str) {
        self.0.lock().remove(uid);
    }
}

/// The fingerprint [`Translations`] keys a Pod's translation by.
fn fingerprint(pod: &Pod) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pod.metadata.generation.hash(&mut h);
    pod.metadata.annotations.hash(&mut h);
    h.finish()
}

/// The controllers' caches of the node's Pods and bindings, for readers that must not list
/// (a list of 1,000 Pods is megabytes per call).
#[derive(Clone)]
pub struct Caches {
    /// Pods bound to the node, without `managedFields`.
    pub pods: reflector::Store<Pod>,
    /// The node's bindings, without `managedFields`.
    pub bindings: reflector::Store<CloudPodBinding>,
    /// The relay Pods of the node's burst Pods, when it makes relays.
    pub relays: Option<reflector::Store<Pod>>,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("pods", &self.pods.len())
            .field("bindings", &self.bindings.len())
            .field("relays", &self.relays.as_ref().map(reflector::Store::len))
            .finish()
    }
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A reconcile that could not finish; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// A provider call failed.
    #[error(transparent)]
    Provider(#[from] neocloud_providers::ProviderError),
    /// The object lacks a field the reconciler needs.
    #[error("{0}")]
    Invalid(String),
}

impl Reconciler {
    /// A reconciler renting through `renter` with `planner`'s policies; `cel` compiles the
    /// Pods' constraint and rank expressions; `policies` resolves the `BurstPolicy` a Pod names
    /// (without a registry such a Pod waits with `PolicyNotLoaded`); rentals and errors are
    /// counted in `metrics`.
    pub fn new(
        client: Client,
        cfg: ReconcilerConfig,
        planner: Planner,
        renter: Renter,
        cel: Arc<CelEngine>,
        metrics: Arc<Metrics>,
        policies: Option<Arc<PolicyRegistry>>,
    ) -> Arc<Reconciler> {
        let events = crate::runtime::events::Publisher::new(
            client.clone(),
            neocloud_api::FIELD_MANAGER,
            &cfg.node_name,
        );
        let cfg_concurrency = cfg.concurrency;
        Arc::new(Reconciler {
            client,
            cfg,
            planner,
            renter,
            cel,
            events,
            metrics,
            policies,
            caches: std::sync::OnceLock::new(),
            turns: crate::runtime::turns::Turns::new(usize::from(cfg_concurrency)),
            translations: Translations::default(),
        })
    }

    /// The controllers' caches, once [`Reconciler::run`] has started them.
    pub fn caches(&self) -> Option<&Caches> {
        self.caches.get()
    }

    /// The provider `id` the node rents from, if it is enabled.
    pub fn provider(
        &self,
        id: neocloud_core::ProviderId,
    ) -> Option<Arc<dyn neocloud_providers::Provider>> {
        self.renter.catalog.provider(id)
    }

    /// The runner's side, when the node runs one.
    pub fn runners(&self) -> Option<&Arc<Runners>> {
        self.cfg.runners.as_ref()
    }

    /// Runs the Pod and binding controllers until both streams end (they run until the task is
    /// dropped). `synced` is sent once both caches have listed everything, which is when the
    /// sweeper may start.
    pub async fn run(self: Arc<Self>, synced: Option<tokio::sync::oneshot::Sender<()>>) {
        self.rebuild().await;
        let node = &self.cfg.node_name;
        let pods: Api<Pod> = Api::all(self.client.clone());
        let bindings: Api<CloudPodBinding> = Api::all(self.client.clone());
        let on_node = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let ours = watcher::Config::default().labels(&format!("{NODE_LABEL}={node}"));
        // The controllers' own limit is off: when more reconciles are due than it allows, kube's
        // runner parks the rest in a hash set and takes from it in hash order, so under a
        // sustained load (many Pods retrying OverBudget) the same Pods win every turn and others
        // are never reconciled. Each reconcile takes one of `concurrency` turns instead, first
        // come, first served: a Pod without one waits in line outside the controller and is
        // triggered when its turn comes (see `turns`).
        let config = ControllerConfig::default();
        // The caches keep every Pod and binding of the node: what the reconciler never reads
        // is dropped before caching (see `slim`; for bindings, their managedFields).
        let (pod_reader, pod_writer) = reflector::store();
        let pod_stream = watcher::watcher(pods, on_node)
            .default_backoff()
            .modify(crate::runtime::slim::slim_pod)
            .reflect(pod_writer)
            .touched_objects();
        // One watch of the bindings serves both controllers: the binding controller reads it,
        // and hands the Pod controller the bindings that are gone or going (see `binding_gone`).
        let (gone_tx, gone_rx) = futures::channel::mpsc::unbounded();
        let gone = gone_rx.map(Ok::<CloudPodBinding, watcher::Error>);
        let mut pod_controller = Controller::for_stream(pod_stream, pod_reader)
            .owns_stream(gone)
            .with_config(config.clone());
        // Besides its watches, the Pod controller has one source of triggers: a Pod whose turn
        // came (see `turns`) and a Pod whose runner reported (see `runners`) are sent there.
        let (trigger, triggered) = tokio::sync::mpsc::unbounded_channel();
        if let Some(runners) = &self.cfg.runners {
            runners.connect(trigger.clone());
        }
        self.turns.connect(trigger, pod_controller.store());
        let triggered = futures::stream::unfold(triggered, |mut rx| async move {
            rx.recv().await.map(|pod| (pod, rx))
        });
        pod_controller = pod_controller.reconcile_on(triggered);
        let (binding_reader, binding_writer) = reflector::store();
        let binding_stream = watcher::watcher(bindings, ours)
            .default_backoff()
            .modify(|b: &mut CloudPodBinding| b.managed_fields_mut().clear())
            .inspect_ok(move |event| {
                if let Some(b) = binding_gone(event) {
                    // The receiver lives as long as the Pod controller, which runs beside this.
                    let _ = gone_tx.unbounded_send(b.clone());
                }
            })
            .reflect(binding_writer)
            .touched_objects();
        let binding_controller =
            Controller::for_stream(binding_stream, binding_reader).with_config(config);
        // A relay Pod's change (its IP, its readiness, its loss) reconciles its burst Pod, its
        // owner.
        let mut relay_store = None;
        if self.cfg.relays.is_some() {
            let (relay_reader, relay_writer) = reflector::store();
            let relays = watcher::Config::default().labels(relays::RELAY_LABEL);
            // Only their status and owner are read.
            let relay_stream = watcher::watcher(Api::all(self.client.clone()), relays)
                .default_backoff()
                .modify(|p: &mut Pod| {
                    p.metadata.managed_fields = None;
                    p.spec = None;
                })
                .reflect(relay_writer)
                .touched_objects();
            pod_controller = pod_controller.owns_stream(relay_stream);
            relay_store = Some(relay_reader);
        }
        let (pod_store, binding_store) = (pod_controller.store(), binding_controller.store());
        let _ = self.caches.set(Caches {
            pods: pod_store.clone(),
            bindings: binding_store.clone(),
            relays: relay_store,
        });
        let ready = async move {
            let (a, b) = tokio::join!(
                pod_store.wait_until_ready(),
                binding_store.wait_until_ready()
            );
            if a.is_ok()
                && b.is_ok()
                && let Some(tx) = synced
            {
                let _ = tx.send(());
            }
        };
        let pods = pod_controller
            .run(pods::reconcile, error_policy, Arc::clone(&self))
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "pod reconcile");
                }
            });
        let bindings = binding_controller
            .run(bindings::reconcile, error_policy, Arc::clone(&self))
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "binding reconcile");
                }
            });
        tokio::join!(ready, pods, bindings);
    }

    /// Counts the bindings' instances and rentals in flight into the budget and the ledger
    /// (see [`rebuild_budget`]), retrying until the API server answers: no controller starts,
    /// so nothing is rented, before the budget knows what is already spent.
    async fn rebuild(&self) {
        let mut delay = Duration::from_millis(200);
        loop {
            match rebuild_budget(&self.client, &self.cfg.node_name, &self.renter).await {
                Ok(r) => {
                    tracing::info!(
                        running = r.running,
                        in_flight = r.in_flight,
                        usd_per_hour = r.usd_per_hour,
                        "budget rebuilt from the bindings"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "failed to list the bindings to rebuild the budget; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// The binding `ns/name` as the binding cache has it, or from the API server before the
    /// caches run. A cached binding may be behind the API server: every status write from it is
    /// guarded by its resourceVersion (see `recorder::write_status`), so a stale one ends in a
    /// conflict and a new reconcile, and renting starts only after such a write.
    pub(super) async fn binding(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<CloudPodBinding>, Error> {
        if let Some(c) = self.caches() {
            let key = reflector::ObjectRef::new(name).within(ns);
            return Ok(c.bindings.get(&key).map(|b| (*b).clone()));
        }
        let api: Api<CloudPodBinding> = Api::namespaced(self.client.clone(), ns);
        Ok(api.get_opt(name).await?)
    }

    /// Whether the Pod `ns/name` with `uid` lives and is not being deleted, as the Pod cache has
    /// it (the watch that fills it is what tells the reconciler a Pod is going away), or from
    /// the API server before the caches run.
    pub(super) async fn pod_lives(&self, ns: &str, name: &str, uid: &str) -> Result<bool, Error> {
        let lives = |p: &Pod| {
            p.metadata.deletion_timestamp.is_none() && p.metadata.uid.as_deref() == Some(uid)
        };
        if let Some(c) = self.caches() {
            let key = reflector::ObjectRef::new(name).within(ns);
            return Ok(c.pods.get(&key).is_some_and(|p| lives(&p)));
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        Ok(api.get_opt(name).await?.is_some_and(|p| lives(&p)))
    }

    /// Publishes an event on `obj`; a failure is logged, never fatal.
    async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let note = truncate(note, 1000);
        if let Err(e) = self
            .events
            .publish(&obj.object_ref(&()), warning, reason, &note)
            .await
        {
            tracing::warn!(reason, error = %e, "failed to publish an event");
        }
    }
}

/// What of the node's bindings gives their Pod something to do: a binding deleted, or being
/// deleted. Status writes (most of them the reconciler's own, each followed by the requeue it
/// asked for) and the initial list (every Pod is listed too) trigger nothing.
fn binding_gone(event: &watcher::Event<CloudPodBinding>) -> Option<&CloudPodBinding> {
    match event {
        watcher::Event::Delete(b) => Some(b),
        watcher::Event::Apply(b) if b.metadata.deletion_timestamp.is_some() => Some(b),
        _ => None,
    }
}

// The signature is the one `Controller::run` takes.
#[allow(clippy::needless_pass_by_value)]
fn error_policy<K>(_: Arc<K>, e: &Error, r: Arc<Reconciler>) -> Action {
    if is_conflict(e) {
        // A write from a binding read before another change (a cache behind the API server):
        // nothing was decided on it; read again soon.
        tracing::debug!(error = %e, "stale binding; reconciling again");
        r.metrics.record_reconcile_error("conflict");
        return Action::requeue(jittered(Duration::from_millis(200)));
    }
    tracing::warn!(error = %e, "reconcile failed; retrying");
    r.metrics.record_reconcile_error(match e {
        Error::Kube(_) => "kubernetes",
        Error::Provider(p) => p.metric_label(),
        Error::Invalid(_) => "invalid",
    });
    // A provider's 429 or repeated 5xx backs that provider off for every Pod (its Retry-After,
    // or a capped exponential delay); anything else is retried after about 2 s. Jitter keeps
    // the Pods that failed together from coming back together.
    let wait = match e {
        Error::Provider(p) => r
            .renter
            .catalog
            .backoff()
            .failed(p.provider, p.class, p.retry_after),
        _ => None,
    };
    Action::requeue(jittered(wait.unwrap_or(Duration::from_secs(2))))
}

/// Whether the API server refused a write as based on an old resourceVersion.
fn is_conflict(e: &Error) -> bool {
    matches!(e, Error::Kube(kube::Error::Api(s)) if s.code == 409)
}

/// `d` within plus or minus 20%, at least 100 ms.
fn jittered(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.8..=1.2))
        .max(Duration::from_millis(100))
}

/// At most `max` bytes, cut at a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}
