//! Checks a guest's answer before the host uses it: scores aligned with the offers and finite,
//! order indices in range and unique, prices finite and not negative, reasons bounded; and cuts a
//! guest error's message to its documented bound.
//!
//! Not for running guests. Everything here is pure and returns a reason string on rejection.

use super::bindings::{FallbackAction, PlacementDecision, PolicyError, PriceDecision};
use super::config::output_limits::{MAX_ERROR_MESSAGE_BYTES, MAX_REASON_BYTES};
use super::host::truncate_utf8;

/// A placement answer for `offers` offers: scores aligned and finite, or an order of unique
/// in-range indices.
pub fn placement(decision: &PlacementDecision, offers: usize) -> Result<(), String> {
    match decision {
        PlacementDecision::Scores(scores) => {
            if scores.len() != offers {
                return Err(format!("{} scores for {offers} offers", scores.len()));
            }
            match scores.iter().position(|s| !s.is_finite()) {
                Some(at) => Err(format!("score {at} is {}", scores[at])),
                None => Ok(()),
            }
        }
        PlacementDecision::Order(order) => check_order(order, offers),
    }
}

fn check_order(order: &[u32], offers: usize) -> Result<(), String> {
    if order.len() > offers {
        return Err(format!("order lists {} offers of {offers}", order.len()));
    }
    let mut seen = vec![false; offers];
    for &index in order {
        let slot = seen
            .get_mut(index as usize)
            .ok_or_else(|| format!("offer index {index} is out of range for {offers} offers"))?;
        if std::mem::replace(slot, true) {
            return Err(format!("offer index {index} is listed twice"));
        }
    }
    Ok(())
}

/// A fallback action: a give-up reason within its bound.
pub fn fallback(action: &FallbackAction) -> Result<(), String> {
    match action {
        FallbackAction::GiveUp(reason) => check_reason("give-up reason", reason),
        FallbackAction::RetrySame(_)
        | FallbackAction::NextOffer
        | FallbackAction::SkipProvider(_)
        | FallbackAction::Wait(_) => Ok(()),
    }
}

/// A pricing answer: finite, non-negative prices and a reject reason within its bound.
pub fn pricing(decision: &PriceDecision) -> Result<(), String> {
    match decision {
        PriceDecision::Accept(bid) => {
            check_price("max-price-per-hour", bid.max_price_per_hour)?;
            match bid.spot_bid_per_hour {
                Some(spot) => check_price("spot-bid-per-hour", spot),
                None => Ok(()),
            }
        }
        PriceDecision::Reject(reason) => check_reason("reject reason", reason),
    }
}

fn check_price(what: &str, price: f64) -> Result<(), String> {
    if price.is_finite() && price >= 0.0 {
        Ok(())
    } else {
        Err(format!("{what} is {price}"))
    }
}

fn check_reason(what: &str, reason: &str) -> Result<(), String> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(format!(
            "{what} is {} bytes, more than {MAX_REASON_BYTES}",
            reason.len()
        ));
    }
    Ok(())
}

/// The guest's error with its message cut to [`MAX_ERROR_MESSAGE_BYTES`].
pub fn guest_error(mut error: PolicyError) -> PolicyError {
    let keep = truncate_utf8(&error.message, MAX_ERROR_MESSAGE_BYTES).len();
    error.message.truncate(keep);
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_must_match_the_offer_count_and_be_finite() {
        assert!(placement(&PlacementDecision::Scores(vec![1.0, 2.0]), 2).is_ok());
        assert!(placement(&PlacementDecision::Scores(vec![1.0]), 2).is_err());
        assert!(placement(&PlacementDecision::Scores(vec![1.0, f64::NAN]), 2).is_err());
        assert!(placement(&PlacementDecision::Scores(vec![f64::INFINITY, 0.0]), 2).is_err());
    }

    #[test]
    fn order_rejects_out_of_range_and_repeated_indices() {
        assert!(placement(&PlacementDecision::Order(vec![2, 0]), 3).is_ok());
        assert!(placement(&PlacementDecision::Order(vec![3]), 3).is_err());
        assert!(placement(&PlacementDecision::Order(vec![1, 1]), 3).is_err());
        assert!(placement(&PlacementDecision::Order(vec![0, 1, 2, 0]), 3).is_err());
    }

    #[test]
    fn oversized_reasons_and_negative_prices_are_rejected() {
        let long = "x".repeat(MAX_REASON_BYTES + 1);
        assert!(fallback(&FallbackAction::GiveUp(long.clone())).is_err());
        assert!(fallback(&FallbackAction::GiveUp("no capacity".into())).is_ok());
        assert!(pricing(&PriceDecision::Reject(long)).is_err());
        let bid = |max| super::super::bindings::Bid {
            max_price_per_hour: max,
            spot_bid_per_hour: None,
        };
        assert!(pricing(&PriceDecision::Accept(bid(2.5))).is_ok());
        assert!(pricing(&PriceDecision::Accept(bid(-1.0))).is_err());
        assert!(pricing(&PriceDecision::Accept(bid(f64::NAN))).is_err());
    }
}
