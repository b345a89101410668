//! CEL constraints and ranks over GPU offers: `offer.price_per_hour <= 2.0 && offer.region
//! .startsWith("us-")` keeps an offer, `offer.reliability * 10.0 - offer.price_per_hour` ranks it.
//!
//! Expressions are written against three variables, `workload`, `offer` and `attempts`, whose
//! fields are documented in `README.md` next to this file and by [`CelWorkload`], [`CelOffer`]
//! and [`CelAttempt`]. The caller builds these views from its own domain types.
//!
//! [`CelEngine`] compiles an expression once (on a thread with a large stack) and caches it by
//! source and kind. Loading refuses, with the line:column: sources over the length or nesting
//! limits, unknown identifiers and fields, operands whose types can never work together (int
//! and double in arithmetic, a string ordered against a number, ...) and results of the wrong
//! type when they can be told before running, and expressions whose worst-case cost is over
//! the limit. Expressions made
//! only of fields, literals, operators and string tests run on a typed fast path with no
//! allocation; the rest (comprehensions over `attempts`, conversions, regexes, ...) run on the
//! `cel` crate's interpreter with one shared root context per batch. Both run under a deadline,
//! and runtime errors are classified ([`CelEvalErrorKind`]).
//!
//! This module is not for Wasm policies and does not decide what an error means for a Pod.

mod check;
mod compiled;
mod engine;
mod error;
mod interp;
mod limits;
mod lower;
mod ops;
mod schema;
mod typed;
mod views;

pub use compiled::{BatchResults, CompiledConstraint, CompiledRank};
pub use engine::CelEngine;
pub use error::{CelError, CelEvalError, CelEvalErrorKind, ExprKind, Position};
pub use limits::CelLimits;
pub use schema::{CelAttempt, CelGpu, CelInput, CelOffer, CelWorkload};
