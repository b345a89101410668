//! The answer of a pricing policy for one offer: accept (with a ceiling and, for spot, a bid) or
//! reject with a reason.
//!
//! Not for enforcing prices; the broker's price guard does that with fresh data.

use serde::{Deserialize, Serialize};

/// A pricing policy's decision for one offer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum PriceDecision {
    /// Rent this offer.
    Accept {
        /// The most we pay per hour for the whole instance; checked again just before renting.
        max_price_per_hour: f64,
        /// The bid per hour for the whole instance on spot offers; `None` for on-demand.
        bid_per_hour: Option<f64>,
    },
    /// Do not rent this offer.
    Reject {
        /// Why, for the plan's explanation.
        reason: String,
    },
}
