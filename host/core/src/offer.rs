//! What a provider offers to rent: one instance shape at one price in one place, plus the query a
//! catalog sends to narrow what providers return.
//!
//! Offers are plain data; deciding which one to rent is the broker's job.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::gpu::GpuModel;
use crate::provider_id::ProviderId;
use crate::workload::{CapacityType, RunpodCloudType, WorkloadSpec};

/// How an offer is billed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum OfferCapacity {
    /// Billed at the listed price; not interruptible.
    OnDemand,
    /// Interruptible; rented with a bid of at least `min_bid_per_hour`.
    Spot {
        /// The lowest bid per hour for the whole instance the provider accepts.
        min_bid_per_hour: f64,
    },
}

impl OfferCapacity {
    /// Whether this is a spot (interruptible) offer.
    pub fn is_spot(self) -> bool {
        matches!(self, OfferCapacity::Spot { .. })
    }
}

/// One rentable instance shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offer {
    /// The provider.
    pub provider: ProviderId,
    /// The provider's offer id (Vast ask id, RunPod `gpuTypeId/cloud/datacenter`, Lambda
    /// `instanceType/region`).
    pub id: String,
    /// The GPU model, canonical or kept verbatim when unknown.
    pub gpu: GpuModel,
    /// GPUs in the instance.
    pub gpu_count: u32,
    /// USD per hour for the whole instance (for spot: what the provider currently charges).
    pub price_per_hour: f64,
    /// On-demand or spot with its minimum bid.
    pub capacity: OfferCapacity,
    /// Region, country or datacenter id, as the provider names it (e.g. "us-east-1", "US-KS-2").
    pub region: String,
    /// Host reliability in [0, 1], where the provider reports one (Vast).
    pub reliability: Option<f64>,
    /// Whether the host is verified (Vast); `true` for providers without the notion.
    pub verified: bool,
    /// Disk available to the instance in GiB, if the offer states it.
    pub disk_gib: Option<u32>,
    /// The physical machine, where the provider exposes it (Vast `machine_id`).
    pub machine_id: Option<u64>,
    /// RunPod's secure or community cloud, for RunPod offers.
    pub runpod_cloud: Option<RunpodCloudType>,
    /// When the provider stops honouring this offer, if it says.
    pub expires_at: Option<DateTime<Utc>>,
}

impl Offer {
    /// What renting this offer costs per hour: the minimum bid for spot, the price otherwise.
    pub fn rent_price_per_hour(&self) -> f64 {
        match self.capacity {
            OfferCapacity::OnDemand => self.price_per_hour,
            OfferCapacity::Spot { min_bid_per_hour } => min_bid_per_hour,
        }
    }

    /// Whether `other` is this offer as listed again (fresh data): the same provider and id,
    /// and the same kind of capacity. One Vast.ai ask is listed twice, on-demand and as spot,
    /// under one id; the two are different offers.
    pub fn same_listing(&self, other: &Offer) -> bool {
        self.provider == other.provider
            && self.id == other.id
            && self.capacity.is_spot() == other.capacity.is_spot()
    }
}

/// What a catalog asks a provider for. Providers may return more than asked (the planner checks
/// every constraint again); they must not return less.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OfferQuery {
    /// Canonical or verbatim GPU names; empty means any.
    pub gpu_models: Vec<String>,
    /// GPUs per instance.
    pub gpu_count: u32,
    /// On-demand, spot or any.
    pub capacity: Option<CapacityType>,
}

impl OfferQuery {
    /// The query for a workload's GPU needs.
    pub fn for_workload(w: &WorkloadSpec) -> OfferQuery {
        let mut gpu_models: Vec<String> =
            w.gpu.accepted.iter().map(|g| g.name().to_owned()).collect();
        gpu_models.sort();
        gpu_models.dedup();
        OfferQuery {
            gpu_models,
            gpu_count: w.gpu.count,
            capacity: Some(w.capacity_type),
        }
    }
}
