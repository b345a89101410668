//! Fixtures shared by the CEL tests and the benchmark: a workload and deterministic offers.
//! `hack/bench/celgo/main.go` generates the same offers with the same formulas.

#![allow(dead_code)]

use std::collections::BTreeMap;

use neocloud_policy::cel::{CelAttempt, CelGpu, CelOffer, CelWorkload};

pub fn workload() -> CelWorkload {
    CelWorkload {
        gpu_count: 1,
        gpu_models: vec!["H100".into(), "A100-80GB".into()],
        max_price: 3.5,
        capacity_type: "any".into(),
        regions: vec!["us-east-1".into(), "us-west-2".into()],
        image: "ghcr.io/acme/train:1.2".into(),
        annotations: BTreeMap::from([
            ("cloud.aibrix.ai/tier".to_owned(), "gold".to_owned()),
            ("team".to_owned(), "ml".to_owned()),
        ]),
    }
}

const PROVIDERS: [&str; 4] = ["runpod", "lambda", "vast", "kube"];
const MODELS: [(&str, i64); 5] = [
    ("H100", 80),
    ("A100-80GB", 80),
    ("L40S", 48),
    ("RTX-4090", 24),
    ("A10", 24),
];
const REGIONS: [&str; 4] = ["us-east-1", "us-west-2", "eu-central-1", "ap-south-1"];

/// Offer number `i`; the formulas are mirrored in the Go benchmark.
pub fn offer(i: usize) -> CelOffer {
    let (model, memory_gib) = MODELS[i % 5];
    CelOffer {
        provider: PROVIDERS[i % 4].into(),
        id: format!("offer-{i}"),
        gpu: CelGpu {
            model: model.into(),
            memory_gib,
        },
        gpu_count: 1 + (i % 8) as i64,
        price_per_hour: 0.2 + ((i * 37) % 400) as f64 / 100.0,
        spot: i.is_multiple_of(3),
        region: REGIONS[(i / 4) % 4].into(),
        reliability: 0.8 + ((i * 13) % 20) as f64 / 100.0,
        verified: i.is_multiple_of(2),
        disk_gib: 50 + (i % 10) as i64 * 10,
    }
}

pub fn offers(n: usize) -> Vec<CelOffer> {
    (0..n).map(offer).collect()
}

pub fn attempts() -> Vec<CelAttempt> {
    vec![
        CelAttempt {
            provider: "vast".into(),
            offer_id: "offer-7".into(),
            failure_class: "capacity".into(),
            message: "no longer available".into(),
        },
        CelAttempt {
            provider: "runpod".into(),
            offer_id: "offer-9".into(),
            failure_class: "rate-limited".into(),
            message: "slow down".into(),
        },
    ]
}

/// The constraint benchmarked against cel-go.
pub const BENCH_CONSTRAINT: &str = r#"offer.price_per_hour <= 2.0 && offer.gpu.memory_gib >= 40 && offer.region.startsWith("us-")"#;

/// The rank benchmarked against cel-go.
pub const BENCH_RANK: &str = "offer.reliability * 100.0 - offer.price_per_hour * 10.0 \
     + double(offer.gpu.memory_gib) / 8.0";
