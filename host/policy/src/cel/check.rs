//! Load-time checks of a parsed expression: bracket nesting before parsing, then one walk of
//! the tree that resolves every identifier against the declared variables (and the variables
//! of enclosing comprehensions), checks field names against the schema, bounds the depth,
//! estimates the worst-case cost, infers the result type where it can, and refuses calls whose
//! operand types can never work together (the rules are in [`super::ops`]).
//!
//! Not a full CEL type-checker: what it cannot type is `dyn` and is checked when it runs.

use cel::common::ast::{CallExpr, ComprehensionExpr, Expr, IdedExpr, LiteralValue, SourceInfo};

use super::error::{CelError, ExprKind, Position, excerpt};
use super::limits::CelLimits;
use super::ops::{Refusal, call_type};
use super::schema::{Ty, field_names, field_type, variable_type};

/// Refuses sources that are too long or nest brackets too deeply, before the parser sees them.
pub(crate) fn prescan(kind: ExprKind, src: &str, limits: &CelLimits) -> Result<(), CelError> {
    if src.len() > limits.max_source_len {
        let (len, max) = (src.len(), limits.max_source_len);
        return Err(CelError::SourceTooLong { kind, len, max });
    }
    let (mut depth, mut quote) = (0usize, None::<char>);
    let mut prev = ' ';
    for (i, c) in src.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q && prev != '\\' => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth > limits.max_nesting_depth {
            let at = Position::of_byte_offset(src, i);
            let (max, expression) = (limits.max_nesting_depth, excerpt(src));
            return Err(CelError::TooDeeplyNested {
                kind,
                max,
                at,
                expression,
            });
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    Ok(())
}

/// What the walk found out about an expression.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checked {
    pub ty: Ty,
    pub cost: u64,
}

/// One walk over a parsed expression.
pub(crate) struct Checker<'a> {
    pub kind: ExprKind,
    pub info: &'a SourceInfo,
    pub limits: &'a CelLimits,
    /// Variables bound by enclosing comprehensions, innermost last.
    scopes: Vec<(String, Ty)>,
}

impl<'a> Checker<'a> {
    pub(crate) fn new(kind: ExprKind, info: &'a SourceInfo, limits: &'a CelLimits) -> Self {
        Checker {
            kind,
            info,
            limits,
            scopes: Vec::new(),
        }
    }

    /// The position of node `id` in the source.
    pub(crate) fn position(&self, id: u64) -> Position {
        let start = self
            .info
            .offset_for(id)
            .map_or(0, |(start, _)| start as usize);
        Position::of_byte_offset(&self.info.source, start)
    }

    fn expression(&self) -> String {
        excerpt(&self.info.source)
    }

    pub(crate) fn check(&mut self, e: &IdedExpr, depth: usize) -> Result<Checked, CelError> {
        if depth > self.limits.max_nesting_depth {
            let (kind, max) = (self.kind, self.limits.max_nesting_depth);
            let (at, expression) = (self.position(e.id), self.expression());
            return Err(CelError::TooDeeplyNested {
                kind,
                max,
                at,
                expression,
            });
        }
        let d = depth + 1;
        match &e.expr {
            Expr::Ident(name) => self.ident(e.id, name),
            Expr::Literal(lit) => Ok(Checked {
                ty: literal_type(lit),
                cost: 1,
            }),
            Expr::Select(s) => {
                let on = self.check(&s.operand, d)?;
                let ty = if s.test {
                    Ty::Bool
                } else {
                    self.field(e.id, on.ty, &s.field)?
                };
                Ok(Checked {
                    ty,
                    cost: on.cost + 1,
                })
            }
            Expr::Call(call) => self.call(e.id, call, d),
            Expr::Comprehension(c) => self.comprehension(c, d),
            Expr::List(l) => self.sum(l.elements.iter(), d, Ty::Dyn),
            Expr::Map(m) => self.sum(m.entries.iter().flat_map(entry_exprs), d, Ty::Dyn),
            Expr::Struct(s) => self.sum(s.entries.iter().flat_map(entry_exprs), d, Ty::Dyn),
            Expr::Unspecified => Ok(Checked {
                ty: Ty::Dyn,
                cost: 1,
            }),
        }
    }

    /// Checks a call's operands, then the call itself: operands of types it can never accept
    /// are refused with the operator's position and a hint.
    fn call(&mut self, id: u64, call: &CallExpr, d: usize) -> Result<Checked, CelError> {
        let mut cost = 1;
        let operands: Vec<&IdedExpr> = call.target.iter().map(|t| &**t).chain(&call.args).collect();
        let mut tys = Vec::with_capacity(operands.len());
        for arg in &operands {
            let c = self.check(arg, d)?;
            cost += c.cost;
            tys.push(c.ty);
        }
        match call_type(&call.func_name, call.target.is_some(), &tys) {
            Ok(ty) => Ok(Checked { ty, cost }),
            Err(refusal) => Err(self.mismatch(id, refusal, &operands)),
        }
    }

    fn mismatch(&self, id: u64, r: Refusal, operands: &[&IdedExpr]) -> CelError {
        let operand = r.operand.and_then(|i| Some((i, operands.get(i)?)));
        let wrapped = operand
            .zip(r.wrap_in)
            .and_then(|((_, e), f)| Some((f, written(e)?)));
        let hint = match (wrapped, operand) {
            (Some((f, text)), _) => format!("{}: {f}({text})", r.hint),
            (None, Some((i, _))) if operands.len() == 2 => {
                let side = if i == 0 { "left" } else { "right" };
                format!("{} (the {side} operand)", r.hint)
            }
            _ => r.hint,
        };
        CelError::TypeMismatch {
            kind: self.kind,
            problem: r.problem,
            hint,
            at: self.position(id),
            expression: self.expression(),
        }
    }

    fn sum<'e>(
        &mut self,
        exprs: impl Iterator<Item = &'e IdedExpr>,
        depth: usize,
        ty: Ty,
    ) -> Result<Checked, CelError> {
        let mut cost = 1;
        for e in exprs {
            cost += self.check(e, depth)?.cost;
        }
        Ok(Checked { ty, cost })
    }

    fn ident(&self, id: u64, name: &str) -> Result<Checked, CelError> {
        let bound = self
            .scopes
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t);
        match bound.or_else(|| variable_type(name)) {
            Some(ty) => Ok(Checked { ty, cost: 1 }),
            None => Err(CelError::UnknownIdentifier {
                name: name.to_owned(),
                at: self.position(id),
                expression: self.expression(),
            }),
        }
    }

    fn field(&self, id: u64, on: Ty, field: &str) -> Result<Ty, CelError> {
        match field_type(on, field) {
            Some(ty) => Ok(ty.unwrap_or(Ty::Dyn)),
            None => Err(CelError::UnknownField {
                field: field.to_owned(),
                on: on.name(),
                known: field_names(on).join(", "),
                at: self.position(id),
                expression: self.expression(),
            }),
        }
    }

    fn comprehension(&mut self, c: &ComprehensionExpr, d: usize) -> Result<Checked, CelError> {
        let range = self.check(&c.iter_range, d)?;
        let init = self.check(&c.accu_init, d)?;
        let elem = match range.ty {
            Ty::ListString | Ty::MapString => Ty::String,
            Ty::ListAttempt => Ty::Attempt,
            _ => Ty::Dyn,
        };
        let pushed = 2 + usize::from(c.iter_var2.is_some());
        self.scopes.push((c.iter_var.clone(), elem));
        if let Some(v2) = &c.iter_var2 {
            self.scopes.push((v2.clone(), Ty::Dyn));
        }
        self.scopes.push((c.accu_var.clone(), init.ty));
        let body = self.check(&c.loop_cond, d).and_then(|cond| {
            let step = self.check(&c.loop_step, d)?;
            Ok(cond.cost + step.cost)
        });
        self.scopes.truncate(self.scopes.len() - pushed);
        let body = body?;
        self.scopes.push((c.accu_var.clone(), init.ty));
        let result = self.check(&c.result, d);
        self.scopes.pop();
        let result = result?;
        let loops = self.limits.max_list_len as u64;
        let cost = range.cost + init.cost + body.saturating_mul(loops) + result.cost;
        Ok(Checked {
            ty: result.ty,
            cost,
        })
    }
}

fn entry_exprs(entry: &cel::common::ast::IdedEntryExpr) -> [&IdedExpr; 2] {
    use cel::common::ast::EntryExpr;
    match &entry.expr {
        EntryExpr::StructField(f) => [&f.value, &f.value],
        EntryExpr::MapEntry(m) => [&m.key, &m.value],
    }
}

fn literal_type(lit: &LiteralValue) -> Ty {
    match lit {
        LiteralValue::Boolean(_) => Ty::Bool,
        LiteralValue::Int(_) => Ty::Int,
        LiteralValue::Double(_) => Ty::Double,
        LiteralValue::String(_) => Ty::String,
        LiteralValue::UInt(_) | LiteralValue::Bytes(_) | LiteralValue::Null => Ty::Dyn,
    }
}

/// How a field path (`offer.gpu.memory_gib`) or a number literal is written, for hints; `None`
/// for anything else.
fn written(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(s) if !s.test => Some(format!("{}.{}", written(&s.operand)?, s.field)),
        Expr::Literal(LiteralValue::Int(i)) => Some(i.inner().to_string()),
        Expr::Literal(LiteralValue::Double(d)) => Some(d.inner().to_string()),
        _ => None,
    }
}
