//! The CEL engine: compiles constraint and rank expressions once, on a thread with a large
//! stack, checks them against the schema and the limits, and caches them by source and kind.
//!
//! Not for evaluating (see [`super::compiled`]) and not for deciding what a failing expression
//! means for a Pod (the caller's `failurePolicy` does).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cel::Env;
use cel::common::ast::IdedExpr;
use cel::parser::{ParseErrors, Parser};
use parking_lot::Mutex;

use super::check::{Checked, Checker, prescan};
use super::compiled::{CompiledConstraint, CompiledRank, ConstraintBody, RankBody, Runtime};
use super::error::{CelError, ExprKind, Position, excerpt};
use super::limits::CelLimits;
use super::lower::{Typed, lower};
use super::schema::Ty;

/// A parsed and checked expression, before it is given its kind's body.
struct Parsed {
    expr: IdedExpr,
    checked: Checked,
    typed: Option<Typed>,
    root: Position,
}

/// Compiles and caches CEL expressions. Cheap to share: wrap it in an `Arc`.
pub struct CelEngine {
    limits: CelLimits,
    env: Arc<Env>,
    constraints: Mutex<HashMap<String, Arc<CompiledConstraint>>>,
    ranks: Mutex<HashMap<String, Arc<CompiledRank>>>,
    compilations: AtomicU64,
}

impl fmt::Debug for CelEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CelEngine")
            .field("limits", &self.limits)
            .field("compilations", &self.compilations())
            .finish_non_exhaustive()
    }
}

impl CelEngine {
    /// An engine with these limits. Builds the standard library once (about 34 µs).
    pub fn new(limits: CelLimits) -> Self {
        CelEngine {
            limits,
            env: Arc::new(Env::stdlib()),
            constraints: Mutex::default(),
            ranks: Mutex::default(),
            compilations: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> &CelLimits {
        &self.limits
    }

    /// How many times an expression was actually compiled (cache misses).
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    /// Compiles a boolean constraint, or returns the cached one for the same source.
    pub fn compile_constraint(&self, src: &str) -> Result<Arc<CompiledConstraint>, CelError> {
        if let Some(hit) = self.constraints.lock().get(src) {
            return Ok(Arc::clone(hit));
        }
        let parsed = self.compile(ExprKind::Constraint, src)?;
        let body = constraint_body(src, parsed)?;
        let compiled = Arc::new(CompiledConstraint {
            source: src.to_owned(),
            body,
            runtime: self.runtime(),
        });
        self.remember(&self.constraints, src, &compiled);
        Ok(compiled)
    }

    /// Compiles a numeric rank, or returns the cached one for the same source.
    pub fn compile_rank(&self, src: &str) -> Result<Arc<CompiledRank>, CelError> {
        if let Some(hit) = self.ranks.lock().get(src) {
            return Ok(Arc::clone(hit));
        }
        let parsed = self.compile(ExprKind::Rank, src)?;
        let body = rank_body(src, parsed)?;
        let compiled = Arc::new(CompiledRank {
            source: src.to_owned(),
            body,
            runtime: self.runtime(),
        });
        self.remember(&self.ranks, src, &compiled);
        Ok(compiled)
    }

    fn runtime(&self) -> Runtime {
        Runtime {
            env: Arc::clone(&self.env),
            eval_deadline: self.limits.eval_deadline,
            max_list_len: self.limits.max_list_len,
        }
    }

    fn remember<T>(&self, cache: &Mutex<HashMap<String, Arc<T>>>, src: &str, value: &Arc<T>) {
        let mut cache = cache.lock();
        if cache.len() < self.limits.max_cached_programs {
            cache.insert(src.to_owned(), Arc::clone(value));
        } else {
            tracing::warn!(
                max = self.limits.max_cached_programs,
                "cel program cache is full"
            );
        }
    }

    /// Parses, checks and lowers `src` on a thread with a large stack: the parser recurses
    /// deeply, and a deep tree is dropped recursively.
    fn compile(&self, kind: ExprKind, src: &str) -> Result<Parsed, CelError> {
        prescan(kind, src, &self.limits)?;
        self.compilations.fetch_add(1, Ordering::Relaxed);
        let limits = &self.limits;
        let thread = std::thread::Builder::new()
            .name("cel-compile".to_owned())
            .stack_size(limits.compile_stack_bytes);
        std::thread::scope(|scope| {
            let handle = thread
                .spawn_scoped(scope, || parse_and_check(kind, src, limits))
                .map_err(|e| CelError::CompilerThread {
                    kind,
                    reason: format!("failed to start: {e}"),
                })?;
            handle.join().unwrap_or_else(|_| {
                Err(CelError::CompilerThread {
                    kind,
                    reason: "panicked".to_owned(),
                })
            })
        })
    }
}

fn parse_and_check(kind: ExprKind, src: &str, limits: &CelLimits) -> Result<Parsed, CelError> {
    let depth = u16::try_from(limits.max_nesting_depth).unwrap_or(u16::MAX);
    let (expr, info) = Parser::new()
        .max_recursion_depth(depth)
        .parse_with_source_info(src)
        .map_err(|e| parse_error(kind, src, &e))?;
    let mut checker = Checker::new(kind, &info, limits);
    let checked = checker.check(&expr, 0)?;
    if checked.cost > limits.max_cost {
        let (cost, max, expression) = (checked.cost, limits.max_cost, excerpt(src));
        return Err(CelError::TooExpensive {
            kind,
            cost,
            max,
            expression,
        });
    }
    let root = checker.position(expr.id);
    let typed = lower(&expr);
    Ok(Parsed {
        expr,
        checked,
        typed,
        root,
    })
}

fn parse_error(kind: ExprKind, src: &str, errors: &ParseErrors) -> CelError {
    let first = errors.errors.first();
    let (line, column) = first.map_or((1, 1), |e| e.pos);
    let line = usize::try_from(line).unwrap_or(1).max(1);
    // The parser puts an error at the end of the input one column past it; keep it on the line.
    let width = src
        .split('\n')
        .nth(line - 1)
        .map_or(0, |l| l.chars().count());
    let column = usize::try_from(column).unwrap_or(0).min(width) + 1;
    let at = Position {
        line: u32::try_from(line).unwrap_or(u32::MAX),
        column: u32::try_from(column).unwrap_or(u32::MAX),
    };
    let message = first.map_or_else(|| "unknown error".to_owned(), |e| e.msg.clone());
    CelError::Parse {
        kind,
        at,
        message,
        expression: excerpt(src),
    }
}

fn wrong_type(kind: ExprKind, src: &str, found: &'static str, at: Position) -> CelError {
    let expected = kind.expected();
    CelError::WrongResultType {
        kind,
        expected,
        found,
        at,
        expression: excerpt(src),
    }
}

fn constraint_body(src: &str, p: Parsed) -> Result<ConstraintBody, CelError> {
    let kind = ExprKind::Constraint;
    match p.typed {
        Some(Typed::Bool(node)) => Ok(ConstraintBody::Typed(node)),
        Some(other) => Err(wrong_type(kind, src, typed_name(&other), p.root)),
        None if matches!(p.checked.ty, Ty::Bool | Ty::Dyn) => {
            Ok(ConstraintBody::Interpreted(p.expr))
        }
        None => Err(wrong_type(kind, src, p.checked.ty.name(), p.root)),
    }
}

fn rank_body(src: &str, p: Parsed) -> Result<RankBody, CelError> {
    let kind = ExprKind::Rank;
    match p.typed {
        Some(Typed::Int(node)) => Ok(RankBody::Int(node)),
        Some(Typed::Double(node)) => Ok(RankBody::Double(node)),
        Some(other) => Err(wrong_type(kind, src, typed_name(&other), p.root)),
        None if p.checked.ty.is_number() || p.checked.ty == Ty::Dyn => {
            Ok(RankBody::Interpreted(p.expr))
        }
        None => Err(wrong_type(kind, src, p.checked.ty.name(), p.root)),
    }
}

fn typed_name(t: &Typed) -> &'static str {
    use super::lower::Path;
    match t {
        Typed::Bool(_) => "bool",
        Typed::Int(_) => "int",
        Typed::Double(_) => "double",
        Typed::Str(_) => "string",
        Typed::List(_) => "list(string)",
        Typed::Path(Path::Workload) => "workload",
        Typed::Path(Path::Offer) => "offer",
        Typed::Path(Path::Gpu) => "gpu",
        Typed::Path(Path::Annotations) => "map(string, string)",
        Typed::Path(Path::Attempts) => "list(attempt)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_position(src: &str) -> Position {
        match CelEngine::new(CelLimits::default()).compile_constraint(src) {
            Err(CelError::Parse { at, .. }) => at,
            other => panic!("{src:?} should fail to parse, got {other:?}"),
        }
    }

    #[test]
    fn a_parse_error_at_the_end_of_the_input_points_inside_the_source() {
        // Found by the cel_load fuzz target: the empty source was refused at 1:2.
        assert_eq!(parse_position(""), Position { line: 1, column: 1 });
        assert_eq!(
            parse_position("offer.gpu_count <"),
            Position {
                line: 1,
                column: 18
            }
        );
        assert_eq!(parse_position("true &&\n"), Position { line: 2, column: 1 });
    }
}
