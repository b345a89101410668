//! A loaded Wasm policy: its `InstancePre`, the roles it exports, and one method per role that
//! runs a decision in a fresh store, validates the answer and applies failurePolicy and mode.
//!
//! Not for compiling or caching (see [`super::engine`]); not for building WIT values from domain
//! types (callers build the generated input records).

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{Component, InstancePre};

use super::bindings::guests::{FallbackIndices, PlacementIndices, PricingIndices};
use super::bindings::{FallbackAction, FallbackInput, PlacementDecision, PlacementInput};
use super::bindings::{PolicyError, PriceDecision, PricingInput};
use super::call::{self, CallSite};
use super::config::PolicySettings;
use super::engine::WasmEngine;
use super::error::{Role, WasmError};
use super::host::{DecisionLog, HostState};
use super::info::PolicyInfo;
use super::source::Loaded;
use super::verdict::{Evaluation, Verdict};
use super::{link, validate};

/// A policy ready to decide. Cheap to clone; safe to call from many threads at once (each call
/// gets its own store and instance).
#[derive(Clone, Debug)]
pub struct WasmPolicy {
    inner: Arc<Inner>,
}

struct Inner {
    engine: WasmEngine,
    pre: InstancePre<HostState>,
    info: PolicyInfo,
    settings: PolicySettings,
    placement: Option<PlacementIndices>,
    fallback: Option<FallbackIndices>,
    pricing: Option<PricingIndices>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmPolicy")
            .field("info", &self.info)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

type GuestResult<T> = wasmtime::Result<Result<T, PolicyError>>;

/// The deadline of the check a policy passes when it is loaded (one instantiation, its roles
/// looked up), when its decisions' deadline is shorter.
const LOAD_CHECK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

impl WasmPolicy {
    pub(crate) fn prepare(
        engine: WasmEngine,
        component: &Component,
        loaded: &Loaded,
        settings: PolicySettings,
    ) -> Result<Self, WasmError> {
        let link_error = |e: wasmtime::Error| WasmError::Link {
            policy: settings.name.clone(),
            digest: loaded.digest.clone(),
            message: format!("{e:#}"),
        };
        let linker = link::linker(engine.wasmtime(), settings.capabilities).map_err(link_error)?;
        let pre = linker.instantiate_pre(component).map_err(link_error)?;
        let info = PolicyInfo::inspect(engine.wasmtime(), component, loaded);
        let inner = Inner {
            placement: PlacementIndices::new(&pre).ok(),
            fallback: FallbackIndices::new(&pre).ok(),
            pricing: PricingIndices::new(&pre).ok(),
            engine,
            pre,
            info,
            settings,
        };
        let policy = Self {
            inner: Arc::new(inner),
        };
        policy.check_roles()?;
        Ok(policy)
    }

    /// Fails unless the component exports at least one role, and every exported role has the
    /// signature of `neocloud:policy@0.1.0` (checked by instantiating once).
    fn check_roles(&self) -> Result<(), WasmError> {
        let inner = &self.inner;
        if inner.info.roles.is_empty() {
            return Err(WasmError::WrongWorld {
                policy: inner.settings.name.clone(),
                digest: inner.info.digest.clone(),
                exports: inner.info.exports.join(", "),
            });
        }
        // Made once, at load, and not a decision: under a deadline of its own, so that a busy
        // machine does not refuse a guest that is slow to start (the decisions' budget, which
        // counts the start too, is what stops it deciding slowly).
        let mut site = self.site();
        site.budget.deadline = site.budget.deadline.max(LOAD_CHECK_DEADLINE);
        let (result, _) = call::run(&site, |store, instance| {
            if let Some(i) = &inner.placement {
                i.load(&mut *store, instance)?;
            }
            if let Some(i) = &inner.fallback {
                i.load(&mut *store, instance)?;
            }
            if let Some(i) = &inner.pricing {
                i.load(&mut *store, instance)?;
            }
            Ok(())
        });
        result.map_err(|e| WasmError::Link {
            policy: inner.settings.name.clone(),
            digest: inner.info.digest.clone(),
            message: e.to_string(),
        })
    }

    /// Digest, size, world, roles, imports and exports.
    pub fn info(&self) -> &PolicyInfo {
        &self.inner.info
    }

    /// The settings the policy was loaded with.
    pub fn settings(&self) -> &PolicySettings {
        &self.inner.settings
    }

    /// Instantiates the policy in a fresh store under its budget and drops it, calling nothing.
    /// For benchmarks and health checks.
    pub fn instantiate(&self) -> Result<(), WasmError> {
        call::run(&self.site(), |_, _| Ok(())).0
    }

    /// Ranks or filters `input.offers`.
    pub fn place(&self, input: &PlacementInput) -> Evaluation<PlacementDecision> {
        let offers = input.offers.len();
        self.evaluate(Role::Placement, |policy| {
            let indices = policy.inner.placement.as_ref();
            let (result, log) = policy.call(Role::Placement, indices, |guest, store| {
                guest.call_place(store, input)
            });
            (
                policy.checked(result, |d| validate::placement(d, offers)),
                log,
            )
        })
    }

    /// Chooses the next step after a failed rental attempt.
    pub fn next(&self, input: &FallbackInput) -> Evaluation<FallbackAction> {
        self.evaluate(Role::Fallback, |policy| {
            let indices = policy.inner.fallback.as_ref();
            let (result, log) = policy.call(Role::Fallback, indices, |guest, store| {
                guest.call_next(store, input)
            });
            (policy.checked(result, validate::fallback), log)
        })
    }

    /// Accepts an offer with a bid, or rejects it.
    pub fn price(&self, input: &PricingInput) -> Evaluation<PriceDecision> {
        self.evaluate(Role::Pricing, |policy| {
            let indices = policy.inner.pricing.as_ref();
            let (result, log) = policy.call(Role::Pricing, indices, |guest, store| {
                guest.call_price(store, input)
            });
            (policy.checked(result, validate::pricing), log)
        })
    }

    fn site(&self) -> CallSite<'_> {
        let inner = &self.inner;
        CallSite {
            engine: &inner.engine,
            pre: &inner.pre,
            policy: &inner.settings.name,
            budget: inner.settings.budget,
            capabilities: inner.settings.capabilities,
        }
    }

    fn evaluate<T>(
        &self,
        role: Role,
        run: impl FnOnce(&Self) -> (Result<T, WasmError>, DecisionLog),
    ) -> Evaluation<T> {
        let span =
            tracing::debug_span!("policy_decision", policy = %self.inner.settings.name, %role);
        let _entered = span.enter();
        let started = Instant::now();
        let (result, log) = run(self);
        let elapsed = started.elapsed();
        log.emit(&self.inner.settings.name, role);
        if let Err(error) = &result {
            tracing::debug!(%error, label = error.label(), "policy failed");
        }
        let settings = &self.inner.settings;
        let verdict = Verdict::new(result, settings.failure_policy, settings.mode);
        Evaluation {
            verdict,
            log,
            elapsed,
        }
    }

    /// Instantiates, loads the role's exports and calls them; `None` indices mean the role is
    /// not implemented.
    fn call<I: Loadable, T>(
        &self,
        role: Role,
        indices: Option<&I>,
        invoke: impl FnOnce(&I::Guest, &mut wasmtime::Store<HostState>) -> GuestResult<T>,
    ) -> (Result<Result<T, PolicyError>, WasmError>, DecisionLog) {
        let Some(indices) = indices else {
            let error = WasmError::NotImplemented {
                policy: self.inner.settings.name.clone(),
                role,
            };
            return (Err(error), DecisionLog::default());
        };
        call::run(&self.site(), |store, instance| {
            let guest = indices.load_guest(&mut *store, instance)?;
            invoke(&guest, store)
        })
    }

    /// Turns a guest error into [`WasmError::Guest`] and a rejected answer into
    /// [`WasmError::InvalidOutput`].
    fn checked<T>(
        &self,
        result: Result<Result<T, PolicyError>, WasmError>,
        check: impl FnOnce(&T) -> Result<(), String>,
    ) -> Result<T, WasmError> {
        let policy = || self.inner.settings.name.clone();
        match result? {
            Ok(answer) => match check(&answer) {
                Ok(()) => Ok(answer),
                Err(reason) => Err(WasmError::InvalidOutput {
                    policy: policy(),
                    reason,
                }),
            },
            Err(guest) => {
                let guest = validate::guest_error(guest);
                Err(WasmError::Guest {
                    policy: policy(),
                    code: guest.code,
                    message: guest.message,
                })
            }
        }
    }
}

/// The generated `GuestIndices::load` of each role, behind one trait.
trait Loadable {
    type Guest;
    fn load_guest(
        &self,
        store: &mut wasmtime::Store<HostState>,
        instance: &wasmtime::component::Instance,
    ) -> wasmtime::Result<Self::Guest>;
}

macro_rules! loadable {
    ($indices:ty, $guest:ty) => {
        impl Loadable for $indices {
            type Guest = $guest;
            fn load_guest(
                &self,
                store: &mut wasmtime::Store<HostState>,
                instance: &wasmtime::component::Instance,
            ) -> wasmtime::Result<Self::Guest> {
                self.load(store, instance)
            }
        }
    };
}

loadable!(
    PlacementIndices,
    super::bindings::exports::neocloud::policy::placement::Guest
);
loadable!(
    FallbackIndices,
    super::bindings::exports::neocloud::policy::fallback::Guest
);
loadable!(
    PricingIndices,
    super::bindings::exports::neocloud::policy::pricing::Guest
);
