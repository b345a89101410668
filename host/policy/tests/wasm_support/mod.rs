//! Fixtures shared by the Wasm tests and benchmark: where the built guests are, and deterministic
//! WIT inputs (the offers follow the same formulas as the CEL fixtures in `support/`).

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use neocloud_policy::wasm::bindings::{
    Annotation, Attempt, CapacityType, FailureClass, FallbackInput, GpuModel, Offer,
    PlacementInput, PricingInput, Provider, Workload,
};
use neocloud_policy::wasm::{
    Budget, Capabilities, EngineConfig, PolicySettings, PolicySource, WasmEngine, WasmPolicy,
};

/// The directory `make policies` writes to, or `NEOCLOUD_POLICIES_DIR`.
pub fn guests_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("NEOCLOUD_POLICIES_DIR") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../policies/build")
}

/// The path of a built guest; panics with how to build it when it is missing.
pub fn guest(name: &str) -> PathBuf {
    let path = guests_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "guest policy {} is missing: run `make policies` (or policies/build.sh) first, \
         or point NEOCLOUD_POLICIES_DIR at a directory of built guests",
        path.display()
    );
    path
}

/// One engine per test binary, with the default configuration and a disk cache shared by test
/// runs, so the JavaScript guest (12 MB, slow to compile in a debug build) is compiled once per
/// machine rather than once per test.
pub fn engine() -> WasmEngine {
    static ENGINE: OnceLock<WasmEngine> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let config = EngineConfig {
                cache_dir: Some(std::env::temp_dir().join("neocloud-policy-wasm-test-cache")),
                ..EngineConfig::default()
            };
            WasmEngine::new(config).expect("engine")
        })
        .clone()
}

pub fn settings(name: &str) -> PolicySettings {
    PolicySettings::named(name)
}

/// Settings with a short deadline and a small memory budget, for hostile guests.
pub fn tight(name: &str) -> PolicySettings {
    let mut s = PolicySettings::named(name);
    s.budget = Budget {
        deadline: Duration::from_millis(50),
        memory_bytes: 16 << 20,
        fuel: None,
    };
    s
}

pub fn with_log(mut s: PolicySettings) -> PolicySettings {
    s.capabilities = Capabilities {
        log: true,
        ..s.capabilities
    };
    s
}

pub fn load(engine: &WasmEngine, name: &str, settings: PolicySettings) -> WasmPolicy {
    engine
        .load(&PolicySource::file(guest(name)), settings)
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

pub fn workload() -> Workload {
    Workload {
        gpu_count: 1,
        gpu_models: vec![GpuModel::H100, GpuModel::A10080gb],
        max_price_per_hour: Some(3.5),
        capacity_type: CapacityType::Any,
        regions: vec!["us-east-1".into(), "us-west-2".into()],
        image: "ghcr.io/acme/train:1.2".into(),
        annotations: vec![Annotation {
            key: "cloud.aibrix.ai/tier".into(),
            value: "gold".into(),
        }],
    }
}

const PROVIDERS: [Provider; 4] = [
    Provider::Runpod,
    Provider::Lambda,
    Provider::Vast,
    Provider::Kube,
];
const MODELS: [(GpuModel, u32); 5] = [
    (GpuModel::H100, 80),
    (GpuModel::A10080gb, 80),
    (GpuModel::L40s, 48),
    (GpuModel::Rtx4090, 24),
    (GpuModel::A10, 24),
];
pub const REGIONS: [&str; 4] = ["us-east-1", "us-west-2", "eu-central-1", "ap-south-1"];

/// Offer number `i`, with the formulas of the CEL fixtures.
pub fn offer(i: usize) -> Offer {
    let (gpu_model, gpu_memory_gib) = MODELS[i % 5];
    Offer {
        provider: PROVIDERS[i % 4],
        gpu_model,
        gpu_count: 1 + (i % 8) as u32,
        gpu_memory_gib,
        price_per_hour: 0.2 + ((i * 37) % 400) as f64 / 100.0,
        spot: i.is_multiple_of(3),
        region: ((i / 4) % 4) as u32,
        reliability: 0.8 + ((i * 13) % 20) as f64 / 100.0,
        verified: i.is_multiple_of(2),
        disk_gib: 100 + (i % 5) as u32 * 100,
    }
}

pub fn placement_input(offers: usize) -> PlacementInput {
    PlacementInput {
        workload: workload(),
        regions: REGIONS.iter().map(|r| r.to_string()).collect(),
        offers: (0..offers).map(offer).collect(),
    }
}

pub fn attempt(failure: FailureClass, offer_id: &str) -> Attempt {
    Attempt {
        provider: Provider::Vast,
        offer_id: offer_id.into(),
        gpu_model: GpuModel::H100,
        price_per_hour: 2.1,
        region: "us-east-1".into(),
        failure,
        message: "no capacity".into(),
        age_ms: 1500,
    }
}

pub fn fallback_input(attempts: Vec<Attempt>, remaining: u32) -> FallbackInput {
    FallbackInput {
        workload: workload(),
        attempts,
        remaining_offers: remaining,
        elapsed_ms: 60_000,
    }
}

pub fn pricing_input(price: f64, spot: bool) -> PricingInput {
    let mut offer = offer(0);
    offer.price_per_hour = price;
    offer.spot = spot;
    PricingInput {
        workload: workload(),
        offer,
        region: "us-east-1".into(),
        on_demand_reference: Some(3.0),
    }
}
