use chrono::TimeZone;
use neocloud_core::{GpuRequest, OfferCapacity};

use super::*;

fn spec() -> WorkloadSpec {
    WorkloadSpec {
        image: "img".to_owned(),
        gpu: GpuRequest {
            count: 2,
            accepted: GpuModel::accepted_by_name("H100"),
        },
        disk_gib: Some(50),
        capacity_type: CapacityType::Spot,
        regions: vec!["us-east-1".to_owned()],
        providers: vec![ProviderId::Vast, ProviderId::Runpod],
        max_price_per_hour: Some(4.0),
        rank: Some("-offer.price_per_hour".to_owned()),
        policy: Some("cheap".to_owned()),
        ..neocloud_fixtures::workload()
    }
}

fn offer_at(id: &str, region: &str, capacity: OfferCapacity) -> Offer {
    Offer {
        gpu: GpuModel::from_provider("A100 SXM4 80GB", Some(80)),
        gpu_count: 2,
        capacity,
        region: region.to_owned(),
        reliability: None,
        verified: false,
        disk_gib: None,
        ..neocloud_fixtures::offer(ProviderId::Vast, id, "A100", 3.0)
    }
}

#[test]
fn names_of_both_spellings_map_to_the_wit_gpu_models() {
    assert_eq!(gpu_model_named("A100-80GB"), wit::GpuModel::A10080gb);
    assert_eq!(gpu_model_named("rtx_4090"), wit::GpuModel::Rtx4090);
    assert_eq!(gpu_model_named("H100 SXM"), wit::GpuModel::H100);
    assert_eq!(gpu_model_named("A100 PCIe 40GB"), wit::GpuModel::A10040gb);
    assert_eq!(gpu_model_named("RTX A6000"), wit::GpuModel::A6000);
    assert_eq!(gpu_model_named("GH200"), wit::GpuModel::Other);
    assert_eq!(gpu_model_named("L40"), wit::GpuModel::L40);
    assert_eq!(gpu_model_named("L40S"), wit::GpuModel::L40s);
    let unknown = GpuModel::from_provider("Mystery X", None);
    assert_eq!(gpu_model(&unknown), wit::GpuModel::Other);
    assert_eq!(provider_named("RunPod"), wit::Provider::Runpod);
    assert_eq!(provider_named("azure"), wit::Provider::Other);
    for p in ProviderId::ALL {
        assert_eq!(provider_from_wit(provider(p)), Some(p));
    }
}

#[test]
fn a_workload_carries_its_models_limits_and_remaining_annotations() {
    let w = workload(&spec());
    assert_eq!(w.gpu_count, 2);
    assert!(!w.gpu_models.is_empty());
    assert!(w.gpu_models.iter().all(|m| *m == wit::GpuModel::H100));
    assert_eq!(w.max_price_per_hour, Some(4.0));
    assert_eq!(w.capacity_type, wit::CapacityType::Spot);
    let keys: Vec<(&str, &str)> = w
        .annotations
        .iter()
        .map(|a| (a.key.as_str(), a.value.as_str()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("cloud.aibrix.ai/providers", "vast,runpod"),
            ("cloud.aibrix.ai/disk-gb", "50"),
            ("cloud.aibrix.ai/rank", "-offer.price_per_hour"),
            ("cloud.aibrix.ai/policy", "cheap"),
        ]
    );
}

#[test]
fn offers_share_one_region_table_and_spot_offers_cost_their_minimum_bid() {
    let spot = OfferCapacity::Spot {
        min_bid_per_hour: 1.25,
    };
    let (a, b, c) = (
        offer_at("a", "eu", OfferCapacity::OnDemand),
        offer_at("b", "us", spot),
        offer_at("c", "eu", OfferCapacity::OnDemand),
    );
    let input = placement_input(workload(&spec()), &[&a, &b, &c]);
    assert_eq!(input.regions, vec!["eu".to_owned(), "us".to_owned()]);
    let regions: Vec<u32> = input.offers.iter().map(|o| o.region).collect();
    assert_eq!(regions, vec![0, 1, 0]);
    let o = &input.offers[1];
    assert!(o.spot && o.price_per_hour == 1.25 && o.reliability == 1.0 && !o.verified);
    assert_eq!(o.gpu_model, wit::GpuModel::A10080gb);
    assert_eq!((o.gpu_memory_gib, o.disk_gib), (80, 0));
    assert_eq!(pricing_input(workload(&spec()), &b).region, "us");
}

#[test]
fn attempts_keep_failures_and_the_last_one_carries_the_failure_being_handled() {
    let t0 = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap();
    let attempt = |n: u32, outcome: AttemptOutcome| Attempt {
        number: n,
        provider: ProviderId::Lambda,
        offer_id: format!("o{n}"),
        price_per_hour: 1.0,
        started_at: t0,
        outcome,
    };
    let failed = AttemptOutcome::Failed {
        class: FailureClass::Quota,
        code: None,
        message: "quota".to_owned(),
    };
    let rented = AttemptOutcome::Rented {
        instance_id: "i".to_owned(),
    };
    let list = [
        attempt(1, failed),
        attempt(2, rented),
        attempt(3, AttemptOutcome::InFlight),
    ];
    let now = t0 + chrono::Duration::milliseconds(1500);
    let got = attempts(&list, FailureClass::Capacity, now);
    assert_eq!(got.len(), 2, "the rented attempt in the middle is left out");
    assert_eq!(got[0].failure, wit::FailureClass::Quota);
    assert_eq!(got[0].message, "quota");
    assert_eq!(got[1].offer_id, "o3");
    assert_eq!(got[1].failure, wit::FailureClass::Capacity);
    assert_eq!(got[1].age_ms, 1500);
    assert_eq!(millis_since(now, t0), 0);
}

#[test]
fn every_failure_class_has_its_wit_twin() {
    for c in FailureClass::ALL {
        if c == FailureClass::OfferTaken {
            // Newer than the released WIT: guests see it as the capacity it used to be.
            assert_eq!(failure_class(c), wit::FailureClass::Capacity);
            continue;
        }
        let twin = failure_class(c);
        let debug = format!("{twin:?}").to_lowercase();
        let want = format!("::{}", c.label().replace('-', ""));
        assert!(debug.ends_with(&want), "{c} maps to {debug}");
    }
}

#[test]
fn guest_answers_become_our_actions_and_decisions() {
    use wit::FallbackAction as A;
    let retry = fallback_action(&A::RetrySame(250)).unwrap();
    assert_eq!(
        retry,
        FallbackAction::RetrySameOffer {
            after: Duration::from_millis(250)
        }
    );
    assert_eq!(
        fallback_action(&A::SkipProvider(wit::Provider::Vast)).unwrap(),
        FallbackAction::SkipProvider {
            provider: ProviderId::Vast
        }
    );
    assert!(fallback_action(&A::SkipProvider(wit::Provider::Other)).is_err());
    assert_eq!(
        fallback_action(&A::Wait(1000)).unwrap(),
        FallbackAction::Wait {
            duration: Duration::from_secs(1)
        }
    );
    let bid = wit::PriceDecision::Accept(wit::Bid {
        max_price_per_hour: 2.0,
        spot_bid_per_hour: Some(0.5),
    });
    assert_eq!(
        price_decision(&bid),
        PriceDecision::Accept {
            max_price_per_hour: 2.0,
            bid_per_hour: Some(0.5)
        }
    );
    let no = price_decision(&wit::PriceDecision::Reject("too dear".to_owned()));
    assert_eq!(
        no,
        PriceDecision::Reject {
            reason: "too dear".to_owned()
        }
    );
}

#[test]
fn an_order_scores_listed_offers_best_first_and_excludes_the_rest() {
    let (scores, excluded) = placement_scores(&wit::PlacementDecision::Order(vec![2, 0]), 3);
    assert_eq!(scores, vec![1.0, f64::NEG_INFINITY, 2.0]);
    assert_eq!(excluded, vec![false, true, false]);
    let (scores, excluded) = placement_scores(&wit::PlacementDecision::Scores(vec![0.5, -1.0]), 2);
    assert_eq!(scores, vec![0.5, -1.0]);
    assert_eq!(excluded, vec![false, true]);
}
