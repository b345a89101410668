//! Lowering a checked expression into the typed fast path ([`super::typed`]). Lowering either
//! understands the whole expression or gives up (`None`), in which case the expression runs on
//! the `cel` interpreter. It is not a checker: it only runs after [`super::check`] accepted the
//! expression, and it refuses anything whose meaning it is not sure of.
//!
//! Understood: literals (bool, int, double, string, lists of strings), the fields of
//! `workload`, `offer`, `offer.gpu`, `workload.annotations` (by `.key`, `["key"]`, `in`,
//! `has()`), `size(attempts)`, `! && || ?:`, comparisons, `+ - * / %` on ints and on doubles,
//! unary minus, `in` a list of strings, `size`, `startsWith`, `endsWith`, `contains`, `double`.
//! Not understood (runs interpreted): comprehensions, anything on `attempts` but its size,
//! mixed int and double arithmetic, uint, bytes, null, maps, regexes, other functions.

use cel::common::ast::{CallExpr, Expr, IdedExpr, LiteralValue, operators as op};

use super::typed::{
    Arith, BoolField, BoolNode, Cmp, DoubleField, DoubleNode, IntField, IntNode, ListField,
    ListNode, StrField, StrNode, StrTest,
};

/// A lowered expression, by type; `Path` is a record not yet projected to a value.
#[derive(Debug)]
pub(crate) enum Typed {
    Bool(BoolNode),
    Int(IntNode),
    Double(DoubleNode),
    Str(StrNode),
    List(ListNode),
    Path(Path),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    Workload,
    Offer,
    Gpu,
    Annotations,
    Attempts,
}

/// Lowers `e`, or `None` when part of it is not understood.
pub(crate) fn lower(e: &IdedExpr) -> Option<Typed> {
    match &e.expr {
        Expr::Ident(name) => ident(name),
        Expr::Literal(lit) => literal(lit),
        Expr::Select(s) if s.test => match lower(&s.operand)? {
            Typed::Path(Path::Annotations) => {
                let key = Box::new(StrNode::Const(s.field.clone()));
                Some(Typed::Bool(BoolNode::HasAnnotation(key)))
            }
            _ => None,
        },
        Expr::Select(s) => match lower(&s.operand)? {
            Typed::Path(p) => field(p, &s.field),
            _ => None,
        },
        Expr::List(l) if l.optional_indices.is_empty() => {
            let items = l.elements.iter().map(|e| match &e.expr {
                Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_owned()),
                _ => None,
            });
            Some(Typed::List(ListNode::Const(items.collect::<Option<_>>()?)))
        }
        Expr::Call(call) => self::call(call),
        _ => None,
    }
}

fn ident(name: &str) -> Option<Typed> {
    Some(Typed::Path(match name {
        "workload" => Path::Workload,
        "offer" => Path::Offer,
        "attempts" => Path::Attempts,
        _ => return None,
    }))
}

fn literal(lit: &LiteralValue) -> Option<Typed> {
    Some(match lit {
        LiteralValue::Boolean(b) => Typed::Bool(BoolNode::Const(*b.inner())),
        LiteralValue::Int(i) => Typed::Int(IntNode::Const(*i.inner())),
        LiteralValue::Double(d) => Typed::Double(DoubleNode::Const(*d.inner())),
        LiteralValue::String(s) => Typed::Str(StrNode::Const(s.inner().to_owned())),
        _ => return None,
    })
}

fn field(on: Path, name: &str) -> Option<Typed> {
    use Typed::{Bool, Double, Int, List, Str};
    Some(match (on, name) {
        (Path::Offer, "provider") => Str(StrNode::Field(StrField::OfferProvider)),
        (Path::Offer, "id") => Str(StrNode::Field(StrField::OfferId)),
        (Path::Offer, "region") => Str(StrNode::Field(StrField::OfferRegion)),
        (Path::Offer, "gpu") => Typed::Path(Path::Gpu),
        (Path::Offer, "gpu_count") => Int(IntNode::Field(IntField::OfferGpuCount)),
        (Path::Offer, "disk_gib") => Int(IntNode::Field(IntField::OfferDiskGib)),
        (Path::Offer, "price_per_hour") => Double(DoubleNode::Field(DoubleField::OfferPrice)),
        (Path::Offer, "reliability") => Double(DoubleNode::Field(DoubleField::OfferReliability)),
        (Path::Offer, "spot") => Bool(BoolNode::Field(BoolField::OfferSpot)),
        (Path::Offer, "verified") => Bool(BoolNode::Field(BoolField::OfferVerified)),
        (Path::Gpu, "model") => Str(StrNode::Field(StrField::OfferGpuModel)),
        (Path::Gpu, "memory_gib") => Int(IntNode::Field(IntField::OfferGpuMemoryGib)),
        (Path::Workload, "gpu_count") => Int(IntNode::Field(IntField::WorkloadGpuCount)),
        (Path::Workload, "gpu_models") => List(ListNode::Field(ListField::WorkloadGpuModels)),
        (Path::Workload, "regions") => List(ListNode::Field(ListField::WorkloadRegions)),
        (Path::Workload, "max_price") => Double(DoubleNode::Field(DoubleField::WorkloadMaxPrice)),
        (Path::Workload, "image") => Str(StrNode::Field(StrField::WorkloadImage)),
        (Path::Workload, "capacity_type") => Str(StrNode::Field(StrField::WorkloadCapacityType)),
        (Path::Workload, "annotations") => Typed::Path(Path::Annotations),
        (Path::Annotations, key) => Str(StrNode::Annotation(Box::new(StrNode::Const(key.into())))),
        _ => return None,
    })
}

fn call(call: &CallExpr) -> Option<Typed> {
    let mut args = Vec::with_capacity(call.args.len() + 1);
    for a in call.target.iter().map(|t| &**t).chain(&call.args) {
        args.push(lower(a)?);
    }
    let name = call.func_name.as_str();
    let member = call.target.is_some();
    match (name, args.len()) {
        (op::LOGICAL_AND | op::LOGICAL_OR | op::EQUALS | op::NOT_EQUALS, 2) => binary(name, args),
        (op::LESS | op::LESS_EQUALS | op::GREATER | op::GREATER_EQUALS, 2) => binary(name, args),
        (op::ADD | op::SUBSTRACT | op::MULTIPLY | op::DIVIDE | op::MODULO, 2) => binary(name, args),
        (op::IN | op::INDEX, 2) => binary(name, args),
        ("startsWith" | "endsWith" | "contains", 2) if member => binary(name, args),
        (op::CONDITIONAL, 3) => conditional(args),
        (op::LOGICAL_NOT | op::NEGATE | "size" | "double", 1) => unary(name, args),
        _ => None,
    }
}

fn unary(name: &str, mut args: Vec<Typed>) -> Option<Typed> {
    use Typed::{Bool, Double, Int, List, Path as P, Str};
    Some(match (name, args.pop()?) {
        (op::LOGICAL_NOT, Bool(a)) => Bool(BoolNode::Not(Box::new(a))),
        (op::NEGATE, Int(a)) => Int(IntNode::Neg(Box::new(a))),
        (op::NEGATE, Double(a)) => Double(DoubleNode::Neg(Box::new(a))),
        ("size", Str(a)) => Int(IntNode::SizeStr(Box::new(a))),
        ("size", List(a)) => Int(IntNode::SizeList(a)),
        ("size", P(Path::Attempts)) => Int(IntNode::SizeAttempts),
        ("double", Int(a)) => Double(DoubleNode::FromInt(Box::new(a))),
        ("double", Double(a)) => Double(a),
        _ => return None,
    })
}

fn binary(name: &str, mut args: Vec<Typed>) -> Option<Typed> {
    let b = args.pop()?;
    let a = args.pop()?;
    if let Some(cmp) = comparison(name) {
        return compare(cmp, a, b).map(Typed::Bool);
    }
    if let Some(op) = arithmetic(name) {
        return arith(op, a, b);
    }
    use Typed::{Bool, List, Path as P, Str};
    let node = match (name, a, b) {
        (op::LOGICAL_AND, Bool(a), Bool(b)) => BoolNode::And(Box::new(a), Box::new(b)),
        (op::LOGICAL_OR, Bool(a), Bool(b)) => BoolNode::Or(Box::new(a), Box::new(b)),
        (op::IN, Str(a), List(l)) => BoolNode::InList(Box::new(a), l),
        (op::IN, Str(a), P(Path::Annotations)) => BoolNode::HasAnnotation(Box::new(a)),
        (op::INDEX, P(Path::Annotations), Str(k)) => {
            return Some(Str(StrNode::Annotation(Box::new(k))));
        }
        ("startsWith", Str(a), Str(b)) => BoolNode::Str(StrTest::StartsWith, bx(a), bx(b)),
        ("endsWith", Str(a), Str(b)) => BoolNode::Str(StrTest::EndsWith, bx(a), bx(b)),
        ("contains", Str(a), Str(b)) => BoolNode::Str(StrTest::Contains, bx(a), bx(b)),
        _ => return None,
    };
    Some(Bool(node))
}

fn bx<T>(t: T) -> Box<T> {
    Box::new(t)
}

fn comparison(name: &str) -> Option<Cmp> {
    Some(match name {
        op::EQUALS => Cmp::Eq,
        op::NOT_EQUALS => Cmp::Ne,
        op::LESS => Cmp::Lt,
        op::LESS_EQUALS => Cmp::Le,
        op::GREATER => Cmp::Gt,
        op::GREATER_EQUALS => Cmp::Ge,
        _ => return None,
    })
}

fn arithmetic(name: &str) -> Option<Arith> {
    Some(match name {
        op::ADD => Arith::Add,
        op::SUBSTRACT => Arith::Sub,
        op::MULTIPLY => Arith::Mul,
        op::DIVIDE => Arith::Div,
        op::MODULO => Arith::Rem,
        _ => return None,
    })
}

fn compare(cmp: Cmp, a: Typed, b: Typed) -> Option<BoolNode> {
    use Typed::{Bool, Double, Int, Str};
    let eq_only = matches!(cmp, Cmp::Eq | Cmp::Ne);
    Some(match (a, b) {
        (Int(a), Int(b)) => BoolNode::CmpInt(cmp, bx(a), bx(b)),
        (Double(a), Double(b)) => BoolNode::CmpDouble(cmp, bx(a), bx(b)),
        (Int(a), Double(b)) => BoolNode::CmpDouble(cmp, bx(DoubleNode::FromInt(bx(a))), bx(b)),
        (Double(a), Int(b)) => BoolNode::CmpDouble(cmp, bx(a), bx(DoubleNode::FromInt(bx(b)))),
        (Str(a), Str(b)) => BoolNode::CmpStr(cmp, bx(a), bx(b)),
        (Bool(a), Bool(b)) if eq_only => BoolNode::CmpBool(cmp, bx(a), bx(b)),
        _ => return None,
    })
}

fn arith(op: Arith, a: Typed, b: Typed) -> Option<Typed> {
    use Typed::{Double, Int};
    Some(match (a, b) {
        (Int(a), Int(b)) => Int(IntNode::Arith(op, bx(a), bx(b))),
        (Double(a), Double(b)) if op != Arith::Rem => Double(DoubleNode::Arith(op, bx(a), bx(b))),
        _ => return None,
    })
}

fn conditional(mut args: Vec<Typed>) -> Option<Typed> {
    use Typed::{Bool, Double, Int, Str};
    let (b, a) = (args.pop()?, args.pop()?);
    let Bool(c) = args.pop()? else { return None };
    let c = bx(c);
    Some(match (a, b) {
        (Bool(a), Bool(b)) => Bool(BoolNode::Cond(c, bx(a), bx(b))),
        (Int(a), Int(b)) => Int(IntNode::Cond(c, bx(a), bx(b))),
        (Double(a), Double(b)) => Double(DoubleNode::Cond(c, bx(a), bx(b))),
        (Str(a), Str(b)) => Str(StrNode::Cond(c, bx(a), bx(b))),
        _ => return None,
    })
}
