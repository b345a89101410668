//! Compiled expressions and how they run: one evaluation, or a batch over many offers sharing
//! one context. A compiled expression is immutable and shared (`Arc`) between threads.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cel::{Env, IdedExpr, Value};

use super::error::{CelEvalError, ExprKind};
use super::interp::{self, Deadline, Shared};
use super::schema::{CelAttempt, CelInput, CelOffer, CelWorkload};
use super::typed::{BoolNode, DoubleNode, IntNode, R};

/// Per-offer results of a batch, aligned with the offers.
pub type BatchResults<T> = Vec<Result<T, CelEvalError>>;

/// What every compiled expression needs at run time.
pub(crate) struct Runtime {
    pub env: Arc<Env>,
    pub eval_deadline: Duration,
    pub max_list_len: usize,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("eval_deadline", &self.eval_deadline)
            .field("max_list_len", &self.max_list_len)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Runs an interpreted expression for one input under the evaluation deadline.
    fn interpret(&self, expr: &IdedExpr, i: &CelInput<'_>) -> R<Value> {
        let deadline = Deadline::starting_now(self.eval_deadline);
        let shared = Shared::new(i.workload, i.attempts, self.max_list_len)?;
        interp::eval_offer(&self.env, &shared, expr, i.offer, deadline)
    }

    /// Runs an interpreted expression for every offer, sharing the converted workload and
    /// attempts; the deadline covers the whole batch.
    fn interpret_batch<T>(
        &self,
        expr: &IdedExpr,
        workload: &CelWorkload,
        attempts: &[CelAttempt],
        offers: &[CelOffer],
        convert: impl Fn(Value) -> R<T>,
    ) -> R<BatchResults<T>> {
        let deadline = Deadline::starting_now(self.eval_deadline);
        let shared = Shared::new(workload, attempts, self.max_list_len)?;
        self.batch(offers, deadline, 1, |offer| {
            convert(interp::eval_offer(
                &self.env, &shared, expr, offer, deadline,
            )?)
        })
    }

    /// Runs `f` for every offer, checking the deadline every `every` offers; a missed deadline
    /// fails the whole batch.
    fn batch<T>(
        &self,
        offers: &[CelOffer],
        deadline: Deadline,
        every: usize,
        mut f: impl FnMut(&CelOffer) -> R<T>,
    ) -> R<BatchResults<T>> {
        let mut out = Vec::with_capacity(offers.len());
        for (n, offer) in offers.iter().enumerate() {
            if n % every == 0 {
                deadline.check()?;
            }
            match f(offer) {
                Err(e @ CelEvalError::DeadlineExceeded { .. }) => return Err(e),
                r => out.push(r),
            }
        }
        Ok(out)
    }

    fn typed_batch<T>(
        &self,
        workload: &CelWorkload,
        attempts: &[CelAttempt],
        offers: &[CelOffer],
        f: impl Fn(&CelInput<'_>) -> R<T>,
    ) -> R<BatchResults<T>> {
        let deadline = Deadline::starting_now(self.eval_deadline);
        self.batch(offers, deadline, TYPED_CHECK_EVERY, |offer| {
            f(&CelInput {
                workload,
                offer,
                attempts,
            })
        })
    }
}

/// How often a typed batch looks at the clock: typed evaluations take tens of nanoseconds.
const TYPED_CHECK_EVERY: usize = 64;

#[derive(Debug)]
pub(crate) enum ConstraintBody {
    Typed(BoolNode),
    Interpreted(IdedExpr),
}

/// A boolean constraint: an offer is kept when it evaluates to true.
#[derive(Debug)]
pub struct CompiledConstraint {
    pub(crate) source: String,
    pub(crate) body: ConstraintBody,
    pub(crate) runtime: Runtime,
}

impl CompiledConstraint {
    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the expression runs on the typed fast path rather than the interpreter.
    pub fn is_typed(&self) -> bool {
        matches!(self.body, ConstraintBody::Typed(_))
    }

    /// Evaluates the constraint for one offer.
    pub fn eval(&self, input: &CelInput<'_>) -> Result<bool, CelEvalError> {
        match &self.body {
            ConstraintBody::Typed(node) => node.eval(input),
            ConstraintBody::Interpreted(e) => to_bool(self.runtime.interpret(e, input)?),
        }
    }

    /// Evaluates the constraint for every offer, sharing one context. Fails as a whole only
    /// when the deadline passes or the workload or attempts are too large.
    pub fn eval_batch(
        &self,
        workload: &CelWorkload,
        attempts: &[CelAttempt],
        offers: &[CelOffer],
    ) -> Result<BatchResults<bool>, CelEvalError> {
        let rt = &self.runtime;
        match &self.body {
            ConstraintBody::Typed(node) => {
                rt.typed_batch(workload, attempts, offers, |i| node.eval(i))
            }
            ConstraintBody::Interpreted(e) => {
                rt.interpret_batch(e, workload, attempts, offers, to_bool)
            }
        }
    }
}

#[derive(Debug)]
pub(crate) enum RankBody {
    Int(IntNode),
    Double(DoubleNode),
    Interpreted(IdedExpr),
}

/// A numeric rank: higher is better. Always a finite `f64`.
#[derive(Debug)]
pub struct CompiledRank {
    pub(crate) source: String,
    pub(crate) body: RankBody,
    pub(crate) runtime: Runtime,
}

impl CompiledRank {
    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the expression runs on the typed fast path rather than the interpreter.
    pub fn is_typed(&self) -> bool {
        !matches!(self.body, RankBody::Interpreted(_))
    }

    /// Evaluates the rank for one offer.
    pub fn eval(&self, input: &CelInput<'_>) -> Result<f64, CelEvalError> {
        match &self.body {
            RankBody::Int(node) => Ok(node.eval(input)? as f64),
            RankBody::Double(node) => finite(node.eval(input)?),
            RankBody::Interpreted(e) => to_f64(self.runtime.interpret(e, input)?),
        }
    }

    /// Evaluates the rank for every offer, sharing one context; see
    /// [`CompiledConstraint::eval_batch`].
    pub fn eval_batch(
        &self,
        workload: &CelWorkload,
        attempts: &[CelAttempt],
        offers: &[CelOffer],
    ) -> Result<BatchResults<f64>, CelEvalError> {
        let rt = &self.runtime;
        match &self.body {
            RankBody::Interpreted(e) => rt.interpret_batch(e, workload, attempts, offers, to_f64),
            _ => rt.typed_batch(workload, attempts, offers, |i| self.eval(i)),
        }
    }
}

fn to_bool(v: Value) -> R<bool> {
    match v {
        Value::Bool(b) => Ok(b),
        other => Err(wrong(ExprKind::Constraint, interp::type_name(&other))),
    }
}

fn to_f64(v: Value) -> R<f64> {
    match v {
        Value::Int(i) => Ok(i as f64),
        Value::UInt(u) => Ok(u as f64),
        Value::Float(f) => finite(f),
        other => Err(wrong(ExprKind::Rank, interp::type_name(&other))),
    }
}

fn finite(f: f64) -> R<f64> {
    if f.is_finite() {
        Ok(f)
    } else {
        Err(wrong(ExprKind::Rank, format!("the non-finite double {f}")))
    }
}

fn wrong(kind: ExprKind, found: String) -> CelEvalError {
    CelEvalError::WrongResultType {
        kind,
        expected: kind.expected(),
        found,
    }
}
