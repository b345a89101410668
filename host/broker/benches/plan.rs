//! Planning over 10,000 offers from three providers with a constraint evaluated on each offer.
//!
//! The constraint is the CEL expression
//! `offer.price_per_hour <= 2.0 && offer.gpu.memory_gib >= 40 && offer.region.startsWith("us-")`
//! compiled by neocloud-policy's engine and evaluated on every offer through [`CelFilter`]; a
//! hand-written filter doing the same work, and no constraint at all, are measured beside it to
//! show what CEL costs. Besides criterion's report, the bench prints p50/p99/max over a fixed
//! number of plans, because the target (25 ms) is a p99.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use criterion::Criterion;
use neocloud_broker::{CelFilter, OfferFilter, PlanInput, Planner, PolicyError};
use neocloud_core::{
    Attempt, CapacityType, GpuModel, Offer, OfferCapacity, ProviderId, WorkloadSpec,
};
use neocloud_policy::cel::{CelEngine, CelLimits};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const OFFERS: usize = 10_000;
const PROVIDERS: [ProviderId; 3] = [ProviderId::Runpod, ProviderId::Lambda, ProviderId::Vast];
const GPUS: [&str; 8] = [
    "NVIDIA A40",
    "RTX 4090",
    "H100 SXM",
    "gpu_1x_a10",
    "A100 SXM4",
    "L40S",
    "RTX A6000",
    "L4",
];
const REGIONS: [&str; 6] = [
    "us-east-1",
    "us-west-2",
    "us-central-1",
    "eu-central-1",
    "CA-MTL-1",
    "asia-ne-1",
];

/// Same work as `offer.price_per_hour <= 2.0 && offer.gpu.memory_gib >= 40 && offer.region.startsWith("us-")`.
#[derive(Debug)]
struct CelEquivalentFilter;

impl OfferFilter for CelEquivalentFilter {
    fn accepts(&self, _: &WorkloadSpec, o: &Offer, _: &[Attempt]) -> Result<bool, PolicyError> {
        let memory = o
            .gpu
            .memory_gib()
            .ok_or_else(|| PolicyError::new("constraints", "no such key: memory_gib"))?;
        Ok(o.price_per_hour <= 2.0 && memory >= 40 && o.region.starts_with("us-"))
    }
}

fn offers() -> Vec<Offer> {
    let mut rng = StdRng::seed_from_u64(7);
    (0..OFFERS)
        .map(|i| {
            let provider = PROVIDERS[i % 3];
            let price = rng.random_range(0.1..5.0);
            let spot = rng.random_bool(0.2);
            Offer {
                provider,
                id: format!("{provider}-{i}"),
                gpu: GpuModel::from_provider(GPUS[rng.random_range(0..GPUS.len())], Some(80)),
                gpu_count: if rng.random_bool(0.9) { 1 } else { 2 },
                price_per_hour: price,
                capacity: if spot {
                    OfferCapacity::Spot {
                        min_bid_per_hour: price * 0.6,
                    }
                } else {
                    OfferCapacity::OnDemand
                },
                region: REGIONS[rng.random_range(0..REGIONS.len())].to_owned(),
                reliability: Some(rng.random_range(0.9..1.0)),
                verified: rng.random_bool(0.8),
                disk_gib: Some(rng.random_range(10..500)),
                machine_id: Some(rng.random_range(1..100_000)),
                runpod_cloud: None,
                expires_at: None,
            }
        })
        .collect()
}

fn workload() -> WorkloadSpec {
    WorkloadSpec {
        image: "vllm/vllm-openai:latest".into(),
        disk_gib: Some(50),
        capacity_type: CapacityType::Any,
        max_price_per_hour: Some(4.0),
        constraint: Some(r#"offer.price_per_hour <= 2.0 && offer.gpu.memory_gib >= 40 && offer.region.startsWith("us-")"#.into()),
        ..neocloud_fixtures::workload()
    }
}

fn percentiles(label: &str, planner: &Planner, input: &PlanInput<'_>) {
    let mut samples: Vec<Duration> = (0..300)
        .map(|_| {
            let start = Instant::now();
            black_box(planner.plan(black_box(input)).expect("plan"));
            start.elapsed()
        })
        .collect();
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    eprintln!(
        "plan_10k_offers_3_providers/{label}: {} plans, p50 {:?}, p99 {:?}, max {:?} (target p99 25 ms)",
        samples.len(),
        at(0.50),
        at(0.99),
        samples[samples.len() - 1]
    );
}

fn main() {
    let offers = offers();
    let w = workload();
    let now = Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap();
    let input = PlanInput {
        workload: &w,
        offers: &offers,
        attempts: &[],
        enabled: &[],
        skipped: &[],
        now,
    };
    let engine = CelEngine::new(CelLimits::default());
    let expr = engine
        .compile_constraint(w.constraint.as_deref().unwrap())
        .expect("compile");
    let cel = Planner {
        filter: Arc::new(CelFilter::new(expr, &w)),
        ..Planner::default()
    };
    let filtered = Planner {
        filter: Arc::new(CelEquivalentFilter),
        ..Planner::default()
    };
    let plan = cel.plan(&input).expect("plan");
    let same = filtered.plan(&input).expect("plan");
    assert_eq!(
        plan.eligible, same.eligible,
        "CEL and the hand-written filter disagree"
    );
    eprintln!(
        "{} of {} offers eligible; {}",
        plan.eligible, plan.considered, plan.explanation
    );
    percentiles("cel_constraint", &cel, &input);
    percentiles("hand_written_filter", &filtered, &input);

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("plan_10k_offers_3_providers");
    group.bench_function("cel_constraint_price_memory_region", |b| {
        b.iter(|| cel.plan(black_box(&input)).expect("plan"))
    });
    group.bench_function(
        "hand_written_filter_same_work_as_cel_price_memory_region",
        |b| b.iter(|| filtered.plan(black_box(&input)).expect("plan")),
    );
    let unfiltered = Planner::default();
    group.bench_function("no_pod_constraint", |b| {
        b.iter(|| unfiltered.plan(black_box(&input)).expect("plan"))
    });
    group.finish();
    c.final_summary();
}
