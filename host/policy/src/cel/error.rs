//! Errors of the CEL engine: [`CelError`] when an expression loads, [`CelEvalError`] when it
//! runs. Load errors carry the expression and the line:column they point at; evaluation errors
//! are classified ([`CelEvalErrorKind`]) so callers can count and report them without parsing
//! messages.

use std::fmt;
use std::time::Duration;

/// A 1-based line and column (in characters) in an expression's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub line: u32,
    pub column: u32,
}

impl Position {
    /// The position of the character starting at byte `offset` (0-based) of `source`.
    pub fn of_byte_offset(source: &str, offset: usize) -> Self {
        let (mut line, mut column) = (1, 1);
        for (_, c) in source.char_indices().take_while(|(i, _)| *i < offset) {
            if c == '\n' {
                line += 1;
                column = 1;
            } else {
                column += 1;
            }
        }
        Position { line, column }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Which kind of expression is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExprKind {
    /// A boolean constraint: an offer is kept when it is true.
    Constraint,
    /// A numeric rank: higher is better.
    Rank,
}

impl ExprKind {
    pub(crate) fn expected(self) -> &'static str {
        match self {
            ExprKind::Constraint => "bool",
            ExprKind::Rank => "a number (int or double)",
        }
    }
}

impl fmt::Display for ExprKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExprKind::Constraint => "constraint",
            ExprKind::Rank => "rank",
        })
    }
}

/// Why an expression was refused when it loaded.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum CelError {
    #[error("{kind} expression is {len} bytes long, more than the limit of {max}")]
    SourceTooLong {
        kind: ExprKind,
        len: usize,
        max: usize,
    },
    #[error("{kind} expression nests deeper than the limit of {max} at {at} in `{expression}`")]
    TooDeeplyNested {
        kind: ExprKind,
        max: usize,
        at: Position,
        expression: String,
    },
    #[error("failed to parse {kind} expression at {at}: {message} in `{expression}`")]
    Parse {
        kind: ExprKind,
        at: Position,
        message: String,
        expression: String,
    },
    #[error(
        "unknown identifier `{name}` at {at} in `{expression}`; \
         the declared variables are workload, offer and attempts"
    )]
    UnknownIdentifier {
        name: String,
        at: Position,
        expression: String,
    },
    #[error("unknown field `{field}` on {on} at {at} in `{expression}`; known fields: {known}")]
    UnknownField {
        field: String,
        on: &'static str,
        known: String,
        at: Position,
        expression: String,
    },
    #[error(
        "{kind} expression must return {expected} but returns {found} at {at} in `{expression}`"
    )]
    WrongResultType {
        kind: ExprKind,
        expected: &'static str,
        found: &'static str,
        at: Position,
        expression: String,
    },
    #[error("{kind} expression has a type error at {at} in `{expression}`: {problem}; {hint}")]
    TypeMismatch {
        kind: ExprKind,
        problem: String,
        hint: String,
        at: Position,
        expression: String,
    },
    #[error(
        "{kind} expression may cost up to {cost} steps, more than the limit of {max}: `{expression}`"
    )]
    TooExpensive {
        kind: ExprKind,
        cost: u64,
        max: u64,
        expression: String,
    },
    #[error("failed to compile {kind} expression: the compiler thread {reason}")]
    CompilerThread { kind: ExprKind, reason: String },
}

impl CelError {
    /// Where in the source the error is, when it points somewhere.
    pub fn position(&self) -> Option<Position> {
        match self {
            Self::TooDeeplyNested { at, .. }
            | Self::Parse { at, .. }
            | Self::UnknownIdentifier { at, .. }
            | Self::UnknownField { at, .. }
            | Self::WrongResultType { at, .. }
            | Self::TypeMismatch { at, .. } => Some(*at),
            Self::SourceTooLong { .. }
            | Self::TooExpensive { .. }
            | Self::CompilerThread { .. } => None,
        }
    }
}

/// What went wrong while evaluating, for metrics and for deciding whether to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CelEvalErrorKind {
    NoSuchKey,
    TypeMismatch,
    DivisionByZero,
    Overflow,
    IndexOutOfBounds,
    UndeclaredReference,
    WrongResultType,
    InputTooLarge,
    DeadlineExceeded,
    Other,
}

impl CelEvalErrorKind {
    /// A short, stable label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            CelEvalErrorKind::NoSuchKey => "no_such_key",
            CelEvalErrorKind::TypeMismatch => "type_mismatch",
            CelEvalErrorKind::DivisionByZero => "division_by_zero",
            CelEvalErrorKind::Overflow => "overflow",
            CelEvalErrorKind::IndexOutOfBounds => "index_out_of_bounds",
            CelEvalErrorKind::UndeclaredReference => "undeclared_reference",
            CelEvalErrorKind::WrongResultType => "wrong_result_type",
            CelEvalErrorKind::InputTooLarge => "input_too_large",
            CelEvalErrorKind::DeadlineExceeded => "deadline_exceeded",
            CelEvalErrorKind::Other => "other",
        }
    }
}

/// Why an evaluation failed. Never transient except [`CelEvalError::DeadlineExceeded`].
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum CelEvalError {
    #[error("no such key: {key}")]
    NoSuchKey { key: String },
    #[error("type mismatch: {message}")]
    TypeMismatch { message: String },
    #[error("division by zero: {message}")]
    DivisionByZero { message: String },
    #[error("integer overflow: {message}")]
    Overflow { message: String },
    #[error("index out of bounds: {message}")]
    IndexOutOfBounds { message: String },
    #[error("undeclared reference to `{name}`")]
    UndeclaredReference { name: String },
    #[error("{kind} expression returned {found}, expected {expected}")]
    WrongResultType {
        kind: ExprKind,
        expected: &'static str,
        found: String,
    },
    #[error("input {what} has {len} entries, more than the limit of {max}")]
    InputTooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("evaluation ran {elapsed:?}, past its deadline of {deadline:?}")]
    DeadlineExceeded {
        deadline: Duration,
        elapsed: Duration,
    },
    #[error("evaluation failed: {message}")]
    Other { message: String },
}

impl CelEvalError {
    /// The class of this error.
    pub fn kind(&self) -> CelEvalErrorKind {
        match self {
            CelEvalError::NoSuchKey { .. } => CelEvalErrorKind::NoSuchKey,
            CelEvalError::TypeMismatch { .. } => CelEvalErrorKind::TypeMismatch,
            CelEvalError::DivisionByZero { .. } => CelEvalErrorKind::DivisionByZero,
            CelEvalError::Overflow { .. } => CelEvalErrorKind::Overflow,
            CelEvalError::IndexOutOfBounds { .. } => CelEvalErrorKind::IndexOutOfBounds,
            CelEvalError::UndeclaredReference { .. } => CelEvalErrorKind::UndeclaredReference,
            CelEvalError::WrongResultType { .. } => CelEvalErrorKind::WrongResultType,
            CelEvalError::InputTooLarge { .. } => CelEvalErrorKind::InputTooLarge,
            CelEvalError::DeadlineExceeded { .. } => CelEvalErrorKind::DeadlineExceeded,
            CelEvalError::Other { .. } => CelEvalErrorKind::Other,
        }
    }

    /// Whether evaluating again might succeed (only a missed deadline).
    pub fn is_transient(&self) -> bool {
        matches!(self, CelEvalError::DeadlineExceeded { .. })
    }
}

/// Classifies an interpreter error.
impl From<cel::ExecutionError> for CelEvalError {
    fn from(e: cel::ExecutionError) -> Self {
        use cel::ExecutionError as E;
        let message = e.to_string();
        match e {
            E::NoSuchKey(key) => CelEvalError::NoSuchKey {
                key: key.to_string(),
            },
            E::UndeclaredReference(name) => CelEvalError::UndeclaredReference {
                name: name.to_string(),
            },
            E::DivisionByZero(_) | E::RemainderByZero(_) => {
                CelEvalError::DivisionByZero { message }
            }
            E::Overflow(..) => CelEvalError::Overflow { message },
            E::IndexOutOfBounds(_) => CelEvalError::IndexOutOfBounds { message },
            E::NoSuchOverload(_)
            | E::UnexpectedType { .. }
            | E::ValuesNotComparable(..)
            | E::UnsupportedBinaryOperator(..)
            | E::UnsupportedIndex(..)
            | E::UnsupportedKeyType(_)
            | E::UnsupportedTargetType { .. }
            | E::NotSupportedAsMethod { .. }
            | E::InvalidArgumentCount { .. } => CelEvalError::TypeMismatch { message },
            _ => CelEvalError::Other { message },
        }
    }
}

/// A short excerpt of an expression for messages: at most 160 characters.
pub(crate) fn excerpt(source: &str) -> String {
    const MAX: usize = 160;
    match source.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &source[..cut]),
        None => source.to_owned(),
    }
}
