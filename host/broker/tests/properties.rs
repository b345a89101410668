//! Property tests of the broker's guarantees: a chosen offer satisfies every constraint, nothing
//! is rented above the max price, concurrent reservations never pass the budget, every fallback
//! sequence ends within its limits, and the same inputs give the same plan.

mod support;

use std::sync::Arc;
use std::time::Duration;

use neocloud_broker::{
    Backoff, BudgetGuard, DefaultFallback, Failure, FallbackContext, FallbackPolicy, Ladder,
    LadderLimits, OfferFilter, OfferRanker, PlanInput, Planner, PolicyError, Step,
};
use neocloud_core::{Attempt, FailureClass, FallbackAction, Offer, ProviderId, WorkloadSpec};
use proptest::prelude::*;
use support::{arb_offers, arb_workload, now, satisfies};

/// A Pod constraint: price at most a bound (stands in for a CEL expression).
#[derive(Debug)]
struct PriceAtMost(f64);

impl OfferFilter for PriceAtMost {
    fn accepts(&self, _: &WorkloadSpec, o: &Offer, _: &[Attempt]) -> Result<bool, PolicyError> {
        Ok(o.price_per_hour <= self.0)
    }
}

/// A ranking that scatters offers pseudo-randomly, so constraints cannot rely on price order.
#[derive(Debug)]
struct Scatter(u64);

impl OfferRanker for Scatter {
    fn score(&self, _: &WorkloadSpec, o: &Offer, _: &[Attempt]) -> Result<f64, PolicyError> {
        let h =
            o.id.bytes()
                .fold(self.0, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        Ok((h % 1000) as f64)
    }
}

fn planner(filter_max: f64, seed: u64, policy_max: Option<f64>) -> Planner {
    Planner {
        filter: Arc::new(PriceAtMost(filter_max)),
        ranker: Arc::new(Scatter(seed)),
        policy_max_price_per_hour: policy_max,
        max_candidates: 1000,
        ..Planner::default()
    }
}

fn input<'a>(w: &'a WorkloadSpec, offers: &'a [Offer]) -> PlanInput<'a> {
    PlanInput {
        workload: w,
        offers,
        attempts: &[],
        enabled: &[],
        skipped: &[],
        now: now(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_candidate_satisfies_every_constraint_and_none_that_does_is_lost(
        w in arb_workload(), offers in arb_offers(60), filter_max in 0.5f64..5.0, seed in any::<u64>(),
        policy_max in prop::option::of(0.5f64..4.0),
    ) {
        let plan = planner(filter_max, seed, policy_max).plan(&input(&w, &offers)).unwrap();
        for c in &plan.candidates {
            prop_assert!(satisfies(&w, &c.offer, policy_max), "violates a constraint: {:?}", c.offer);
            prop_assert!(c.offer.price_per_hour <= filter_max);
        }
        let fitting = offers.iter().filter(|o| satisfies(&w, o, policy_max) && o.price_per_hour <= filter_max).count();
        prop_assert_eq!(plan.candidates.len(), fitting);
    }

    #[test]
    fn no_candidate_is_priced_above_the_max_price(
        w in arb_workload(), offers in arb_offers(60), policy_max in prop::option::of(0.5f64..4.0),
    ) {
        let plan = Planner { policy_max_price_per_hour: policy_max, ..Planner::default() }.plan(&input(&w, &offers)).unwrap();
        let max = [w.max_price_per_hour, policy_max].into_iter().flatten().fold(f64::INFINITY, f64::min);
        for c in &plan.candidates {
            prop_assert!(c.max_price_per_hour <= max);
            prop_assert!(c.offer.rent_price_per_hour() <= c.max_price_per_hour);
            prop_assert!(c.bid_per_hour.is_none_or(|b| b <= c.max_price_per_hour));
        }
    }

    #[test]
    fn the_same_inputs_in_any_order_give_the_same_plan(
        w in arb_workload(), offers in arb_offers(60), seed in any::<u64>(), rotate in 0usize..60,
    ) {
        let p = planner(3.0, seed, None);
        let first = p.plan(&input(&w, &offers)).unwrap();
        let mut shuffled = offers.clone();
        shuffled.reverse();
        let len = shuffled.len().max(1);
        shuffled.rotate_left(rotate % len);
        let second = p.plan(&input(&w, &shuffled)).unwrap();
        prop_assert_eq!(first, second);
    }

    #[test]
    fn every_fallback_sequence_ends_within_its_limits(
        candidates in prop::collection::vec(0usize..3, 0..12),
        failures in prop::collection::vec((0usize..FailureClass::ALL.len(), prop::option::of(0u64..120), 0u64..30), 1..200),
        max_attempts in 1u32..15, max_total_s in 1u64..900, seed in any::<u64>(),
    ) {
        let limits = LadderLimits { max_attempts, max_total: Duration::from_secs(max_total_s) };
        let providers: Vec<ProviderId> = candidates.iter().map(|i| support::PROVIDERS[*i]).collect();
        let mut ladder = Ladder::new(limits, providers.clone());
        let policy = DefaultFallback { backoff: Backoff { seed, ..Backoff::default() }, ..DefaultFallback::default() };
        let w = support::workload();
        let mut elapsed = Duration::ZERO;
        let mut step = ladder.start();
        let mut steps = 0;
        loop {
            let (index, after) = match step {
                Step::GiveUp { .. } => break,
                Step::Try { index, after } => (index, after),
            };
            elapsed += after;
            prop_assert!(elapsed <= limits.max_total, "waited past the limit");
            prop_assert!(ladder.attempts() < max_attempts, "one attempt too many");
            ladder.attempted();
            let (class, retry_after, took) = failures[steps % failures.len()];
            elapsed += Duration::from_secs(took);
            let failure = Failure { class: FailureClass::ALL[class], provider: providers[index], retry_after: retry_after.map(Duration::from_secs) };
            let cx = FallbackContext { workload: &w, attempts: &[], failure, retries_of_offer: ladder.retries_of_current() };
            let action = policy.next_action(&cx).unwrap();
            if let FallbackAction::RetrySameOffer { after } = action {
                prop_assert!(after <= policy.backoff.cap);
            }
            step = ladder.after_failure(&action, elapsed);
            steps += 1;
            prop_assert!(steps <= max_attempts as usize, "the ladder did not stop");
        }
        prop_assert!(ladder.attempts() <= max_attempts);
    }

    #[test]
    fn any_policy_answer_is_bounded_by_the_ladder(
        actions in prop::collection::vec((0u8..5, 0u64..1000), 1..50),
        max_attempts in 1u32..20, max_total_s in 1u64..600,
    ) {
        let limits = LadderLimits { max_attempts, max_total: Duration::from_secs(max_total_s) };
        let mut ladder = Ladder::new(limits, vec![ProviderId::Vast, ProviderId::Runpod, ProviderId::Vast]);
        let (mut elapsed, mut step, mut n) = (Duration::ZERO, ladder.start(), 0usize);
        while let Step::Try { after, .. } = step {
            elapsed += after;
            prop_assert!(elapsed <= limits.max_total && ladder.attempts() < max_attempts);
            ladder.attempted();
            let (kind, secs) = actions[n % actions.len()];
            let d = Duration::from_secs(secs);
            let action = match kind {
                0 => FallbackAction::RetrySameOffer { after: d },
                1 => FallbackAction::Wait { duration: d },
                2 => FallbackAction::NextOffer,
                3 => FallbackAction::SkipProvider { provider: ProviderId::Vast },
                _ => FallbackAction::RetrySameOffer { after: Duration::ZERO },
            };
            step = ladder.after_failure(&action, elapsed);
            n += 1;
            prop_assert!(n <= max_attempts as usize);
        }
    }

    #[test]
    fn concurrent_reservations_never_exceed_the_budget(
        cap_cents in 100u64..2000,
        plans in prop::collection::vec(prop::collection::vec((1u64..400, 0u8..3), 1..30), 2..5),
    ) {
        let cap = cap_cents as f64 / 100.0;
        let guard = BudgetGuard::new(Some(cap));
        let cap_micros = cap_cents * 10_000;
        let threads: Vec<_> = plans.into_iter().enumerate().map(|(t, ops)| {
            let guard = Arc::clone(&guard);
            std::thread::spawn(move || {
                for (i, (cents, what)) in ops.into_iter().enumerate() {
                    let binding = format!("t{t}-b{i}");
                    if let Ok(r) = guard.reserve(cents as f64 / 100.0) {
                        assert!(guard.committed_and_in_flight_micros() <= cap_micros);
                        match what {
                            0 => drop(r),
                            1 => r.commit(&binding, cents as f64 / 100.0),
                            _ => { r.commit(&binding, cents as f64 / 200.0); guard.release(&binding); }
                        }
                    }
                    assert!(guard.committed_and_in_flight_micros() <= cap_micros);
                }
            })
        }).collect();
        for t in threads {
            t.join().expect("a thread saw the budget exceeded");
        }
        prop_assert!(guard.running_usd_per_hour() <= cap);
        prop_assert_eq!(guard.in_flight_usd_per_hour(), 0.0);
    }
}
