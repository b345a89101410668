//! The Pod's CEL constraint and rank, compiled by the policy engine, drive the planner: the
//! views carry the offer's fields under the names the CEL schema documents, a rank reorders
//! candidates, and a runtime error names the expression and its class.

mod support;

use std::sync::Arc;

use neocloud_broker::cel::{attempt_view, offer_view};
use neocloud_broker::{CelFilter, CelRanker, OfferFilter, PlanInput, Planner};
use neocloud_core::{Attempt, AttemptOutcome, FailureClass, Offer, ProviderId};
use neocloud_policy::cel::{CelEngine, CelLimits};
use support::{now, offer, workload};

fn offers() -> Vec<Offer> {
    let mut cheap_eu = offer(ProviderId::Vast, "v-eu", "A40", 0.40);
    cheap_eu.region = "eu-central-1".into();
    let mut flaky = offer(ProviderId::Vast, "v-flaky", "RTX 4090", 0.30);
    flaky.reliability = Some(0.80);
    vec![
        cheap_eu,
        flaky,
        offer(ProviderId::Runpod, "r-a40", "A40", 0.44),
        offer(ProviderId::Lambda, "l-h100", "H100 SXM", 2.49),
    ]
}

fn ids(planner: &Planner, offers: &[Offer]) -> Vec<String> {
    let w = workload();
    let input = PlanInput {
        workload: &w,
        offers,
        attempts: &[],
        enabled: &[],
        skipped: &[],
        now: now(),
    };
    planner
        .plan(&input)
        .unwrap()
        .candidates
        .iter()
        .map(|c| c.offer.id.clone())
        .collect()
}

#[test]
fn a_cel_constraint_keeps_only_the_offers_it_accepts() {
    let engine = CelEngine::new(CelLimits::default());
    let src = r#"offer.region.startsWith("us-") && offer.reliability >= 0.9 && offer.gpu.memory_gib >= 40"#;
    let filter = CelFilter::new(engine.compile_constraint(src).unwrap(), &workload());
    let planner = Planner {
        filter: Arc::new(filter),
        ..Planner::default()
    };
    assert_eq!(ids(&planner, &offers()), ["r-a40", "l-h100"]);
}

#[test]
fn a_cel_rank_orders_candidates_highest_first() {
    let engine = CelEngine::new(CelLimits::default());
    assert_eq!(
        ids(&Planner::default(), &offers()),
        ["v-eu", "r-a40", "l-h100"],
        "cheapest first"
    );
    let rank = engine
        .compile_rank("offer.price_per_hour * double(offer.gpu.memory_gib)")
        .unwrap();
    let ranker = Arc::new(CelRanker::new(rank, &workload()));
    let planner = Planner {
        ranker,
        ..Planner::default()
    };
    assert_eq!(ids(&planner, &offers()), ["l-h100", "r-a40", "v-eu"]);
}

#[test]
fn a_cel_runtime_error_names_the_expression_and_its_class() {
    let engine = CelEngine::new(CelLimits::default());
    let src = "1 / (offer.gpu_count - 1) > 0";
    let filter = CelFilter::new(engine.compile_constraint(src).unwrap(), &workload());
    let err = filter.accepts(&workload(), &offers()[2], &[]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(src), "{text}");
    assert!(text.contains("division_by_zero"), "{text}");
}

#[test]
fn views_use_the_documented_defaults_for_unknown_values() {
    let mut o = offer(ProviderId::Vast, "v-1", "Mystery GPU 9000", 0.2);
    o.reliability = None;
    o.disk_gib = None;
    let view = offer_view(&o);
    assert_eq!(
        (view.provider.as_str(), view.reliability, view.disk_gib),
        ("vast", 1.0, 0)
    );
    assert_eq!(
        (view.gpu.model.as_str(), view.gpu.memory_gib),
        ("Mystery GPU 9000", 0)
    );
    let attempt = Attempt {
        number: 1,
        provider: ProviderId::Vast,
        offer_id: "v-1".into(),
        price_per_hour: 0.2,
        started_at: now(),
        outcome: AttemptOutcome::Failed {
            class: FailureClass::Capacity,
            code: None,
            message: "no machine".into(),
        },
    };
    let view = attempt_view(&attempt);
    assert_eq!(
        (view.failure_class.as_str(), view.message.as_str()),
        ("capacity", "no machine")
    );
}
