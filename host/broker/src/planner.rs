//! The planner: from a workload and a set of offers to an ordered list of priced candidates, in
//! four steps (hard constraints, the Pod's constraint, ranking, pricing), with deterministic
//! tie-breaks and an explanation for Pod events.
//!
//! Pure and synchronous: it fetches nothing and rents nothing (see `catalog` and `rent`).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use neocloud_core::{Attempt, Offer, PriceDecision, ProviderId, WorkloadSpec};

use crate::constraints::{self, HardContext, Rejection};
use crate::explain;
use crate::policy::{
    AcceptAll, CheapestFirst, MinimumBid, OfferFilter, OfferRanker, PolicyError, PricingPolicy,
};

/// How many priced candidates a plan keeps (dstack tries at most 25 offers).
pub const DEFAULT_MAX_CANDIDATES: usize = 25;

/// The planner and the policies it calls.
#[derive(Debug, Clone)]
pub struct Planner {
    /// The Pod's constraint.
    pub filter: Arc<dyn OfferFilter>,
    /// The placement ranking.
    pub ranker: Arc<dyn OfferRanker>,
    /// The pricing policy.
    pub pricing: Arc<dyn PricingPolicy>,
    /// The policy's (or node's) max price per hour, on top of the Pod's.
    pub policy_max_price_per_hour: Option<f64>,
    /// Candidates kept, best first.
    pub max_candidates: usize,
}

impl Default for Planner {
    fn default() -> Self {
        Planner {
            filter: Arc::new(AcceptAll),
            ranker: Arc::new(CheapestFirst),
            pricing: Arc::new(MinimumBid),
            policy_max_price_per_hour: None,
            max_candidates: DEFAULT_MAX_CANDIDATES,
        }
    }
}

/// Everything one plan depends on. The same input always gives the same plan.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// The workload.
    pub workload: &'a WorkloadSpec,
    /// Offers from the catalog, in any order.
    pub offers: &'a [Offer],
    /// Attempts so far, passed to policies.
    pub attempts: &'a [Attempt],
    /// Providers enabled on this node; empty means all.
    pub enabled: &'a [ProviderId],
    /// Providers skipped by the fallback ladder.
    pub skipped: &'a [ProviderId],
    /// Now, for offer expiry.
    pub now: DateTime<Utc>,
}

/// One offer the plan would rent, with its price decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The offer.
    pub offer: Offer,
    /// The ranking score (higher is better).
    pub score: f64,
    /// The most we pay per hour for it: the lowest of the pricing policy's, the Pod's and the
    /// node policy's maximum. Checked again against fresh data before renting.
    pub max_price_per_hour: f64,
    /// The bid for spot offers.
    pub bid_per_hour: Option<f64>,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Candidates, best first (at most `max_candidates`).
    pub candidates: Vec<Candidate>,
    /// How many offers were considered.
    pub considered: usize,
    /// How many passed every check before the candidate cut.
    pub eligible: usize,
    /// Rejections per reason, with one example offer id each.
    pub rejected: BTreeMap<Rejection, (usize, String)>,
    /// The first policy error met, if any.
    pub policy_error: Option<PolicyError>,
    /// Why the winner won and the next candidates lost, for Pod events.
    pub explanation: String,
}

/// A scored offer during planning.
struct Scored<'a> {
    offer: &'a Offer,
    score: f64,
}

impl Planner {
    /// Plans. Fails only when the ranking policy fails; an empty plan is a valid answer whose
    /// explanation says why nothing fits.
    pub fn plan(&self, input: &PlanInput<'_>) -> Result<Plan, PolicyError> {
        let w = input.workload;
        let max_price = min_opt(w.max_price_per_hour, self.policy_max_price_per_hour);
        let hard = HardContext {
            enabled: input.enabled,
            skipped: input.skipped,
            max_price_per_hour: max_price,
            now: input.now,
        };
        let mut rejected = BTreeMap::new();
        let mut policy_error = None;
        let passed = self.screen(input, &hard, &mut rejected, &mut policy_error);
        let scored = self.rank(w, passed, input.attempts)?;
        let eligible = scored.len();
        let candidates = self.price(
            w,
            scored,
            max_price,
            input.attempts,
            &mut rejected,
            &mut policy_error,
        );
        let rejected = summarize(rejected);
        let mut plan = Plan {
            candidates,
            considered: input.offers.len(),
            eligible,
            rejected,
            policy_error,
            explanation: String::new(),
        };
        plan.explanation = explain::explain(&plan, w);
        Ok(plan)
    }

    /// Steps 1 and 2: hard constraints, then the Pod's constraint.
    fn screen<'a>(
        &self,
        input: &PlanInput<'a>,
        hard: &HardContext<'_>,
        rejected: &mut Tally<'a>,
        policy_error: &mut Option<PolicyError>,
    ) -> Vec<&'a Offer> {
        let w = input.workload;
        let mut passed = Vec::with_capacity(input.offers.len() / 4);
        for offer in input.offers {
            let verdict = constraints::check(w, offer, hard).and_then(|()| {
                match self.filter.accepts(w, offer, input.attempts) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(Rejection::Constraint),
                    Err(e) => {
                        policy_error.get_or_insert(e);
                        Err(Rejection::ConstraintError)
                    }
                }
            });
            match verdict {
                Ok(()) => passed.push(offer),
                Err(r) => note(rejected, r, offer),
            }
        }
        passed
    }

    fn rank<'a>(
        &self,
        w: &WorkloadSpec,
        passed: Vec<&'a Offer>,
        attempts: &[Attempt],
    ) -> Result<Vec<Scored<'a>>, PolicyError> {
        let scores = self.ranker.rank(w, &passed, attempts)?;
        if scores.len() != passed.len() {
            let message = format!(
                "returned {} scores for {} offers",
                scores.len(),
                passed.len()
            );
            return Err(PolicyError::new("rank", message));
        }
        if let Some(i) = scores.iter().position(|s| s.is_nan()) {
            return Err(PolicyError::new(
                "rank",
                format!("returned NaN for offer {}", passed[i].id),
            ));
        }
        let mut scored: Vec<Scored<'a>> = passed
            .into_iter()
            .zip(scores)
            .map(|(offer, score)| Scored { offer, score })
            .collect();
        scored.sort_by(|a, b| compare(w, a.offer, a.score, b.offer, b.score));
        Ok(scored)
    }

    fn price<'a>(
        &self,
        w: &WorkloadSpec,
        scored: Vec<Scored<'a>>,
        max_price: Option<f64>,
        attempts: &[Attempt],
        rejected: &mut Tally<'a>,
        policy_error: &mut Option<PolicyError>,
    ) -> Vec<Candidate> {
        let mut candidates = Vec::new();
        for s in scored {
            if candidates.len() >= self.max_candidates {
                break;
            }
            match self.pricing.decide(w, s.offer, attempts) {
                Ok(decision) => match accepted_price(s.offer, &decision, max_price) {
                    Some((max_price_per_hour, bid_per_hour)) => candidates.push(Candidate {
                        offer: s.offer.clone(),
                        score: s.score,
                        max_price_per_hour,
                        bid_per_hour,
                    }),
                    None => note(rejected, Rejection::Pricing, s.offer),
                },
                Err(e) => {
                    policy_error.get_or_insert(e);
                    note(rejected, Rejection::Pricing, s.offer);
                }
            }
        }
        candidates
    }
}

/// The price guard at planning: the accepted ceiling is the lowest of the policy's and the Pod's
/// maxima, the offer's rent price must be within it, and a spot bid must be at least the minimum
/// bid and at most the ceiling.
pub fn accepted_price(
    o: &Offer,
    d: &PriceDecision,
    max_price: Option<f64>,
) -> Option<(f64, Option<f64>)> {
    let PriceDecision::Accept {
        max_price_per_hour,
        bid_per_hour,
    } = d
    else {
        return None;
    };
    let ceiling = min_opt(Some(*max_price_per_hour), max_price)?;
    let rent = o.rent_price_per_hour();
    let bid_ok = bid_per_hour.is_none_or(|b| b.is_finite() && b >= rent && b <= ceiling);
    let spot_needs_bid = !o.capacity.is_spot() || bid_per_hour.is_some();
    (ceiling.is_finite() && constraints::price_ok(o, Some(ceiling)) && bid_ok && spot_needs_bid)
        .then_some((ceiling, *bid_per_hour))
}

fn min_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

type Tally<'a> = BTreeMap<Rejection, (usize, &'a Offer)>;

/// Counts a rejection; the example kept is the smallest offer (by provider and id) so that it
/// does not depend on the order offers arrived in.
fn note<'a>(rejected: &mut Tally<'a>, r: Rejection, o: &'a Offer) {
    let entry = rejected.entry(r).or_insert((0, o));
    entry.0 += 1;
    if (o.provider, &o.id) < (entry.1.provider, &entry.1.id) {
        entry.1 = o;
    }
}

fn summarize(rejected: Tally<'_>) -> BTreeMap<Rejection, (usize, String)> {
    let example = |o: &Offer| format!("{} offer {}", o.provider, o.id);
    rejected
        .into_iter()
        .map(|(r, (n, o))| (r, (n, example(o))))
        .collect()
}

/// The total order of candidates: score (higher first), then rent price (lower first), then
/// reliability (higher first, unknown last), then the Pod's provider preference, then provider,
/// then offer id. Offers are unique by (provider, id), so the order is total and deterministic.
pub fn compare(w: &WorkloadSpec, a: &Offer, sa: f64, b: &Offer, sb: f64) -> Ordering {
    let preference = |o: &Offer| {
        w.providers
            .iter()
            .position(|p| *p == o.provider)
            .unwrap_or(usize::MAX)
    };
    sb.total_cmp(&sa)
        .then_with(|| a.rent_price_per_hour().total_cmp(&b.rent_price_per_hour()))
        .then_with(|| {
            b.reliability
                .unwrap_or(-1.0)
                .total_cmp(&a.reliability.unwrap_or(-1.0))
        })
        .then_with(|| preference(a).cmp(&preference(b)))
        .then_with(|| a.provider.cmp(&b.provider))
        .then_with(|| a.id.cmp(&b.id))
}
