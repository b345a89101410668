//! The interpreted path: expressions the typed fast path does not understand run on the `cel`
//! crate's interpreter. The engine's `Env` is shared, so no built-in is registered per
//! evaluation (`Context::default()` costs about 34 µs); `workload` and `attempts` are converted
//! once per batch; each offer gets a cheap root context whose variable resolver also enforces
//! the deadline, so a long comprehension stops at its next variable reference after the
//! deadline instead of running to its end.
//!
//! Not for anything the fast path handles, and not a cost estimator (the load-time check is).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cel::common::types::CelList;
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, Env, Value};

use super::error::CelEvalError;
use super::schema::{CelAttempt, CelOffer, CelWorkload};
use super::views::{OfferVal, WorkloadVal, attempts_val};

/// `workload` and `attempts` as interpreter values, built once for a batch.
pub(crate) struct Shared<'a> {
    workload: WorkloadVal<'a>,
    attempts: CelList<'a>,
}

impl<'a> Shared<'a> {
    pub(crate) fn new(
        workload: &'a CelWorkload,
        attempts: &'a [CelAttempt],
        max_list_len: usize,
    ) -> Result<Self, CelEvalError> {
        check_len("attempts", attempts.len(), max_list_len)?;
        check_len(
            "workload.gpu_models",
            workload.gpu_models.len(),
            max_list_len,
        )?;
        check_len("workload.regions", workload.regions.len(), max_list_len)?;
        check_len(
            "workload.annotations",
            workload.annotations.len(),
            max_list_len,
        )?;
        Ok(Shared {
            workload: WorkloadVal::new(workload),
            attempts: attempts_val(attempts),
        })
    }
}

/// When the evaluation (or the batch it belongs to) must stop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    pub start: Instant,
    pub budget: Duration,
}

impl Deadline {
    pub(crate) fn starting_now(budget: Duration) -> Self {
        Deadline {
            start: Instant::now(),
            budget,
        }
    }

    pub(crate) fn check(&self) -> Result<(), CelEvalError> {
        let elapsed = self.start.elapsed();
        if elapsed > self.budget {
            return Err(CelEvalError::DeadlineExceeded {
                deadline: self.budget,
                elapsed,
            });
        }
        Ok(())
    }
}

/// Resolves the three variables and looks at the clock on every lookup: once the deadline has
/// passed it resolves nothing, so the interpreter fails at its next variable reference (inside
/// comprehensions too) instead of running on.
struct Guard<'a> {
    shared: &'a Shared<'a>,
    offer: OfferVal<'a>,
    deadline: Deadline,
    tripped: AtomicBool,
}

impl VariableResolver for Guard<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        if self.tripped.load(Ordering::Relaxed) || self.deadline.check().is_err() {
            self.tripped.store(true, Ordering::Relaxed);
            return None;
        }
        let value: &'b dyn Val = match variable {
            "offer" => &self.offer,
            "workload" => &self.shared.workload,
            "attempts" => &self.shared.attempts,
            _ => return None,
        };
        Some(CowVal::Borrowed(value))
    }
}

/// Evaluates `expr` for one offer. A deadline that passed during the evaluation is the error,
/// whatever the interpreter made of the variables that stopped resolving.
pub(crate) fn eval_offer<'a>(
    env: &Arc<Env>,
    shared: &'a Shared<'a>,
    expr: &cel::IdedExpr,
    offer: &'a CelOffer,
    deadline: Deadline,
) -> Result<Value, CelEvalError> {
    deadline.check()?;
    let offer = OfferVal(offer);
    let guard = Guard {
        shared,
        offer,
        deadline,
        tripped: AtomicBool::new(false),
    };
    let mut ctx = Context::with_env(Arc::clone(env));
    ctx.set_variable_resolver(&guard);
    let result = Value::resolve(expr, &ctx);
    if guard.tripped.load(Ordering::Relaxed) {
        return Err(CelEvalError::DeadlineExceeded {
            deadline: deadline.budget,
            elapsed: deadline.start.elapsed(),
        });
    }
    Ok(result?)
}

fn check_len(what: &'static str, len: usize, max: usize) -> Result<(), CelEvalError> {
    if len > max {
        return Err(CelEvalError::InputTooLarge { what, len, max });
    }
    Ok(())
}

/// The CEL type name of a value, for wrong-result-type errors.
pub(crate) fn type_name(v: &Value) -> String {
    v.type_of().to_string()
}
