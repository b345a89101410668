//! Unit tests of the RunPod translations: offer ids, catalog entries, statuses, pods and
//! create bodies.

use std::collections::HashMap;

use neocloud_core::{
    CapacityType, GpuModel, InstancePhase, OfferCapacity, OfferQuery, RunpodCloudType,
};
use serde_json::json;

use super::convert::{self, Placement};
use super::wire::{CatalogGpu, CreatePod, Pod, PodGpu};

fn catalog_gpu() -> CatalogGpu {
    serde_json::from_value(json!({
        "id": "NVIDIA A40", "name": "A40", "memory": 48, "secure": true, "community": true,
        "price": {"secure": 0.40, "community": 0.35},
        "maxCount": {"secure": 8, "community": 2},
        "dataCenters": [{"id": "CA-MTL-1", "availability": "HIGH"}, {"id": "EU-SE-1", "availability": "NONE"}]
    }))
    .unwrap()
}

fn query(capacity: CapacityType, count: u32) -> OfferQuery {
    OfferQuery {
        gpu_models: vec!["A40".into()],
        gpu_count: count,
        capacity: Some(capacity),
    }
}

#[test]
fn offer_ids_round_trip_and_foreign_ids_are_refused() {
    let id = convert::offer_id("NVIDIA GeForce RTX 4090", "COMMUNITY", "US-TX-3", true);
    let placement = Placement::parse(&id).unwrap();
    assert_eq!(placement.gpu_type, "NVIDIA GeForce RTX 4090");
    assert_eq!(placement.cloud, "COMMUNITY");
    assert_eq!(placement.data_center, "US-TX-3");
    assert!(placement.spot);
    assert!(Placement::parse("5000123").is_none());
    assert!(Placement::parse("gpu_1x_a10/us-east-1").is_none());
    assert!(Placement::parse("A40/ALL/CA-MTL-1").is_none());
}

#[test]
fn a_catalog_entry_yields_offers_only_where_capacity_is_reported() {
    let spot = HashMap::from([("NVIDIA A40".to_owned(), (Some(0.2), None))]);
    let offers = convert::catalog_offers(
        &catalog_gpu(),
        "SECURE",
        &query(CapacityType::Any, 2),
        (true, true),
        &spot,
    );
    assert_eq!(
        offers.len(),
        2,
        "one on-demand and one spot offer in CA-MTL-1: {offers:?}"
    );
    let on_demand = &offers[0];
    assert_eq!(on_demand.id, "NVIDIA A40/SECURE/CA-MTL-1");
    assert_eq!(on_demand.gpu, GpuModel::from_provider("A40", None));
    assert!((on_demand.price_per_hour - 0.80).abs() < 1e-9);
    assert_eq!(on_demand.runpod_cloud, Some(RunpodCloudType::Secure));
    assert_eq!(
        offers[1].capacity,
        OfferCapacity::Spot {
            min_bid_per_hour: 0.4
        }
    );
}

#[test]
fn a_count_above_the_clouds_maximum_yields_no_offer() {
    let offers = convert::catalog_offers(
        &catalog_gpu(),
        "COMMUNITY",
        &query(CapacityType::OnDemand, 4),
        (true, false),
        &HashMap::new(),
    );
    assert!(offers.is_empty());
}

#[test]
fn statuses_map_to_phases_and_runtime_ports_to_endpoints() {
    assert_eq!(convert::phase("PROVISIONING"), InstancePhase::Pending);
    assert_eq!(convert::phase("EXITED"), InstancePhase::Stopped);
    assert_eq!(convert::phase("ERROR"), InstancePhase::Failed);
    assert_eq!(convert::phase("SOMETHING_NEW"), InstancePhase::Unknown);
    let pod: Pod = serde_json::from_value(json!({
        "id": "abc", "name": "nc-1", "status": "RUNNING", "gpu": {"id": "NVIDIA A40", "count": 1},
        "cost": 0.4, "dataCenterId": "CA-MTL-1", "createdAt": "2026-12-02T10:00:00Z",
        "runtime": {"ports": [{"private": 22, "public": 40000, "type": "tcp", "ip": "192.0.2.10"},
                              {"private": 8888, "public": null, "type": "http", "ip": null}]}
    }))
    .unwrap();
    let state = convert::state(&pod);
    assert_eq!(state.phase, InstancePhase::Running);
    assert_eq!(state.endpoints.len(), 1);
    assert_eq!(state.endpoints[0].port, 40000);
    assert_eq!(state.public_ip.as_deref(), Some("192.0.2.10"));
    assert!(state.created_at.is_some());
}

#[test]
fn the_create_body_has_only_fields_v2_accepts() {
    let body = CreatePod {
        name: "nc-1".into(),
        image: "busybox".into(),
        gpu: PodGpu {
            id: "NVIDIA A40".into(),
            count: 1,
        },
        cloud: "SECURE".into(),
        data_center_ids: vec!["CA-MTL-1".into()],
        disk: 50,
        env: Default::default(),
        ports: vec!["22/tcp".into()],
        args: None,
        start_ssh: None,
        registry: Some("reg-1".into()),
    };
    let value = serde_json::to_value(&body).unwrap();
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "cloud",
            "dataCenterIds",
            "disk",
            "env",
            "gpu",
            "image",
            "name",
            "ports",
            "registry"
        ]
    );
}
