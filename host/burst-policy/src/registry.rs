//! The registry: loaded policies by name, kept current by a watch on BurstPolicy, and resolved
//! into planners for one Pod at a time.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use neocloud_broker::PricingPolicy;
use neocloud_broker::{CelFilter, CelRanker, FallbackPolicy, OfferFilter, OfferRanker, Planner};
use neocloud_core::WorkloadSpec;
use neocloud_policy::cel::CelEngine;
use neocloud_policy::wasm::{Role, WasmEngine, WasmPolicy};
use tracing::Instrument;

use super::cel::Governed;
use super::load::{self, Body, LoadedPolicy};
use super::status;
use super::wasm::{ExcludingPricing, Exclusions, WasmFallback, WasmPricing, WasmRanker};
use neocloud_api::BurstPolicy;
use neocloud_telemetry::metrics::{
    InstrumentedFallback, InstrumentedFilter, InstrumentedPricing, InstrumentedRanker, Metrics,
};

/// A policy's pieces for one Pod.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The base planner with the policy's filter, ranker and pricing in place of the base ones.
    pub planner: Planner,
    /// The policy's fallback, or the base one if it has none.
    pub fallback: Arc<dyn FallbackPolicy>,
    /// `sha256:<hex>` of what was loaded (the component, or the CEL rules as JSON).
    pub digest: String,
}

/// Why a Pod's policy cannot be used now. Every case is transient: creating, fixing or loading the
/// BurstPolicy makes it resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyUnavailable {
    /// No BurstPolicy of that name has been seen.
    #[error("BurstPolicy {name} does not exist")]
    Missing { name: String },
    /// The BurstPolicy exists and its first generation is being loaded (compiling a large
    /// component takes seconds).
    #[error("BurstPolicy {name} is being loaded")]
    Loading { name: String },
    /// The current generation failed to load.
    #[error("BurstPolicy {name} failed to load: {error}")]
    NotLoaded { name: String, error: String },
}

impl PolicyUnavailable {
    /// The Pod's waiting reason.
    pub fn reason(&self) -> &'static str {
        "PolicyNotLoaded"
    }

    /// A short metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Missing { .. } => "policy-missing",
            Self::Loading { .. } => "policy-loading",
            Self::NotLoaded { .. } => "policy-not-loaded",
        }
    }

    /// Always true: the policy may appear or be fixed.
    pub fn is_transient(&self) -> bool {
        true
    }
}

/// One policy's state for the generation last seen.
#[derive(Debug, Clone)]
enum Entry {
    Loaded {
        uid: Option<String>,
        generation: Option<i64>,
        policy: Arc<LoadedPolicy>,
    },
    Failed {
        uid: Option<String>,
        generation: Option<i64>,
        errors: Vec<neocloud_api::PolicyError>,
        /// The policy to load again, when the failure may pass unchanged (its registry was
        /// unreachable).
        retry: Option<Arc<BurstPolicy>>,
    },
}

/// How often policies whose failure may pass (an unreachable registry) are loaded again.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

impl Entry {
    fn is_for(&self, bp: &BurstPolicy) -> bool {
        let (uid, generation) = match self {
            Entry::Loaded {
                uid, generation, ..
            }
            | Entry::Failed {
                uid, generation, ..
            } => (uid, generation),
        };
        *uid == bp.metadata.uid && *generation == bp.metadata.generation
    }
}

/// Every BurstPolicy the node has seen, loaded or not. Share it with `Arc`.
pub struct PolicyRegistry {
    client: kube::Client,
    cel: Arc<CelEngine>,
    wasm: WasmEngine,
    /// The directory `spec.wasm.path` files must be in.
    wasm_dir: PathBuf,
    metrics: Arc<Metrics>,
    entries: RwLock<HashMap<String, Entry>>,
    /// Policies seen and being loaded for the first time (not yet in `entries`).
    loading: std::sync::Mutex<HashSet<String>>,
}

impl std::fmt::Debug for PolicyRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.read().keys().cloned().collect();
        f.debug_struct("PolicyRegistry")
            .field("policies", &names)
            .finish_non_exhaustive()
    }
}

impl PolicyRegistry {
    /// An empty registry; [`PolicyRegistry::run`] fills it.
    pub fn new(
        client: kube::Client,
        cel: Arc<CelEngine>,
        wasm: WasmEngine,
        wasm_dir: PathBuf,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            cel,
            wasm,
            wasm_dir,
            metrics,
            entries: RwLock::default(),
            loading: std::sync::Mutex::default(),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Entry>> {
        self.entries.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Entry>> {
        self.entries.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches every BurstPolicy until the task is dropped: loads each new generation, writes
    /// its status, and forgets deleted policies. Watch errors are logged and retried with
    /// backoff. Policies are loaded one at a time.
    pub async fn run(self: Arc<Self>) {
        let api: Api<BurstPolicy> = Api::all(self.client.clone());
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut relisted: Option<HashSet<String>> = None;
        let mut retry = tokio::time::interval(RETRY_EVERY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                _ = retry.tick() => {
                    self.retry_transient().await;
                    continue;
                }
            };
            let Some(event) = event else { break };
            match event {
                Ok(watcher::Event::Apply(bp)) => self.apply(&bp, false).await,
                Ok(watcher::Event::InitApply(bp)) => {
                    relisted.get_or_insert_default().insert(bp.name_any());
                    self.apply(&bp, false).await;
                }
                Ok(watcher::Event::Delete(bp)) => {
                    self.write().remove(&bp.name_any());
                }
                Ok(watcher::Event::Init) => relisted = Some(HashSet::new()),
                Ok(watcher::Event::InitDone) => {
                    let seen = relisted.take().unwrap_or_default();
                    self.write().retain(|name, _| seen.contains(name));
                }
                Err(error) => tracing::warn!(%error, "watching BurstPolicy objects failed"),
            }
        }
    }

    /// Loads again each policy whose last failure may pass unchanged.
    async fn retry_transient(&self) {
        let due: Vec<Arc<BurstPolicy>> = self
            .read()
            .values()
            .filter_map(|entry| match entry {
                Entry::Failed {
                    retry: Some(bp), ..
                } => Some(Arc::clone(bp)),
                _ => None,
            })
            .collect();
        for bp in due {
            tracing::info!(policy = %bp.name_any(), "loading a policy again after a failure that may have passed");
            self.apply(&bp, true).await;
        }
    }

    /// Loads `bp` unless its generation is already loaded (or already failed, unless `again`),
    /// then writes its status.
    async fn apply(&self, bp: &BurstPolicy, again: bool) {
        let name = bp.name_any();
        let known = self
            .read()
            .get(&name)
            .filter(|e| e.is_for(bp) && !again)
            .cloned();
        let entry = match known {
            Some(entry) => entry,
            None => {
                let span = tracing::info_span!("load_policy", policy = %name, generation = ?bp.metadata.generation);
                self.loading(&name, true);
                let entry = self.load(bp, span).await;
                self.write().insert(name.clone(), entry.clone());
                self.loading(&name, false);
                entry
            }
        };
        let desired = match &entry {
            Entry::Loaded { policy, .. } => status::status_for(bp, Ok(policy)),
            Entry::Failed { errors, .. } => status::status_for(bp, Err(errors)),
        };
        match status::write(&self.client, bp, &desired).await {
            Err(error) => {
                tracing::warn!(policy = %name, %error, "failed to write BurstPolicy status")
            }
            // A policy kept to load again keeps the status just written, so the next failure
            // of the same kind writes nothing and keeps its transition time.
            Ok(()) => {
                if let Some(Entry::Failed {
                    retry: Some(kept), ..
                }) = self.write().get_mut(&name).filter(|e| e.is_for(bp))
                {
                    let mut seen = bp.clone();
                    seen.status = Some(desired);
                    *kept = Arc::new(seen);
                }
            }
        }
    }

    /// Marks `name` as being loaded (or no longer).
    fn loading(&self, name: &str, now: bool) {
        let mut loading = self.loading.lock().unwrap_or_else(|p| p.into_inner());
        if now {
            loading.insert(name.to_owned());
        } else {
            loading.remove(name);
        }
    }

    async fn load(&self, bp: &BurstPolicy, span: tracing::Span) -> Entry {
        let (uid, generation) = (bp.metadata.uid.clone(), bp.metadata.generation);
        let loaded = load::load(&self.client, &self.cel, &self.wasm, &self.wasm_dir, bp)
            .instrument(span.clone())
            .await;
        let _entered = span.enter();
        match loaded {
            Ok(policy) => {
                tracing::info!(digest = %policy.digest, "policy loaded");
                Entry::Loaded {
                    uid,
                    generation,
                    policy: Arc::new(policy),
                }
            }
            Err(failure) => {
                let (errors, transient) = (failure.errors, failure.transient);
                tracing::warn!(?errors, transient, "policy failed to load");
                Entry::Failed {
                    uid,
                    generation,
                    errors,
                    retry: transient.then(|| Arc::new(bp.clone())),
                }
            }
        }
    }

    /// The digest of policy `name` as loaded now, if it is.
    pub fn digest(&self, name: &str) -> Option<String> {
        match self.read().get(name) {
            Some(Entry::Loaded { policy, .. }) => Some(policy.digest.clone()),
            _ => None,
        }
    }

    /// Policy `name`'s `spec.maxReplacements`, if it is loaded and sets one.
    pub fn max_replacements(&self, name: &str) -> Option<u32> {
        match self.read().get(name) {
            Some(Entry::Loaded { policy, .. }) => policy.max_replacements,
            _ => None,
        }
    }

    /// The egress limits of every loaded policy that governs Pods in `namespace`, by policy
    /// name. A policy that failed to load limits nothing until it loads (its status says why).
    pub fn egress_limits(&self, namespace: &str) -> Vec<(String, super::EgressLimit)> {
        let entries = self.read();
        let loaded = entries.iter().filter_map(|(name, entry)| match entry {
            Entry::Loaded { policy, .. } => Some((name, policy.egress.as_ref()?)),
            Entry::Failed { .. } => None,
        });
        loaded
            .filter(|(_, limit)| limit.governs(namespace))
            .map(|(name, limit)| (name.clone(), limit.clone()))
            .collect()
    }

    /// The planner and fallback for one Pod under policy `name`: the policy's filter, ranker,
    /// pricing and fallback (each present piece wrapped in the metrics wrappers under the
    /// policy's name) in place of `base`'s and `fallback`, everything else from `base`.
    pub fn resolve(
        &self,
        name: &str,
        base: &Planner,
        fallback: &Arc<dyn FallbackPolicy>,
        w: &WorkloadSpec,
    ) -> Result<Resolved, PolicyUnavailable> {
        let policy = match self.read().get(name) {
            None => {
                let name = name.to_owned();
                let loading = self.loading.lock().unwrap_or_else(|p| p.into_inner());
                return Err(if loading.contains(&name) {
                    PolicyUnavailable::Loading { name }
                } else {
                    PolicyUnavailable::Missing { name }
                });
            }
            Some(Entry::Failed { errors, .. }) => {
                let error = errors
                    .first()
                    .map(|e| format!("{}: {}", e.field, e.message))
                    .unwrap_or_else(|| "unknown error".to_owned());
                return Err(PolicyUnavailable::NotLoaded {
                    name: name.to_owned(),
                    error,
                });
            }
            Some(Entry::Loaded { policy, .. }) => Arc::clone(policy),
        };
        let mut resolved = Resolved {
            planner: base.clone(),
            fallback: Arc::clone(fallback),
            digest: policy.digest.clone(),
        };
        match &policy.body {
            Body::Cel { constraint, rank } => {
                self.with_cel(&mut resolved, name, &policy, constraint, rank, w)
            }
            Body::Wasm(wasm) => self.with_wasm(&mut resolved, name, wasm),
        }
        Ok(resolved)
    }

    fn with_cel(
        &self,
        r: &mut Resolved,
        name: &str,
        policy: &LoadedPolicy,
        constraint: &Option<Arc<neocloud_policy::cel::CompiledConstraint>>,
        rank: &Option<Arc<neocloud_policy::cel::CompiledRank>>,
        w: &WorkloadSpec,
    ) {
        let (failure, mode) = (policy.failure, policy.mode);
        if let Some(expr) = constraint {
            let cel: Arc<dyn OfferFilter> = Arc::new(CelFilter::new(Arc::clone(expr), w));
            let governed = Governed::new(cel, Arc::clone(&r.planner.filter), name, failure, mode);
            r.planner.filter = Arc::new(InstrumentedFilter::new(
                Arc::new(governed),
                name,
                Arc::clone(&self.metrics),
            ));
        }
        if let Some(expr) = rank {
            let cel: Arc<dyn OfferRanker> = Arc::new(CelRanker::new(Arc::clone(expr), w));
            let governed = Governed::new(cel, Arc::clone(&r.planner.ranker), name, failure, mode);
            r.planner.ranker = Arc::new(InstrumentedRanker::new(
                Arc::new(governed),
                name,
                Arc::clone(&self.metrics),
            ));
        }
    }

    fn with_wasm(&self, r: &mut Resolved, name: &str, wasm: &WasmPolicy) {
        let roles = &wasm.info().roles;
        let metrics = || Arc::clone(&self.metrics);
        if roles.contains(&Role::Pricing) {
            let pricing = WasmPricing::new(wasm.clone(), Arc::clone(&r.planner.pricing));
            r.planner.pricing =
                Arc::new(InstrumentedPricing::new(Arc::new(pricing), name, metrics()));
        }
        if roles.contains(&Role::Placement) {
            let exclusions = Exclusions::default();
            let ranker = WasmRanker::new(
                wasm.clone(),
                Arc::clone(&r.planner.ranker),
                exclusions.clone(),
            );
            r.planner.ranker = Arc::new(InstrumentedRanker::new(Arc::new(ranker), name, metrics()));
            let pricing: Arc<dyn PricingPolicy> = Arc::new(ExcludingPricing::new(
                Arc::clone(&r.planner.pricing),
                exclusions,
                name,
            ));
            r.planner.pricing = pricing;
        }
        if roles.contains(&Role::Fallback) {
            let fallback = WasmFallback::new(wasm.clone(), Arc::clone(&r.fallback));
            r.fallback = Arc::new(InstrumentedFallback::new(
                Arc::new(fallback),
                name,
                metrics(),
            ));
        }
    }
}
