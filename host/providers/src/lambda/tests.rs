//! Unit tests of the Lambda translations: offer ids, instance types, statuses and instances.

use neocloud_core::{GpuModel, InstancePhase, OfferQuery};
use serde_json::json;

use super::convert::{self, NAME_TAG};
use super::wire::{Instance, InstanceTypes};

fn types() -> InstanceTypes {
    serde_json::from_value(json!({
        "gpu_1x_a10": {"instance_type": {"name": "gpu_1x_a10", "description": "1x A10 (24 GB PCIe)",
            "gpu_description": "A10 (24 GB PCIe)", "price_cents_per_hour": 75,
            "specs": {"vcpus": 30, "memory_gib": 200, "storage_gib": 1400, "gpus": 1}},
          "regions_with_capacity_available": [{"name": "us-east-1", "description": "Virginia"}]},
        "gpu_8x_h100_sxm5": {"instance_type": {"name": "gpu_8x_h100_sxm5", "gpu_description": "H100 (80 GB SXM5)",
            "price_cents_per_hour": 2392, "specs": {"gpus": 8}},
          "regions_with_capacity_available": []}
    }))
    .unwrap()
}

#[test]
fn only_regions_with_capacity_become_offers_priced_in_dollars() {
    let query = OfferQuery {
        gpu_models: vec!["A10".into()],
        gpu_count: 1,
        capacity: None,
    };
    let all: Vec<_> = types()
        .values()
        .flat_map(|e| convert::offers(e, &query))
        .collect();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].id, "gpu_1x_a10/us-east-1");
    assert_eq!(all[0].gpu, GpuModel::from_provider("A10", None));
    assert!((all[0].price_per_hour - 0.75).abs() < 1e-9);
}

/// Found by the `provider_responses` fuzz target (fuzz/regressions/provider_responses/).
#[test]
fn a_type_without_gpus_is_no_offer_whatever_the_query() {
    let types: InstanceTypes = serde_json::from_value(json!({
        "cpu_4x_general": {"instance_type": {"name": "cpu_4x_general", "gpu_description": "",
            "price_cents_per_hour": 20, "specs": {"vcpus": 4, "memory_gib": 16}},
          "regions_with_capacity_available": [{"name": "us-east-1", "description": "Virginia"}]}
    }))
    .unwrap();
    let query = OfferQuery {
        gpu_models: vec![],
        gpu_count: 0,
        capacity: None,
    };
    for entry in types.values() {
        assert!(convert::offers(entry, &query).is_empty(), "{entry:?}");
    }
}

#[test]
fn offer_ids_split_into_type_and_region() {
    assert_eq!(
        convert::parse_offer_id("gpu_1x_a10/us-east-1"),
        Some(("gpu_1x_a10", "us-east-1"))
    );
    assert_eq!(convert::parse_offer_id("NVIDIA A40/SECURE/CA-MTL-1"), None);
    assert_eq!(convert::parse_offer_id("12345"), None);
}

#[test]
fn a_preempted_instance_is_stopped_and_a_renamed_one_keeps_its_tagged_name() {
    let instance: Instance = serde_json::from_value(json!({
        "id": "i-1", "name": null, "status": "preempted", "ip": "198.51.100.7",
        "tags": [{"key": NAME_TAG, "value": "nc-1"}], "region": {"name": "us-east-1"}
    }))
    .unwrap();
    let state = convert::state(&instance);
    assert_eq!(state.phase, InstancePhase::Stopped);
    assert_eq!(state.external_name, "nc-1");
    assert_eq!(state.endpoints[0].host, "198.51.100.7");
    assert_eq!(state.public_ip.as_deref(), Some("198.51.100.7"));
    assert_eq!(convert::phase("booting"), InstancePhase::Starting);
    assert!(!convert::is_live(&convert::state(
        &serde_json::from_value(json!({"id": "x", "status": "terminating"})).unwrap()
    )));
}

#[test]
fn an_ambiguous_type_name_is_resolved_by_its_gpu_description() {
    let kind: super::wire::InstanceType = serde_json::from_value(json!({
        "name": "gpu_1x_a100", "gpu_description": "A100 (40 GB PCIe)", "price_cents_per_hour": 129, "specs": {"gpus": 1}
    }))
    .unwrap();
    assert_eq!(convert::gpu_of(&kind).name(), "A100 PCIe 40GB");
}
