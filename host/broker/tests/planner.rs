//! The planner on hand-made cases: hard constraints by name, the Pod's constraint, tie-breaks,
//! pricing, and the explanation text.

mod support;

use std::sync::Arc;

use chrono::Duration;
use neocloud_broker::{
    OfferFilter, OfferRanker, Plan, PlanInput, Planner, PolicyError, PricingPolicy, Rejection,
};
use neocloud_core::{
    Attempt, CapacityType, GpuModel, Offer, OfferCapacity, PriceDecision, ProviderId,
    RunpodCloudType, WorkloadSpec,
};
use support::{now, offer, workload};

const V: ProviderId = ProviderId::Vast;
const R: ProviderId = ProviderId::Runpod;
const L: ProviderId = ProviderId::Lambda;

fn plan_with(p: &Planner, w: &WorkloadSpec, offers: &[Offer]) -> Plan {
    let input = PlanInput {
        workload: w,
        offers,
        attempts: &[],
        enabled: &[],
        skipped: &[],
        now: now(),
    };
    p.plan(&input).unwrap()
}

fn plan(w: &WorkloadSpec, offers: &[Offer]) -> Plan {
    plan_with(&Planner::default(), w, offers)
}

fn chosen(p: &Plan) -> Vec<&str> {
    p.candidates.iter().map(|c| c.offer.id.as_str()).collect()
}

fn rejected_for(w: &WorkloadSpec, o: Offer) -> Vec<Rejection> {
    plan(w, &[o]).rejected.keys().copied().collect()
}

#[test]
fn each_hard_constraint_rejects_with_its_reason() {
    let mut w = workload();
    w.providers = vec![R, V];
    assert_eq!(
        rejected_for(&w, offer(L, "l", "A40", 1.0)),
        vec![Rejection::ProviderNotAllowed]
    );
    let mut w = workload();
    w.gpu.accepted = GpuModel::accepted_by_name("A100");
    assert_eq!(
        rejected_for(&w, offer(R, "r", "A40", 1.0)),
        vec![Rejection::GpuModel]
    );
    w.gpu.count = 2;
    assert_eq!(
        rejected_for(&w, offer(R, "r", "A100 SXM 80GB", 1.0)),
        vec![Rejection::GpuCount]
    );
    let mut w = workload();
    w.max_price_per_hour = Some(0.5);
    assert_eq!(
        rejected_for(&w, offer(R, "r", "A40", 0.51)),
        vec![Rejection::MaxPrice]
    );
    let mut spot = offer(R, "s", "A40", 1.0);
    spot.capacity = OfferCapacity::Spot {
        min_bid_per_hour: 0.3,
    };
    assert_eq!(
        rejected_for(&workload(), spot.clone()),
        vec![Rejection::CapacityType]
    );
    w.capacity_type = CapacityType::Spot;
    assert_eq!(
        chosen(&plan(&w, &[spot])),
        vec!["s"],
        "a spot offer is priced at its minimum bid"
    );
    let mut w = workload();
    w.regions = vec!["us".into()];
    let mut usa = offer(R, "r", "A40", 1.0);
    usa.region = "usa-1".into();
    assert_eq!(rejected_for(&w, usa), vec![Rejection::Region]);
    w.disk_gib = Some(500);
    assert_eq!(
        rejected_for(&w, offer(R, "r", "A40", 1.0)),
        vec![Rejection::Disk]
    );
    let mut expired = offer(R, "r", "A40", 1.0);
    expired.expires_at = Some(now() - Duration::seconds(1));
    assert_eq!(rejected_for(&workload(), expired), vec![Rejection::Expired]);
}

#[test]
fn vast_offers_follow_the_specification_defaults_and_pins() {
    let mut unverified = offer(V, "1", "A40", 0.3);
    unverified.verified = false;
    assert_eq!(
        rejected_for(&workload(), unverified.clone()),
        vec![Rejection::Unverified]
    );
    let mut w = workload();
    w.hints.vast.verified = false;
    assert_eq!(chosen(&plan(&w, &[unverified])), vec!["1"]);
    let mut flaky = offer(V, "2", "A40", 0.3);
    flaky.reliability = Some(0.94);
    assert_eq!(
        rejected_for(&workload(), flaky),
        vec![Rejection::Reliability]
    );
    let mut small = offer(V, "3", "A40", 0.3);
    small.disk_gib = Some(19);
    assert_eq!(rejected_for(&workload(), small), vec![Rejection::Disk]);
    let mut w = workload();
    w.hints.vast.offer_id = Some(7);
    assert_eq!(
        chosen(&plan(
            &w,
            &[offer(V, "6", "A40", 0.3), offer(V, "7", "A40", 0.4)]
        )),
        vec!["7"]
    );
    w.hints.vast.machine_id = Some(99);
    assert_eq!(
        rejected_for(&w, offer(V, "7", "A40", 0.3)),
        vec![Rejection::VastPin]
    );
}

#[test]
fn runpod_offers_follow_the_cloud_type_hint() {
    let mut community = offer(R, "c", "A40", 0.3);
    community.runpod_cloud = Some(RunpodCloudType::Community);
    let mut w = workload();
    w.hints.runpod_cloud_type = Some(RunpodCloudType::Secure);
    assert_eq!(
        rejected_for(&w, community.clone()),
        vec![Rejection::RunpodCloud]
    );
    w.hints.runpod_cloud_type = Some(RunpodCloudType::All);
    assert_eq!(chosen(&plan(&w, &[community])), vec!["c"]);
}

#[test]
fn equal_prices_are_ordered_by_reliability_then_provider_preference_then_id() {
    let mut w = workload();
    w.providers = vec![V, L, R];
    let mut less_reliable = offer(R, "a", "A40", 1.0);
    less_reliable.reliability = Some(0.96);
    let offers = [
        less_reliable,
        offer(R, "b", "A40", 1.0),
        offer(L, "c", "A40", 1.0),
        offer(V, "e", "A40", 1.0),
        offer(V, "d", "A40", 1.0),
    ];
    assert_eq!(chosen(&plan(&w, &offers)), vec!["d", "e", "c", "b", "a"]);
}

#[test]
fn the_explanation_names_the_winner_the_runners_up_and_the_rejections() {
    let mut w = workload();
    w.max_price_per_hour = Some(2.0);
    let mut unreliable = offer(R, "r2", "A40", 0.5);
    unreliable.reliability = Some(0.9);
    let offers = [
        offer(V, "v1", "A40", 0.5),
        unreliable,
        offer(L, "l1", "A40", 0.7),
        offer(R, "r9", "A40", 9.0),
    ];
    let text = plan(&w, &offers).explanation;
    assert_eq!(
        text,
        "chose vast offer v1 (A40 x1, us-east-1) at $0.5000/h: ranked first of 3 eligible offers (score -0.5000); \
         runpod offer r2 (A40 x1, us-east-1) lost: same score and price, lower reliability 0.900; \
         lambda offer l1 (A40 x1, us-east-1) lost: lower score -0.7000 < -0.5000. \
         rejected: 1 above max price (e.g. runpod offer r9)"
    );
}

#[test]
fn an_empty_plan_explains_why_nothing_fits() {
    let mut w = workload();
    w.gpu.accepted = GpuModel::accepted_by_name("H100 SXM");
    let text = plan(&w, &[offer(V, "v1", "A40", 0.5)]).explanation;
    assert_eq!(
        text,
        "no offer fits: 1 considered, none eligible and priced. rejected: 1 GPU model not accepted (e.g. vast offer v1)"
    );
}

#[derive(Debug)]
struct FailsOn(&'static str);

impl OfferFilter for FailsOn {
    fn accepts(&self, _: &WorkloadSpec, o: &Offer, _: &[Attempt]) -> Result<bool, PolicyError> {
        if o.id == self.0 {
            Err(PolicyError::new("constraints", "no such key: gpu.vram"))
        } else {
            Ok(true)
        }
    }
}

#[test]
fn a_constraint_error_rejects_only_that_offer_and_is_reported() {
    let p = Planner {
        filter: Arc::new(FailsOn("v1")),
        ..Planner::default()
    };
    let plan = plan_with(
        &p,
        &workload(),
        &[offer(V, "v1", "A40", 0.5), offer(R, "r1", "A40", 0.6)],
    );
    assert_eq!(chosen(&plan), vec!["r1"]);
    assert_eq!(plan.rejected[&Rejection::ConstraintError].0, 1);
    assert!(
        plan.explanation
            .ends_with("first policy error: policy constraints failed: no such key: gpu.vram"),
        "{}",
        plan.explanation
    );
}

#[derive(Debug)]
struct NanRanker;

impl OfferRanker for NanRanker {
    fn score(&self, _: &WorkloadSpec, _: &Offer, _: &[Attempt]) -> Result<f64, PolicyError> {
        Ok(f64::NAN)
    }
}

#[test]
fn a_ranking_that_returns_nan_fails_the_plan() {
    let p = Planner {
        ranker: Arc::new(NanRanker),
        ..Planner::default()
    };
    let input = PlanInput {
        workload: &workload(),
        offers: &[offer(V, "v1", "A40", 0.5)],
        attempts: &[],
        enabled: &[],
        skipped: &[],
        now: now(),
    };
    assert_eq!(
        p.plan(&input).unwrap_err().to_string(),
        "policy rank failed: returned NaN for offer v1"
    );
}

#[derive(Debug)]
struct Greedy;

impl PricingPolicy for Greedy {
    fn decide(
        &self,
        _: &WorkloadSpec,
        o: &Offer,
        _: &[Attempt],
    ) -> Result<PriceDecision, PolicyError> {
        if o.id == "no" {
            return Ok(PriceDecision::Reject {
                reason: "too pricey".into(),
            });
        }
        Ok(PriceDecision::Accept {
            max_price_per_hour: 100.0,
            bid_per_hour: None,
        })
    }
}

#[test]
fn a_pricing_policy_cannot_raise_the_ceiling_above_the_pods_max_price() {
    let mut w = workload();
    w.max_price_per_hour = Some(1.0);
    let p = Planner {
        pricing: Arc::new(Greedy),
        policy_max_price_per_hour: Some(0.8),
        ..Planner::default()
    };
    let plan = plan_with(
        &p,
        &w,
        &[offer(V, "ok", "A40", 0.5), offer(V, "no", "A40", 0.4)],
    );
    assert_eq!(chosen(&plan), vec!["ok"]);
    assert_eq!(plan.candidates[0].max_price_per_hour, 0.8);
    assert_eq!(plan.rejected[&Rejection::Pricing].0, 1);
}

#[test]
fn skipped_and_disabled_providers_are_never_planned() {
    let offers = [
        offer(V, "v1", "A40", 0.5),
        offer(R, "r1", "A40", 0.6),
        offer(L, "l1", "A40", 0.7),
    ];
    let w = workload();
    let input = PlanInput {
        workload: &w,
        offers: &offers,
        attempts: &[],
        enabled: &[V, R],
        skipped: &[V],
        now: now(),
    };
    assert_eq!(
        chosen(&Planner::default().plan(&input).unwrap()),
        vec!["r1"]
    );
}
