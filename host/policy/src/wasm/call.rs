//! One decision: a fresh `Store` on the pooling allocator with the policy's budget (epoch
//! deadline, memory limiter, optional fuel), instantiation from the `InstancePre`, the call, and
//! the classification of whatever went wrong by its type.
//!
//! Not for validating answers (see [`super::validate`]) or applying the failure policy (see
//! [`super::verdict`]).

use std::time::Duration;

use wasmtime::component::{Instance, InstancePre};
use wasmtime::{Store, Trap};

use super::config::{Budget, Capabilities};
use super::engine::WasmEngine;
use super::error::{TrapKind, WasmError};
use super::host::{DecisionLog, HostState};

/// What a call needs to build its store.
pub(crate) struct CallSite<'a> {
    pub(crate) engine: &'a WasmEngine,
    pub(crate) pre: &'a InstancePre<HostState>,
    pub(crate) policy: &'a str,
    pub(crate) budget: Budget,
    pub(crate) capabilities: Capabilities,
}

/// Instantiates the policy in a fresh store and runs `call` on it under the budget.
pub(crate) fn run<R>(
    site: &CallSite<'_>,
    call: impl FnOnce(&mut Store<HostState>, &Instance) -> wasmtime::Result<R>,
) -> (Result<R, WasmError>, DecisionLog) {
    // The epoch advances from before the store's deadline is set until the call has ended.
    let _ticking = site.engine.ticking();
    let mut store = match new_store(site) {
        Ok(store) => store,
        Err(e) => {
            return (
                Err(instantiate_error(site.policy, &e)),
                DecisionLog::default(),
            );
        }
    };
    let result = match site.pre.instantiate(&mut store) {
        Ok(instance) => call(&mut store, &instance).map_err(|e| classify(site, &store, &e, true)),
        Err(e) => Err(classify(site, &store, &e, false)),
    };
    store.data_mut().drain_stdio();
    let log = std::mem::take(&mut store.data_mut().log);
    (result, log)
}

fn new_store(site: &CallSite<'_>) -> wasmtime::Result<Store<HostState>> {
    let state = HostState::new(site.budget.memory_bytes, site.capabilities.deny_all_wasi);
    let mut store = Store::new(site.engine.wasmtime(), state);
    store.limiter(|state| &mut state.limiter);
    store.set_epoch_deadline(deadline_ticks(
        site.budget.deadline,
        site.engine.config().epoch_tick,
    ));
    store.epoch_deadline_trap();
    if site.engine.config().fuel {
        store.set_fuel(site.budget.fuel.unwrap_or(u64::MAX))?;
    }
    Ok(store)
}

/// Whole ticks covering `deadline`, at least one.
fn deadline_ticks(deadline: Duration, tick: Duration) -> u64 {
    let tick = tick.as_nanos().max(1);
    let ticks = deadline.as_nanos().div_ceil(tick);
    u64::try_from(ticks).unwrap_or(u64::MAX).max(1)
}

/// Classifies by type: the limiter's own flag for refused growth, wasmtime's `Trap` codes for the
/// rest. A non-trap error during the call is a canonical-ABI failure lifting the guest's answer.
fn classify(
    site: &CallSite<'_>,
    store: &Store<HostState>,
    error: &wasmtime::Error,
    in_call: bool,
) -> WasmError {
    let policy = site.policy.to_owned();
    if store.data().limiter.refused_growth() {
        return WasmError::Trap {
            policy,
            kind: TrapKind::OutOfMemory,
        };
    }
    match error.downcast_ref::<Trap>() {
        Some(trap) => WasmError::Trap {
            policy,
            kind: trap_kind(*trap),
        },
        None if in_call => WasmError::InvalidOutput {
            policy,
            reason: format!("{error:#}"),
        },
        None => instantiate_error(site.policy, error),
    }
}

fn trap_kind(trap: Trap) -> TrapKind {
    match trap {
        Trap::Interrupt => TrapKind::Timeout,
        Trap::OutOfFuel => TrapKind::OutOfFuel,
        Trap::StackOverflow => TrapKind::StackOverflow,
        other => {
            let text = other.to_string();
            TrapKind::Other(text.trim_start_matches("wasm trap: ").to_owned())
        }
    }
}

fn instantiate_error(policy: &str, error: &wasmtime::Error) -> WasmError {
    WasmError::Instantiate {
        policy: policy.to_owned(),
        message: format!("{error:#}"),
    }
}
