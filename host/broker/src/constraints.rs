//! Hard constraints: the checks no policy can loosen (provider allow-list and skips, GPU model and
//! count, capacity type, regions, max price, disk, Vast and RunPod hints, expiry).
//!
//! Each check names why an offer was rejected, for the plan's explanation. Not for ranking.

use std::fmt;

use chrono::{DateTime, Utc};
use neocloud_core::{CapacityType, Offer, ProviderId, WorkloadSpec};

/// Why an offer failed a hard constraint (or a later planning step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rejection {
    /// The provider is not in the Pod's allow-list, or is not enabled.
    ProviderNotAllowed,
    /// The fallback ladder skipped this provider (quota or auth).
    ProviderSkipped,
    /// The GPU model is not one the Pod accepts.
    GpuModel,
    /// The GPU count differs from the Pod's.
    GpuCount,
    /// Spot where on-demand is required, or the reverse.
    CapacityType,
    /// Not in any acceptable region.
    Region,
    /// Above the Pod's or the policy's max price.
    MaxPrice,
    /// Less disk than the Pod needs.
    Disk,
    /// Vast: an unverified host.
    Unverified,
    /// Vast: reliability below the minimum.
    Reliability,
    /// Vast: not the requested machine or offer.
    VastPin,
    /// RunPod: the wrong cloud type.
    RunpodCloud,
    /// The offer has expired.
    Expired,
    /// The Pod's CEL constraint returned false.
    Constraint,
    /// The Pod's CEL constraint failed on this offer.
    ConstraintError,
    /// The pricing policy rejected it.
    Pricing,
}

impl Rejection {
    /// A short phrase for explanations.
    pub fn describe(self) -> &'static str {
        match self {
            Rejection::ProviderNotAllowed => "provider not allowed",
            Rejection::ProviderSkipped => "provider skipped after a quota or auth failure",
            Rejection::GpuModel => "GPU model not accepted",
            Rejection::GpuCount => "wrong GPU count",
            Rejection::CapacityType => "wrong capacity type",
            Rejection::Region => "region not accepted",
            Rejection::MaxPrice => "above max price",
            Rejection::Disk => "not enough disk",
            Rejection::Unverified => "unverified host",
            Rejection::Reliability => "reliability too low",
            Rejection::VastPin => "not the pinned vast machine or offer",
            Rejection::RunpodCloud => "wrong runpod cloud type",
            Rejection::Expired => "offer expired",
            Rejection::Constraint => "constraint returned false",
            Rejection::ConstraintError => "constraint failed",
            Rejection::Pricing => "rejected by the pricing policy",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// What the hard constraints need besides the workload and the offer.
#[derive(Debug, Clone)]
pub struct HardContext<'a> {
    /// Providers that may be used at all (enabled on this node); empty means all.
    pub enabled: &'a [ProviderId],
    /// Providers the fallback ladder has skipped.
    pub skipped: &'a [ProviderId],
    /// The lowest of the Pod's and the policy's max price, if any.
    pub max_price_per_hour: Option<f64>,
    /// Now, for offer expiry.
    pub now: DateTime<Utc>,
}

/// Checks every hard constraint, cheapest first.
pub fn check(w: &WorkloadSpec, o: &Offer, cx: &HardContext<'_>) -> Result<(), Rejection> {
    let allowed = (w.providers.is_empty() || w.providers.contains(&o.provider))
        && (cx.enabled.is_empty() || cx.enabled.contains(&o.provider));
    ensure(allowed, Rejection::ProviderNotAllowed)?;
    ensure(
        !cx.skipped.contains(&o.provider),
        Rejection::ProviderSkipped,
    )?;
    ensure(o.gpu_count == w.gpu.count, Rejection::GpuCount)?;
    ensure(capacity_ok(w.capacity_type, o), Rejection::CapacityType)?;
    ensure(price_ok(o, cx.max_price_per_hour), Rejection::MaxPrice)?;
    ensure(w.gpu.accepts(&o.gpu), Rejection::GpuModel)?;
    ensure(region_ok(&w.regions, &o.region), Rejection::Region)?;
    ensure(disk_ok(w, o), Rejection::Disk)?;
    provider_hints(w, o)?;
    ensure(o.expires_at.is_none_or(|t| t > cx.now), Rejection::Expired)
}

fn ensure(ok: bool, r: Rejection) -> Result<(), Rejection> {
    if ok { Ok(()) } else { Err(r) }
}

fn capacity_ok(wanted: CapacityType, o: &Offer) -> bool {
    match wanted {
        CapacityType::OnDemand => !o.capacity.is_spot(),
        CapacityType::Spot => o.capacity.is_spot(),
        CapacityType::Any => true,
    }
}

/// Whether renting `o` stays within `max`. NaN or negative prices never pass.
pub fn price_ok(o: &Offer, max: Option<f64>) -> bool {
    let price = o.rent_price_per_hour();
    price.is_finite() && price >= 0.0 && max.is_none_or(|m| price <= m)
}

/// A region matches exactly (ignoring case) or as a prefix ending at a dash: "us" accepts
/// "us-east-1" but not "usa-1".
pub fn region_ok(regions: &[String], offered: &str) -> bool {
    regions.is_empty()
        || regions.iter().any(|r| {
            let (o, r) = (offered.as_bytes(), r.as_bytes());
            o.len() >= r.len()
                && o[..r.len()].eq_ignore_ascii_case(r)
                && (o.len() == r.len() || o[r.len()] == b'-')
        })
}

fn disk_ok(w: &WorkloadSpec, o: &Offer) -> bool {
    let needed = match o.provider {
        ProviderId::Vast => Some(w.hints.vast.disk_gib.max(w.disk_gib.unwrap_or(0))),
        _ => w.disk_gib,
    };
    match (needed, o.disk_gib) {
        (Some(needed), Some(offered)) => offered >= needed,
        _ => true,
    }
}

fn provider_hints(w: &WorkloadSpec, o: &Offer) -> Result<(), Rejection> {
    match o.provider {
        ProviderId::Vast => {
            let v = &w.hints.vast;
            ensure(!v.verified || o.verified, Rejection::Unverified)?;
            let reliable = o.reliability.is_some_and(|r| r >= v.min_reliability);
            ensure(reliable, Rejection::Reliability)?;
            let machine_ok = v.machine_id.is_none_or(|m| o.machine_id == Some(m));
            let offer_ok = v.offer_id.is_none_or(|id| o.id == id.to_string());
            ensure(machine_ok && offer_ok, Rejection::VastPin)
        }
        ProviderId::Runpod => {
            let ok = match (w.hints.runpod_cloud_type, o.runpod_cloud) {
                (Some(wanted), Some(offered)) => wanted.allows(offered),
                _ => true,
            };
            ensure(ok, Rejection::RunpodCloud)
        }
        _ => Ok(()),
    }
}
