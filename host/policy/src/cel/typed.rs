//! The typed fast path: expressions the lowering step fully understands become a tree of typed
//! nodes, evaluated directly over the input views with no `cel::Value`, no context and no
//! allocation. Trees are loop-free, so one evaluation costs at most one visit per node.
//!
//! Semantics follow the `cel` interpreter that runs everything else (and that the tests compare
//! against): checked integer arithmetic, numeric comparisons across int and double, and
//! `&&`/`||` that absorb an error when the other side decides the result.

use super::error::CelEvalError;
use super::schema::CelInput;

pub(crate) type R<T> = Result<T, CelEvalError>;

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    fn apply<T: PartialOrd + ?Sized>(self, a: &T, b: &T) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
        }
    }
}

/// An arithmetic operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// A string test between two strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StrTest {
    StartsWith,
    EndsWith,
    Contains,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BoolField {
    OfferSpot,
    OfferVerified,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntField {
    OfferGpuCount,
    OfferGpuMemoryGib,
    OfferDiskGib,
    WorkloadGpuCount,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DoubleField {
    OfferPrice,
    OfferReliability,
    WorkloadMaxPrice,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StrField {
    OfferProvider,
    OfferId,
    OfferGpuModel,
    OfferRegion,
    WorkloadCapacityType,
    WorkloadImage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListField {
    WorkloadGpuModels,
    WorkloadRegions,
}

#[derive(Debug)]
pub(crate) enum BoolNode {
    Const(bool),
    Field(BoolField),
    Not(Box<BoolNode>),
    And(Box<BoolNode>, Box<BoolNode>),
    Or(Box<BoolNode>, Box<BoolNode>),
    CmpBool(Cmp, Box<BoolNode>, Box<BoolNode>),
    CmpInt(Cmp, Box<IntNode>, Box<IntNode>),
    CmpDouble(Cmp, Box<DoubleNode>, Box<DoubleNode>),
    CmpStr(Cmp, Box<StrNode>, Box<StrNode>),
    Str(StrTest, Box<StrNode>, Box<StrNode>),
    InList(Box<StrNode>, ListNode),
    HasAnnotation(Box<StrNode>),
    Cond(Box<BoolNode>, Box<BoolNode>, Box<BoolNode>),
}

#[derive(Debug)]
pub(crate) enum IntNode {
    Const(i64),
    Field(IntField),
    Arith(Arith, Box<IntNode>, Box<IntNode>),
    Neg(Box<IntNode>),
    SizeStr(Box<StrNode>),
    SizeList(ListNode),
    SizeAttempts,
    Cond(Box<BoolNode>, Box<IntNode>, Box<IntNode>),
}

#[derive(Debug)]
pub(crate) enum DoubleNode {
    Const(f64),
    Field(DoubleField),
    /// Arithmetic on doubles (`Rem` is never built: CEL has no double remainder).
    Arith(Arith, Box<DoubleNode>, Box<DoubleNode>),
    Neg(Box<DoubleNode>),
    /// An int used where a double is compared, or converted with `double()`.
    FromInt(Box<IntNode>),
    Cond(Box<BoolNode>, Box<DoubleNode>, Box<DoubleNode>),
}

#[derive(Debug)]
pub(crate) enum StrNode {
    Const(String),
    Field(StrField),
    Annotation(Box<StrNode>),
    Cond(Box<BoolNode>, Box<StrNode>, Box<StrNode>),
}

#[derive(Debug)]
pub(crate) enum ListNode {
    Const(Vec<String>),
    Field(ListField),
}

impl BoolNode {
    pub(crate) fn eval(&self, i: &CelInput<'_>) -> R<bool> {
        Ok(match self {
            BoolNode::Const(b) => *b,
            BoolNode::Field(BoolField::OfferSpot) => i.offer.spot,
            BoolNode::Field(BoolField::OfferVerified) => i.offer.verified,
            BoolNode::Not(a) => !a.eval(i)?,
            BoolNode::And(a, b) => return logic(a.eval(i), || b.eval(i), false),
            BoolNode::Or(a, b) => return logic(a.eval(i), || b.eval(i), true),
            BoolNode::CmpBool(op, a, b) => op.apply(&a.eval(i)?, &b.eval(i)?),
            BoolNode::CmpInt(op, a, b) => op.apply(&a.eval(i)?, &b.eval(i)?),
            BoolNode::CmpDouble(op, a, b) => op.apply(&a.eval(i)?, &b.eval(i)?),
            BoolNode::CmpStr(op, a, b) => op.apply(a.eval(i)?, b.eval(i)?),
            BoolNode::Str(test, a, b) => str_test(*test, a.eval(i)?, b.eval(i)?),
            BoolNode::InList(a, list) => {
                let a = a.eval(i)?;
                list.eval(i).iter().any(|s| s == a)
            }
            BoolNode::HasAnnotation(k) => i.workload.annotations.contains_key(k.eval(i)?),
            BoolNode::Cond(c, a, b) => return if c.eval(i)? { a.eval(i) } else { b.eval(i) },
        })
    }
}

/// `&&` (`decisive` false) and `||` (`decisive` true): the decisive value wins over an error
/// on either side; otherwise the first error is returned.
fn logic(a: R<bool>, b: impl FnOnce() -> R<bool>, decisive: bool) -> R<bool> {
    match a {
        Ok(v) if v == decisive => Ok(v),
        Ok(_) => b(),
        Err(e) => match b() {
            Ok(v) if v == decisive => Ok(v),
            _ => Err(e),
        },
    }
}

fn str_test(test: StrTest, a: &str, b: &str) -> bool {
    match test {
        StrTest::StartsWith => a.starts_with(b),
        StrTest::EndsWith => a.ends_with(b),
        StrTest::Contains => a.contains(b),
    }
}

impl IntNode {
    pub(crate) fn eval(&self, i: &CelInput<'_>) -> R<i64> {
        Ok(match self {
            IntNode::Const(v) => *v,
            IntNode::Field(IntField::OfferGpuCount) => i.offer.gpu_count,
            IntNode::Field(IntField::OfferGpuMemoryGib) => i.offer.gpu.memory_gib,
            IntNode::Field(IntField::OfferDiskGib) => i.offer.disk_gib,
            IntNode::Field(IntField::WorkloadGpuCount) => i.workload.gpu_count,
            IntNode::Arith(op, a, b) => return int_arith(*op, a.eval(i)?, b.eval(i)?),
            IntNode::Neg(a) => {
                let a = a.eval(i)?;
                a.checked_neg().ok_or_else(|| overflow("-", a, 0))?
            }
            IntNode::SizeStr(s) => s.eval(i)?.chars().count() as i64,
            IntNode::SizeList(l) => l.eval(i).len() as i64,
            IntNode::SizeAttempts => i.attempts.len() as i64,
            IntNode::Cond(c, a, b) => return if c.eval(i)? { a.eval(i) } else { b.eval(i) },
        })
    }
}

fn int_arith(op: Arith, a: i64, b: i64) -> R<i64> {
    let (sym, v) = match op {
        Arith::Add => ("+", a.checked_add(b)),
        Arith::Sub => ("-", a.checked_sub(b)),
        Arith::Mul => ("*", a.checked_mul(b)),
        Arith::Div | Arith::Rem if b == 0 => {
            let message = format!("{a} {} 0", if op == Arith::Div { "/" } else { "%" });
            return Err(CelEvalError::DivisionByZero { message });
        }
        Arith::Div => ("/", a.checked_div(b)),
        Arith::Rem => ("%", a.checked_rem(b)),
    };
    v.ok_or_else(|| overflow(sym, a, b))
}

fn overflow(op: &str, a: i64, b: i64) -> CelEvalError {
    CelEvalError::Overflow {
        message: format!("{a} {op} {b}"),
    }
}

impl DoubleNode {
    pub(crate) fn eval(&self, i: &CelInput<'_>) -> R<f64> {
        Ok(match self {
            DoubleNode::Const(v) => *v,
            DoubleNode::Field(DoubleField::OfferPrice) => i.offer.price_per_hour,
            DoubleNode::Field(DoubleField::OfferReliability) => i.offer.reliability,
            DoubleNode::Field(DoubleField::WorkloadMaxPrice) => i.workload.max_price,
            DoubleNode::Arith(op, a, b) => {
                let (a, b) = (a.eval(i)?, b.eval(i)?);
                match op {
                    Arith::Add => a + b,
                    Arith::Sub => a - b,
                    Arith::Mul => a * b,
                    Arith::Div => a / b,
                    Arith::Rem => a % b,
                }
            }
            DoubleNode::Neg(a) => -a.eval(i)?,
            DoubleNode::FromInt(a) => a.eval(i)? as f64,
            DoubleNode::Cond(c, a, b) => return if c.eval(i)? { a.eval(i) } else { b.eval(i) },
        })
    }
}

impl StrNode {
    pub(crate) fn eval<'a>(&'a self, i: &CelInput<'a>) -> R<&'a str> {
        Ok(match self {
            StrNode::Const(s) => s,
            StrNode::Field(StrField::OfferProvider) => &i.offer.provider,
            StrNode::Field(StrField::OfferId) => &i.offer.id,
            StrNode::Field(StrField::OfferGpuModel) => &i.offer.gpu.model,
            StrNode::Field(StrField::OfferRegion) => &i.offer.region,
            StrNode::Field(StrField::WorkloadCapacityType) => &i.workload.capacity_type,
            StrNode::Field(StrField::WorkloadImage) => &i.workload.image,
            StrNode::Annotation(k) => {
                let k = k.eval(i)?;
                let v = i.workload.annotations.get(k);
                v.ok_or_else(|| CelEvalError::NoSuchKey { key: k.to_owned() })?
            }
            StrNode::Cond(c, a, b) => return if c.eval(i)? { a.eval(i) } else { b.eval(i) },
        })
    }
}

impl ListNode {
    fn eval<'a>(&'a self, i: &CelInput<'a>) -> &'a [String] {
        match self {
            ListNode::Const(v) => v,
            ListNode::Field(ListField::WorkloadGpuModels) => &i.workload.gpu_models,
            ListNode::Field(ListField::WorkloadRegions) => &i.workload.regions,
        }
    }
}
