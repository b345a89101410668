//! Wrappers that count and time policy evaluations: each implements the policy trait it wraps,
//! delegates, and records `neocloud_policy_evaluations_total{policy,kind,outcome}` and
//! `neocloud_policy_evaluation_duration_seconds{policy,kind}`. One trait call is one evaluation:
//! a ranker's `rank` over a whole list counts once, as does each `score`.
//!
//! Not for enforcing policy budgets (the engines do) or changing any answer.

use std::sync::Arc;
use std::time::Instant;

use neocloud_broker::{
    FallbackContext, FallbackPolicy, OfferFilter, OfferRanker, PolicyError, PricingPolicy,
};
use neocloud_core::{Attempt, FallbackAction, Offer, PriceDecision, WorkloadSpec};

use super::{Metrics, PolicyKind};

/// What every wrapper holds besides its inner policy.
#[derive(Debug, Clone)]
struct Recorder {
    name: String,
    kind: PolicyKind,
    metrics: Arc<Metrics>,
}

impl Recorder {
    fn time<T>(&self, evaluate: impl FnOnce() -> Result<T, PolicyError>) -> Result<T, PolicyError> {
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "policy evaluation",
            "neocloud.policy" = %self.name,
            "neocloud.policy.kind" = self.kind.label(),
            "neocloud.outcome" = tracing::field::Empty,
        );
        let _entered = span.enter();
        let started = Instant::now();
        let result = evaluate();
        span.record(
            "neocloud.outcome",
            if result.is_ok() { "ok" } else { "error" },
        );
        self.metrics.observe_policy_evaluation(
            &self.name,
            self.kind,
            result.is_ok(),
            started.elapsed(),
        );
        result
    }
}

/// A ranker whose evaluations are recorded with kind `placement`.
#[derive(Debug, Clone)]
pub struct InstrumentedRanker {
    inner: Arc<dyn OfferRanker>,
    recorder: Recorder,
}

impl InstrumentedRanker {
    /// Wraps `inner`, recorded under the `policy` label `name`.
    pub fn new(
        inner: Arc<dyn OfferRanker>,
        name: impl Into<String>,
        metrics: Arc<Metrics>,
    ) -> InstrumentedRanker {
        let recorder = Recorder {
            name: name.into(),
            kind: PolicyKind::Placement,
            metrics,
        };
        InstrumentedRanker { inner, recorder }
    }
}

impl OfferRanker for InstrumentedRanker {
    /// Delegates to the inner `rank`, so a ranker that scores a whole list in one call (Wasm)
    /// keeps doing so.
    fn rank(
        &self,
        w: &WorkloadSpec,
        offers: &[&Offer],
        attempts: &[Attempt],
    ) -> Result<Vec<f64>, PolicyError> {
        self.recorder.time(|| self.inner.rank(w, offers, attempts))
    }

    fn score(&self, w: &WorkloadSpec, o: &Offer, attempts: &[Attempt]) -> Result<f64, PolicyError> {
        self.recorder.time(|| self.inner.score(w, o, attempts))
    }
}

/// A constraint whose evaluations are recorded with kind `filter`. A rejected offer
/// (`Ok(false)`) is outcome `ok`; only an error is `error`.
#[derive(Debug, Clone)]
pub struct InstrumentedFilter {
    inner: Arc<dyn OfferFilter>,
    recorder: Recorder,
}

impl InstrumentedFilter {
    /// Wraps `inner`, recorded under the `policy` label `name`.
    pub fn new(
        inner: Arc<dyn OfferFilter>,
        name: impl Into<String>,
        metrics: Arc<Metrics>,
    ) -> InstrumentedFilter {
        let recorder = Recorder {
            name: name.into(),
            kind: PolicyKind::Filter,
            metrics,
        };
        InstrumentedFilter { inner, recorder }
    }
}

impl OfferFilter for InstrumentedFilter {
    fn accepts(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<bool, PolicyError> {
        self.recorder.time(|| self.inner.accepts(w, o, attempts))
    }
}

/// A pricing policy whose evaluations are recorded with kind `pricing`. A `Reject` decision is
/// outcome `ok`; only an error is `error`.
#[derive(Debug, Clone)]
pub struct InstrumentedPricing {
    inner: Arc<dyn PricingPolicy>,
    recorder: Recorder,
}

impl InstrumentedPricing {
    /// Wraps `inner`, recorded under the `policy` label `name`.
    pub fn new(
        inner: Arc<dyn PricingPolicy>,
        name: impl Into<String>,
        metrics: Arc<Metrics>,
    ) -> InstrumentedPricing {
        let recorder = Recorder {
            name: name.into(),
            kind: PolicyKind::Pricing,
            metrics,
        };
        InstrumentedPricing { inner, recorder }
    }
}

impl PricingPolicy for InstrumentedPricing {
    fn decide(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<PriceDecision, PolicyError> {
        self.recorder.time(|| self.inner.decide(w, o, attempts))
    }
}

/// A fallback policy whose evaluations are recorded with kind `fallback`. A `GiveUp` action is
/// outcome `ok`; only an error is `error`.
#[derive(Debug, Clone)]
pub struct InstrumentedFallback {
    inner: Arc<dyn FallbackPolicy>,
    recorder: Recorder,
}

impl InstrumentedFallback {
    /// Wraps `inner`, recorded under the `policy` label `name`.
    pub fn new(
        inner: Arc<dyn FallbackPolicy>,
        name: impl Into<String>,
        metrics: Arc<Metrics>,
    ) -> InstrumentedFallback {
        let recorder = Recorder {
            name: name.into(),
            kind: PolicyKind::Fallback,
            metrics,
        };
        InstrumentedFallback { inner, recorder }
    }
}

impl FallbackPolicy for InstrumentedFallback {
    fn next_action(&self, cx: &FallbackContext<'_>) -> Result<FallbackAction, PolicyError> {
        self.recorder.time(|| self.inner.next_action(cx))
    }
}

#[cfg(test)]
mod tests {
    use neocloud_broker::{CheapestFirst, DefaultFallback, Failure, MinimumBid};
    use neocloud_core::{FailureClass, GpuModel, ProviderId};

    use super::*;
    use crate::metrics::tests::sample;

    /// A policy of every kind that always fails, as a trapping Wasm guest would.
    #[derive(Debug)]
    struct Broken;

    fn broken() -> PolicyError {
        PolicyError::new("broken", "guest trapped")
    }

    impl OfferFilter for Broken {
        fn accepts(&self, _: &WorkloadSpec, _: &Offer, _: &[Attempt]) -> Result<bool, PolicyError> {
            Err(broken())
        }
    }

    impl OfferRanker for Broken {
        fn score(&self, _: &WorkloadSpec, _: &Offer, _: &[Attempt]) -> Result<f64, PolicyError> {
            Err(broken())
        }
    }

    fn workload() -> WorkloadSpec {
        neocloud_fixtures::workload()
    }

    fn offer(id: &str, price: f64) -> Offer {
        Offer {
            gpu: GpuModel::from_provider("A100 SXM 80GB", Some(80)),
            region: "eu".to_owned(),
            reliability: None,
            disk_gib: None,
            ..neocloud_fixtures::offer(ProviderId::Fake, id, "A100", price)
        }
    }

    fn evaluations(m: &Metrics, policy: &str, kind: &str, outcome: &str) -> Option<f64> {
        let series = format!(
            r#"neocloud_policy_evaluations_total{{policy="{policy}",kind="{kind}",outcome="{outcome}"}}"#
        );
        sample(&m.encode(), &series)
    }

    fn timed(m: &Metrics, policy: &str, kind: &str) -> Option<f64> {
        let series = format!(
            r#"neocloud_policy_evaluation_duration_seconds_count{{policy="{policy}",kind="{kind}"}}"#
        );
        sample(&m.encode(), &series)
    }

    #[test]
    fn ranker_counts_one_evaluation_per_call_and_keeps_the_scores() {
        let m = Arc::new(Metrics::new());
        let ranker = InstrumentedRanker::new(Arc::new(CheapestFirst), "cheapest", m.clone());
        let (a, b) = (offer("a", 2.0), offer("b", 1.0));
        let scores = ranker.rank(&workload(), &[&a, &b], &[]).unwrap();
        assert_eq!(scores, vec![-2.0, -1.0]);
        assert_eq!(evaluations(&m, "cheapest", "placement", "ok"), Some(1.0));
        assert_eq!(timed(&m, "cheapest", "placement"), Some(1.0));

        let failing = InstrumentedRanker::new(Arc::new(Broken), "wasm", m.clone());
        failing.score(&workload(), &a, &[]).unwrap_err();
        assert_eq!(evaluations(&m, "wasm", "placement", "error"), Some(1.0));
    }

    #[test]
    fn filter_errors_are_counted_apart_from_answers() {
        let m = Arc::new(Metrics::new());
        let ok = InstrumentedFilter::new(Arc::new(neocloud_broker::AcceptAll), "all", m.clone());
        let bad = InstrumentedFilter::new(Arc::new(Broken), "cel", m.clone());
        let o = offer("a", 1.0);
        assert!(ok.accepts(&workload(), &o, &[]).unwrap());
        assert_eq!(bad.accepts(&workload(), &o, &[]), Err(broken()));
        assert_eq!(bad.accepts(&workload(), &o, &[]), Err(broken()));

        assert_eq!(evaluations(&m, "all", "filter", "ok"), Some(1.0));
        assert_eq!(evaluations(&m, "cel", "filter", "error"), Some(2.0));
        assert_eq!(evaluations(&m, "cel", "filter", "ok"), None);
        assert_eq!(timed(&m, "cel", "filter"), Some(2.0));
    }

    #[test]
    fn pricing_and_fallback_are_recorded_under_their_kinds() {
        let m = Arc::new(Metrics::new());
        let pricing = InstrumentedPricing::new(Arc::new(MinimumBid), "min-bid", m.clone());
        let decision = pricing.decide(&workload(), &offer("a", 1.5), &[]).unwrap();
        let accepted = PriceDecision::Accept {
            max_price_per_hour: 1.5,
            bid_per_hour: None,
        };
        assert_eq!(decision, accepted);

        let fallback =
            InstrumentedFallback::new(Arc::new(DefaultFallback::default()), "ladder", m.clone());
        let w = workload();
        let cx = FallbackContext {
            workload: &w,
            attempts: &[],
            failure: Failure {
                class: FailureClass::Capacity,
                provider: ProviderId::Fake,
                retry_after: None,
            },
            retries_of_offer: 0,
        };
        let action = fallback.next_action(&cx).unwrap();
        assert_eq!(action, FallbackAction::NextOffer);

        assert_eq!(evaluations(&m, "min-bid", "pricing", "ok"), Some(1.0));
        assert_eq!(evaluations(&m, "ladder", "fallback", "ok"), Some(1.0));
        assert_eq!(timed(&m, "ladder", "fallback"), Some(1.0));
    }
}
