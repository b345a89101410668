//! The price guard just before renting: the candidate's offer is looked up in fresh provider data
//! and its price checked again against the ceiling accepted at planning.
//!
//! Not for planning-time checks (see `planner::accepted_price`).

use neocloud_core::{FailureClass, Offer, OfferCapacity};

use crate::planner::Candidate;

/// The price to rent at, confirmed against fresh data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConfirmedPrice {
    /// What the instance will cost per hour.
    pub usd_per_hour: f64,
    /// The bid to send, for spot offers (raised to the fresh minimum bid when that is still
    /// within the ceiling).
    pub bid_per_hour: Option<f64>,
}

/// Why the fresh check refused the candidate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct PriceRefused {
    /// `OfferTaken` when the offer is gone (taken since planning), `PriceExceeded` when it costs
    /// too much now.
    pub class: FailureClass,
    /// What happened, naming the offer and the prices.
    pub message: String,
}

/// Checks a candidate against the same offer in fresh provider data (`None` if it is gone).
pub fn confirm(
    candidate: &Candidate,
    fresh: Option<&Offer>,
) -> Result<ConfirmedPrice, PriceRefused> {
    let planned = &candidate.offer;
    let Some(fresh) = fresh else {
        let message = format!(
            "offer {} no longer available on {}",
            planned.id, planned.provider
        );
        return Err(PriceRefused {
            class: FailureClass::OfferTaken,
            message,
        });
    };
    let (usd_per_hour, bid_per_hour) = match fresh.capacity {
        OfferCapacity::OnDemand => (fresh.price_per_hour, None),
        OfferCapacity::Spot { min_bid_per_hour } => {
            let bid = candidate
                .bid_per_hour
                .unwrap_or(min_bid_per_hour)
                .max(min_bid_per_hour);
            (bid, Some(bid))
        }
    };
    let ceiling = candidate.max_price_per_hour;
    if !(usd_per_hour.is_finite() && usd_per_hour >= 0.0 && usd_per_hour <= ceiling) {
        let message = format!(
            "offer {} on {} now costs ${usd_per_hour:.4}/h, above the maximum ${ceiling:.4}/h",
            fresh.id, fresh.provider
        );
        return Err(PriceRefused {
            class: FailureClass::PriceExceeded,
            message,
        });
    }
    Ok(ConfirmedPrice {
        usd_per_hour,
        bid_per_hour,
    })
}
