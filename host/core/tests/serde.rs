//! Domain types survive a JSON round trip (the node stores them in binding statuses) and use the
//! documented spellings.

mod common;

use chrono::{TimeZone, Utc};
use neocloud_core::{
    Attempt, AttemptOutcome, FailureClass, FallbackAction, GpuModel, Offer, OfferCapacity,
    ProviderId, translate_pod,
};
use serde_json::json;

#[test]
fn a_translated_workload_round_trips_through_json() {
    let mut pod = common::minimal_pod();
    pod["metadata"]["annotations"] =
        json!({"cloud.aibrix.ai/gpu-type": "A100", "cloud.aibrix.ai/max-price": "2.5"});
    let w = translate_pod(&common::to_pod(pod)).unwrap();
    let text = serde_json::to_string(&w).unwrap();
    assert_eq!(
        serde_json::from_str::<neocloud_core::WorkloadSpec>(&text).unwrap(),
        w
    );
}

#[test]
fn attempts_and_actions_use_stable_spellings() {
    let attempt = Attempt {
        number: 2,
        provider: ProviderId::Vast,
        offer_id: "123".into(),
        price_per_hour: 0.4,
        started_at: Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap(),
        outcome: AttemptOutcome::Failed {
            class: FailureClass::RateLimited,
            code: Some("429".into()),
            message: "slow down".into(),
        },
    };
    let v = serde_json::to_value(&attempt).unwrap();
    assert_eq!(v["provider"], "vast");
    assert_eq!(v["outcome"]["result"], "failed");
    assert_eq!(v["outcome"]["class"], "rate-limited");
    assert_eq!(serde_json::from_value::<Attempt>(v).unwrap(), attempt);
    let skip = serde_json::to_value(FallbackAction::SkipProvider {
        provider: ProviderId::Lambda,
    })
    .unwrap();
    assert_eq!(
        skip,
        json!({"action": "skipProvider", "provider": "lambda"})
    );
}

#[test]
fn failure_classes_parse_from_their_labels() {
    for class in FailureClass::ALL {
        assert_eq!(class.label().parse::<FailureClass>().unwrap(), class);
    }
    assert_eq!(
        "capacityy".parse::<FailureClass>().unwrap_err().to_string(),
        "\"capacityy\" is not a failure class"
    );
}

#[test]
fn a_spot_offer_is_rented_at_its_minimum_bid() {
    let offer = Offer {
        provider: ProviderId::Runpod,
        id: "NVIDIA A40/COMMUNITY/US-KS-2".into(),
        gpu: GpuModel::from_provider("NVIDIA A40", Some(48)),
        gpu_count: 1,
        price_per_hour: 0.39,
        capacity: OfferCapacity::Spot {
            min_bid_per_hour: 0.2,
        },
        region: "US-KS-2".into(),
        reliability: None,
        verified: true,
        disk_gib: None,
        machine_id: None,
        runpod_cloud: None,
        expires_at: None,
    };
    assert_eq!(offer.rent_price_per_hour(), 0.2);
    let v = serde_json::to_value(&offer).unwrap();
    assert_eq!(
        v["capacity"],
        json!({"type": "spot", "min_bid_per_hour": 0.2})
    );
    assert_eq!(serde_json::from_value::<Offer>(v).unwrap(), offer);
}
