//! Unit tests of the Vast translations: the bundles query, offers, statuses and instances.

use neocloud_core::{CapacityType, GpuModel, InstancePhase, OfferCapacity, OfferQuery, VastHints};
use serde_json::json;

use super::convert::{self, VastSearch};
use super::wire::{VastInstance, VastOffer};

fn search() -> VastSearch {
    VastSearch {
        verified: true,
        min_reliability: 0.95,
        disk_gib: 20,
        machine_id: Some(4242),
        offer_id: None,
        max_price_per_hour: Some(0.10),
        countries: vec!["US".into()],
    }
}

#[test]
fn constraints_and_hints_become_the_bundles_query() {
    let query = OfferQuery {
        gpu_models: vec!["A100".into(), "GTX 1070".into()],
        gpu_count: 1,
        capacity: Some(CapacityType::OnDemand),
    };
    let body = convert::bundles_query(&query, &search(), false, 50);
    assert_eq!(body["verified"], json!({"eq": true}));
    assert_eq!(body["reliability2"], json!({"gte": 0.95}));
    assert_eq!(body["dph_total"], json!({"lte": 0.10}));
    assert_eq!(body["disk_space"], json!({"gte": 20}));
    assert_eq!(body["machine_id"], json!({"eq": 4242}));
    assert_eq!(body["num_gpus"], json!({"eq": 1}));
    assert_eq!(body["geolocation"], json!({"in": ["US"]}));
    assert_eq!(
        body["gpu_name"],
        json!({"in": ["A100 PCIE", "A100 SXM4", "GTX 1070"]})
    );
    assert_eq!(body["type"], "on-demand");
    assert_eq!(body["limit"], 50);
    assert!(body.get("id").is_none());
}

#[test]
fn a_workloads_vast_hints_narrow_the_search() {
    let mut workload: neocloud_core::WorkloadSpec = serde_json::from_value(json!({
        "image": "busybox", "command": [], "args": [], "env": [], "envFrom": [], "ports": [],
        "gpu": {"count": 1, "accepted": []}, "diskGib": null, "capacityType": "on-demand",
        "regions": [], "providers": [], "maxPricePerHour": 0.1, "constraint": null, "rank": null,
        "policy": null, "hints": {"vast": {"verified": false, "machineId": null, "diskGib": 40,
            "offerId": 77, "minReliability": 0.99}, "runpodCloudType": null}
    }))
    .unwrap();
    let s = VastSearch::for_workload(&workload);
    assert!(!s.verified);
    assert_eq!(
        (s.disk_gib, s.offer_id, s.min_reliability),
        (40, Some(77), 0.99)
    );
    workload.hints.vast = VastHints::default();
    assert!(VastSearch::for_workload(&workload).verified);
}

#[test]
fn a_bid_offer_is_spot_at_its_minimum_bid_and_memory_resolves_ambiguous_names() {
    let offer: VastOffer = serde_json::from_value(json!({
        "id": 5000001, "gpu_name": "A100 SXM4", "num_gpus": 1, "gpu_ram": 81920, "dph_total": 0.66,
        "min_bid": 0.66, "reliability2": 0.995, "verification": "verified", "geolocation": "Dallas, US",
        "disk_space": 200, "machine_id": 1001
    }))
    .unwrap();
    let query = OfferQuery {
        gpu_models: vec!["A100".into()],
        gpu_count: 1,
        capacity: None,
    };
    let spot = convert::offer(&offer, &query, true).unwrap();
    assert_eq!(
        spot.capacity,
        OfferCapacity::Spot {
            min_bid_per_hour: 0.66
        }
    );
    assert_eq!(spot.gpu, GpuModel::from_provider("A100 SXM 80GB", None));
    assert!(spot.verified);
    let other = OfferQuery {
        gpu_models: vec!["H100".into()],
        ..query
    };
    assert!(convert::offer(&offer, &other, false).is_none());
}

/// Found by the `provider_responses` fuzz target (fuzz/regressions/provider_responses/).
#[test]
fn an_ask_without_gpus_is_no_offer_whatever_the_query() {
    let query = OfferQuery {
        gpu_models: vec![],
        gpu_count: 0,
        capacity: None,
    };
    for body in [
        json!({"id": 1234567, "verified": true, "geolocation": "Texas, US", "machine_id": 4242}),
        json!({"id": 7, "gpu_name": "RTX 4090", "num_gpus": 0, "dph_total": 0.3}),
    ] {
        let offer: VastOffer = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(convert::offer(&offer, &query, false), None, "{body}");
    }
}

fn instance(json: serde_json::Value) -> VastInstance {
    serde_json::from_value(json).unwrap()
}

#[test]
fn statuses_map_to_phases_including_outbid_and_dead_hosts() {
    let phase = |v| convert::phase(&instance(v));
    assert_eq!(
        phase(json!({"id": 1, "actual_status": null, "intended_status": "running"})),
        InstancePhase::Pending
    );
    assert_eq!(
        phase(json!({"id": 1, "actual_status": "loading"})),
        InstancePhase::Starting
    );
    assert_eq!(
        phase(json!({"id": 1, "actual_status": "stopped", "intended_status": "stopped"})),
        InstancePhase::Stopped
    );
    assert_eq!(
        phase(json!({"id": 1, "actual_status": "offline"})),
        InstancePhase::Failed
    );
    let oci = json!({"id": 1, "actual_status": "created", "status_msg": "Error: OCI runtime create failed: x"});
    assert_eq!(phase(oci), InstancePhase::Failed);
    assert_eq!(
        phase(json!({"id": 1, "actual_status": "running", "cur_state": "unloaded"})),
        InstancePhase::Terminated
    );
}

#[test]
fn a_running_instance_exposes_its_ssh_port_on_the_public_address() {
    let state = convert::state(&instance(json!({
        "id": 20000001, "label": "nc-1", "actual_status": "running", "gpu_name": "GTX 1070",
        "gpu_ram": 8192, "dph_total": 0.08, "geolocation": "Oslo, NO", "public_ipaddr": "203.0.113.5\n",
        "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "20001"}]}, "start_date": 1764670000.5
    })));
    assert_eq!(state.external_name, "nc-1");
    assert_eq!(state.phase, InstancePhase::Running);
    assert_eq!(state.endpoints[0].port, 20001);
    assert_eq!(state.endpoints[0].container_port, 22);
    assert_eq!(state.public_ip.as_deref(), Some("203.0.113.5"));
    assert!(state.created_at.is_some());
}
