//! The real guest policies built from source (C placement, C pricing, JavaScript fallback) decide
//! as their sources say, import only what they are granted, and report what they are.

mod wasm_support;

use neocloud_policy::wasm::bindings::{
    FailureClass, FallbackAction, PlacementDecision, PriceDecision, Provider,
};
use neocloud_policy::wasm::{PolicySource, Role, WasmError};
use wasm_support::{
    attempt, engine, fallback_input, guest, load, offer, placement_input, pricing_input, settings,
    with_log,
};

fn scores(decision: &PlacementDecision) -> &[f64] {
    match decision {
        PlacementDecision::Scores(scores) => scores,
        other => panic!("expected scores, got {other:?}"),
    }
}

#[test]
fn c_placement_excludes_ineligible_offers_and_prefers_value_per_dollar() {
    let policy = load(&engine(), "placement-c", settings("c"));
    let input = placement_input(40);
    let evaluation = policy.place(&input);
    let scores = scores(evaluation.verdict.applied().expect("an answer"));
    for (i, score) in scores.iter().enumerate() {
        let o = offer(i);
        let model_ok = input.workload.gpu_models.contains(&o.gpu_model);
        let eligible = model_ok && o.price_per_hour <= 3.5 && o.verified;
        assert_eq!(*score >= 0.0, eligible, "offer {i}: {o:?} scored {score}");
        if eligible {
            let expected = o.reliability / o.price_per_hour;
            assert!(
                (score - expected).abs() < 1e-9,
                "offer {i}: {score} vs {expected}"
            );
        }
    }
}

#[test]
fn javascript_placement_scores_like_the_c_placement() {
    let engine = engine();
    let c = load(&engine, "placement-c", settings("c"));
    let js = load(&engine, "placement-js", with_log(settings("js")));
    let input = placement_input(50);
    let (c, js) = (c.place(&input), js.place(&input));
    let c = scores(c.verdict.applied().expect("c answers"));
    let js = scores(js.verdict.applied().expect("js answers"));
    assert_eq!(c.len(), js.len());
    for (i, (a, b)) in c.iter().zip(js).enumerate() {
        assert!((a - b).abs() < 1e-12, "offer {i}: c {a}, js {b}");
    }
}

#[test]
fn instantiating_alone_calls_nothing_and_succeeds() {
    let policy = load(&engine(), "placement-c", settings("c"));
    policy.instantiate().unwrap();
}

#[test]
fn c_placement_reports_its_world_digest_and_imports_nothing() {
    let policy = load(&engine(), "placement-c", settings("c"));
    let info = policy.info();
    assert_eq!(info.world, "neocloud:policy/placement-policy@0.1.0");
    assert_eq!(info.roles, vec![Role::Placement]);
    assert!(info.imports.is_empty(), "{:?}", info.imports);
    assert_eq!(info.digest.len(), 64);
    assert!(info.size > 1000);
}

#[test]
fn javascript_fallback_skips_a_provider_that_refused_credentials() {
    let policy = load(&engine(), "fallback-js", with_log(settings("js")));
    let input = fallback_input(vec![attempt(FailureClass::Auth, "o-1")], 3);
    let evaluation = policy.next(&input);
    let action = evaluation.verdict.applied().expect("an answer");
    assert_eq!(action, &FallbackAction::SkipProvider(Provider::Vast));
}

#[test]
fn javascript_fallback_moves_on_after_no_capacity_and_waits_when_nothing_is_left() {
    let policy = load(&engine(), "fallback-js", with_log(settings("js")));
    let attempts = vec![attempt(FailureClass::Capacity, "o-1")];
    let next = policy.next(&fallback_input(attempts.clone(), 2));
    assert_eq!(next.verdict.applied(), Some(&FallbackAction::NextOffer));
    let wait = policy.next(&fallback_input(attempts, 0));
    assert_eq!(wait.verdict.applied(), Some(&FallbackAction::Wait(30_000)));
}

#[test]
fn javascript_fallback_backs_off_when_rate_limited() {
    let policy = load(&engine(), "fallback-js", with_log(settings("js")));
    let attempts = vec![
        attempt(FailureClass::RateLimited, "o-1"),
        attempt(FailureClass::RateLimited, "o-1"),
    ];
    let evaluation = policy.next(&fallback_input(attempts, 2));
    assert_eq!(
        evaluation.verdict.applied(),
        Some(&FallbackAction::RetrySame(2000))
    );
}

#[test]
fn javascript_fallback_imports_only_the_log_and_no_wasi() {
    let policy = load(&engine(), "fallback-js", with_log(settings("js")));
    let imports = &policy.info().imports;
    assert_eq!(imports, &vec!["neocloud:policy/log@0.1.0".to_owned()]);
    assert_eq!(policy.info().roles, vec![Role::Fallback]);
}

#[test]
fn c_pricing_accepts_a_spot_offer_with_a_bid_and_logs_through_the_granted_log() {
    let policy = load(&engine(), "pricing-c", with_log(settings("pricing")));
    let evaluation = policy.price(&pricing_input(2.0, true));
    let Some(PriceDecision::Accept(bid)) = evaluation.verdict.applied() else {
        panic!("expected accept, got {evaluation:?}")
    };
    assert!((bid.max_price_per_hour - 3.5).abs() < 1e-9, "{bid:?}");
    assert!(
        (bid.spot_bid_per_hour.unwrap() - 2.2).abs() < 1e-9,
        "{bid:?}"
    );
    assert_eq!(evaluation.log.lines.len(), 1, "{:?}", evaluation.log);
    assert!(evaluation.log.lines[0].message.contains("accept"));
}

#[test]
fn c_pricing_rejects_an_offer_above_the_workload_maximum() {
    let policy = load(&engine(), "pricing-c", with_log(settings("pricing")));
    let evaluation = policy.price(&pricing_input(4.0, false));
    let Some(PriceDecision::Reject(reason)) = evaluation.verdict.applied() else {
        panic!("expected reject, got {evaluation:?}")
    };
    assert!(reason.contains("above"), "{reason}");
}

#[test]
fn a_guest_importing_the_log_without_the_grant_is_refused_at_load() {
    let error = engine()
        .load(&PolicySource::file(guest("pricing-c")), settings("no-log"))
        .unwrap_err();
    let WasmError::Link { message, .. } = &error else {
        panic!("expected a link error, got {error}")
    };
    assert!(message.contains("neocloud:policy/log"), "{message}");
}
