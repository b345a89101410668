//! Shared builders for broker tests: workloads, offers, proptest strategies, and an independent
//! statement of the hard constraints to check plans against.
#![allow(dead_code)] // each test file uses a different part of these helpers

use chrono::{DateTime, TimeZone, Utc};
use neocloud_core::{CapacityType, GpuModel, Offer, OfferCapacity, ProviderId, WorkloadSpec};
use proptest::prelude::*;

pub mod world;

pub const PROVIDERS: [ProviderId; 3] = [ProviderId::Runpod, ProviderId::Lambda, ProviderId::Vast];
pub const GPUS: [&str; 5] = ["A40", "RTX 4090", "H100 SXM", "A100 SXM 80GB", "L4"];
pub const REGIONS: [&str; 5] = [
    "us-east-1",
    "us-west-2",
    "eu-central-1",
    "US-KS-2",
    "asia-1",
];

pub fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()
}

pub use neocloud_fixtures::{offer, workload};

/// The hard constraints, written out again independently of `constraints.rs`.
pub fn satisfies(w: &WorkloadSpec, o: &Offer, policy_max: Option<f64>) -> bool {
    let rent = match o.capacity {
        OfferCapacity::OnDemand => o.price_per_hour,
        OfferCapacity::Spot { min_bid_per_hour } => min_bid_per_hour,
    };
    let max = [w.max_price_per_hour, policy_max]
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min);
    let capacity = match w.capacity_type {
        CapacityType::OnDemand => matches!(o.capacity, OfferCapacity::OnDemand),
        CapacityType::Spot => matches!(o.capacity, OfferCapacity::Spot { .. }),
        CapacityType::Any => true,
    };
    let region = w.regions.is_empty()
        || w.regions.iter().any(|r| {
            let (r, o) = (r.to_lowercase(), o.region.to_lowercase());
            o == r || o.starts_with(&format!("{r}-"))
        });
    let gpu = w.gpu.accepted.is_empty() || w.gpu.accepted.iter().any(|a| a.name() == o.gpu.name());
    let vast = o.provider != ProviderId::Vast
        || ((o.verified || !w.hints.vast.verified)
            && o.reliability.unwrap_or(0.0) >= w.hints.vast.min_reliability
            && o.disk_gib
                .is_none_or(|d| d >= w.hints.vast.disk_gib.max(w.disk_gib.unwrap_or(0))));
    let disk =
        o.provider == ProviderId::Vast || o.disk_gib.is_none_or(|d| d >= w.disk_gib.unwrap_or(0));
    (w.providers.is_empty() || w.providers.contains(&o.provider))
        && o.gpu_count == w.gpu.count
        && rent <= max
        && rent >= 0.0
        && capacity
        && region
        && gpu
        && vast
        && disk
}

pub fn arb_offer(id: usize) -> impl Strategy<Value = Offer> {
    (
        (
            0..PROVIDERS.len(),
            0..GPUS.len(),
            1u32..=2,
            5u32..500,
            any::<bool>(),
            0u32..100,
        ),
        (
            0..REGIONS.len(),
            80u32..=100,
            any::<bool>(),
            prop::option::of(10u32..200),
        ),
    )
        .prop_map(
            move |((p, g, count, cents, spot, bid_pct), (r, rel, verified, disk))| {
                let price = f64::from(cents) / 100.0;
                let mut o = offer(PROVIDERS[p], &format!("o{id}"), GPUS[g], price);
                o.gpu_count = count;
                if spot {
                    o.capacity = OfferCapacity::Spot {
                        min_bid_per_hour: price * f64::from(bid_pct) / 100.0,
                    };
                }
                o.region = REGIONS[r].to_owned();
                o.reliability = Some(f64::from(rel) / 100.0);
                o.verified = verified;
                o.disk_gib = disk;
                o
            },
        )
}

pub fn arb_offers(max: usize) -> impl Strategy<Value = Vec<Offer>> {
    (0..=max).prop_flat_map(|n| (0..n).map(arb_offer).collect::<Vec<_>>())
}

pub fn arb_workload() -> impl Strategy<Value = WorkloadSpec> {
    (
        (
            1u32..=2,
            prop::collection::vec(0..GPUS.len(), 0..3),
            prop::option::of(10u32..400),
        ),
        (
            0u8..3,
            prop::collection::vec(
                prop::sample::select(vec!["us", "eu", "US-KS-2", "us-east-1"]),
                0..3,
            ),
        ),
        (
            prop::collection::vec(0..PROVIDERS.len(), 0..3),
            any::<bool>(),
            prop::option::of(20u32..150),
        ),
    )
        .prop_map(
            |((count, gpus, max), (cap, regions), (providers, verified, disk))| {
                let mut w = workload();
                w.gpu.count = count;
                w.gpu.accepted = gpus
                    .into_iter()
                    .map(|g| GpuModel::from_provider(GPUS[g], None))
                    .collect();
                w.max_price_per_hour = max.map(|c| f64::from(c) / 100.0);
                w.capacity_type = [
                    CapacityType::OnDemand,
                    CapacityType::Spot,
                    CapacityType::Any,
                ][cap as usize];
                w.regions = regions.into_iter().map(str::to_owned).collect();
                let mut ps: Vec<ProviderId> = providers.into_iter().map(|p| PROVIDERS[p]).collect();
                ps.dedup();
                w.providers = ps;
                w.hints.vast.verified = verified;
                w.disk_gib = disk;
                w
            },
        )
}
