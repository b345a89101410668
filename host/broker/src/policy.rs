//! The hooks the planner calls for a Pod's constraint, its ranking and its price, with built-in
//! defaults. The node plugs the CEL and Wasm engines in behind these traits; this crate does not
//! depend on them.
//!
//! Not for hard constraints (see `constraints`), which no policy can loosen.

use std::fmt;

use neocloud_core::{Attempt, Offer, OfferCapacity, PriceDecision, WorkloadSpec};

/// A policy that failed to give an answer (a CEL runtime error, a Wasm trap).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy {policy} failed: {message}")]
pub struct PolicyError {
    /// Which policy or expression failed.
    pub policy: String,
    /// What went wrong.
    pub message: String,
}

impl PolicyError {
    /// A new error.
    pub fn new(policy: impl Into<String>, message: impl Into<String>) -> PolicyError {
        PolicyError {
            policy: policy.into(),
            message: message.into(),
        }
    }
}

/// The Pod's constraint (`cloud.aibrix.ai/constraints`): whether one offer is acceptable.
/// Called once per offer that passed the hard constraints; must be pure and fast.
pub trait OfferFilter: Send + Sync + fmt::Debug {
    /// `Ok(true)` keeps the offer; an error rejects this offer only and is reported.
    fn accepts(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<bool, PolicyError>;
}

/// The placement ranking (`cloud.aibrix.ai/rank` or a placement policy): higher is better.
pub trait OfferRanker: Send + Sync + fmt::Debug {
    /// Scores aligned with `offers`. The default calls [`OfferRanker::score`] per offer; a Wasm
    /// ranker overrides this to make one call for the whole list. An error fails the plan.
    fn rank(
        &self,
        w: &WorkloadSpec,
        offers: &[&Offer],
        attempts: &[Attempt],
    ) -> Result<Vec<f64>, PolicyError> {
        offers.iter().map(|o| self.score(w, o, attempts)).collect()
    }

    /// The score of one offer.
    fn score(&self, w: &WorkloadSpec, o: &Offer, attempts: &[Attempt]) -> Result<f64, PolicyError>;
}

/// The pricing policy: accept an offer with a ceiling and a bid, or reject it.
pub trait PricingPolicy: Send + Sync + fmt::Debug {
    /// The decision for one ranked candidate. An error rejects this candidate only.
    fn decide(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<PriceDecision, PolicyError>;
}

/// The default constraint: every offer is acceptable.
#[derive(Debug, Clone, Copy, Default)]
pub struct AcceptAll;

impl OfferFilter for AcceptAll {
    fn accepts(&self, _: &WorkloadSpec, _: &Offer, _: &[Attempt]) -> Result<bool, PolicyError> {
        Ok(true)
    }
}

/// The default ranking: cheapest first. Equal prices are ordered by the planner's tie-breaks
/// (higher reliability first, then provider preference, provider and offer id).
#[derive(Debug, Clone, Copy, Default)]
pub struct CheapestFirst;

impl OfferRanker for CheapestFirst {
    fn score(&self, _: &WorkloadSpec, o: &Offer, _: &[Attempt]) -> Result<f64, PolicyError> {
        Ok(-o.rent_price_per_hour())
    }
}

/// The default pricing: accept at the workload's max price (or the offer's price without one);
/// bid the provider's minimum on spot offers.
#[derive(Debug, Clone, Copy, Default)]
pub struct MinimumBid;

impl PricingPolicy for MinimumBid {
    fn decide(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        _: &[Attempt],
    ) -> Result<PriceDecision, PolicyError> {
        let bid_per_hour = match o.capacity {
            OfferCapacity::OnDemand => None,
            OfferCapacity::Spot { min_bid_per_hour } => Some(min_bid_per_hour),
        };
        let max_price_per_hour = w.max_price_per_hour.unwrap_or(o.rent_price_per_hour());
        Ok(PriceDecision::Accept {
            max_price_per_hour,
            bid_per_hour,
        })
    }
}
