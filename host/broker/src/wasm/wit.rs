//! Our domain types (`neocloud_core`) as the WIT records of `neocloud:policy@0.1.0`, and the
//! guests' answers back as domain types. `policy eval` builds its inputs from JSON with the same
//! name parsers ([`provider_named`], [`gpu_model_named`], [`RegionTable`]).
//!
//! Not for calling guests (see [`super::wasm`]) nor for validating their answers (the engine
//! does). Pure functions, no IO.

use chrono::{DateTime, Utc};
use neocloud_core::{
    Attempt, AttemptOutcome, CapacityType, FailureClass, FallbackAction, GpuModel, Offer,
    PriceDecision, ProviderId, WorkloadSpec,
};
use neocloud_policy::wasm::bindings as wit;
use std::time::Duration;

/// Region names sent once per placement decision; offers refer to them by index.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RegionTable {
    names: Vec<String>,
}

impl RegionTable {
    /// The index of `name`, added on first use.
    pub fn index(&mut self, name: &str) -> u32 {
        let at = match self.names.iter().position(|r| r == name) {
            Some(i) => i,
            None => {
                self.names.push(name.to_owned());
                self.names.len() - 1
            }
        };
        u32::try_from(at).unwrap_or(u32::MAX)
    }

    /// The table, in index order.
    pub fn into_names(self) -> Vec<String> {
        self.names
    }
}

/// A provider by name (`runpod`, `lambda`, `vast`, `kube`, `fake`, any case); anything else is
/// `other`.
pub fn provider_named(name: &str) -> wit::Provider {
    match name.to_ascii_lowercase().parse::<ProviderId>() {
        Ok(p) => provider(p),
        Err(_) => wit::Provider::Other,
    }
}

/// Our provider as the WIT enum.
pub fn provider(p: ProviderId) -> wit::Provider {
    match p {
        ProviderId::Runpod => wit::Provider::Runpod,
        ProviderId::Lambda => wit::Provider::Lambda,
        ProviderId::Vast => wit::Provider::Vast,
        ProviderId::Kube => wit::Provider::Kube,
        ProviderId::Fake => wit::Provider::Fake,
    }
}

/// A WIT provider as ours; `other` has no counterpart.
pub fn provider_from_wit(p: wit::Provider) -> Option<ProviderId> {
    match p {
        wit::Provider::Runpod => Some(ProviderId::Runpod),
        wit::Provider::Lambda => Some(ProviderId::Lambda),
        wit::Provider::Vast => Some(ProviderId::Vast),
        wit::Provider::Kube => Some(ProviderId::Kube),
        wit::Provider::Fake => Some(ProviderId::Fake),
        wit::Provider::Other => None,
    }
}

/// A GPU model by name: the WIT spellings (`A100-80GB`, `RTX-4090`, any case, `_` or space for
/// `-`) and our canonical names (`H100 SXM`, `A100 PCIe 40GB`, `RTX A6000`). Every H100 variant
/// is `h100`; a model the WIT enum does not name (GH200, A40, A10G, ...) is `other`.
pub fn gpu_model_named(name: &str) -> wit::GpuModel {
    let n = name.to_ascii_uppercase().replace(['_', ' '], "-");
    let exact = match n.as_str() {
        "B200" => Some(wit::GpuModel::B200),
        "H200" => Some(wit::GpuModel::H200),
        "H100" => Some(wit::GpuModel::H100),
        "A100-80GB" => Some(wit::GpuModel::A10080gb),
        "A100-40GB" => Some(wit::GpuModel::A10040gb),
        "L40S" => Some(wit::GpuModel::L40s),
        "L40" => Some(wit::GpuModel::L40),
        "L4" => Some(wit::GpuModel::L4),
        "A10" => Some(wit::GpuModel::A10),
        "A6000" | "RTX-A6000" => Some(wit::GpuModel::A6000),
        "RTX-4090" => Some(wit::GpuModel::Rtx4090),
        "RTX-3090" => Some(wit::GpuModel::Rtx3090),
        _ => None,
    };
    exact.unwrap_or_else(|| canonical_family(&n))
}

/// Canonical names with a form factor: `H100-SXM`, `A100-PCIE-80GB`, ...
fn canonical_family(n: &str) -> wit::GpuModel {
    if n.starts_with("H100-") {
        wit::GpuModel::H100
    } else if n.starts_with("A100-") && n.ends_with("-80GB") {
        wit::GpuModel::A10080gb
    } else if n.starts_with("A100-") && n.ends_with("-40GB") {
        wit::GpuModel::A10040gb
    } else {
        wit::GpuModel::Other
    }
}

/// Our GPU model as the WIT enum (unknown models are `other`).
pub fn gpu_model(g: &GpuModel) -> wit::GpuModel {
    if g.is_known() {
        gpu_model_named(g.name())
    } else {
        wit::GpuModel::Other
    }
}

fn capacity_type(c: CapacityType) -> wit::CapacityType {
    match c {
        CapacityType::OnDemand => wit::CapacityType::OnDemand,
        CapacityType::Spot => wit::CapacityType::Spot,
        CapacityType::Any => wit::CapacityType::Any,
    }
}

/// Our failure class as the WIT enum. The WIT package is released and never edited, so a class
/// added since (`offer-taken`, an offer gone between planning and create) is shown to guests as
/// the class it used to be reported as: capacity.
pub fn failure_class(c: FailureClass) -> wit::FailureClass {
    match c {
        FailureClass::Capacity => wit::FailureClass::Capacity,
        FailureClass::Quota => wit::FailureClass::Quota,
        FailureClass::Auth => wit::FailureClass::Auth,
        FailureClass::RateLimited => wit::FailureClass::RateLimited,
        FailureClass::InvalidRequest => wit::FailureClass::InvalidRequest,
        FailureClass::Transient => wit::FailureClass::Transient,
        FailureClass::PriceExceeded => wit::FailureClass::PriceExceeded,
        FailureClass::Timeout => wit::FailureClass::Timeout,
        FailureClass::Preempted => wit::FailureClass::Preempted,
        FailureClass::Lost => wit::FailureClass::Lost,
        FailureClass::OfferTaken => wit::FailureClass::Capacity,
    }
}

/// The workload a guest sees. `WorkloadSpec` keeps no Pod metadata, so `annotations` carries
/// only the `cloud.aibrix.ai/*` settings the spec still holds (providers, disk-gb, constraints,
/// rank, policy), in that order.
pub fn workload(w: &WorkloadSpec) -> wit::Workload {
    wit::Workload {
        gpu_count: w.gpu.count,
        gpu_models: w.gpu.accepted.iter().map(gpu_model).collect(),
        max_price_per_hour: w.max_price_per_hour,
        capacity_type: capacity_type(w.capacity_type),
        regions: w.regions.clone(),
        image: w.image.clone(),
        annotations: annotations(w),
    }
}

fn annotations(w: &WorkloadSpec) -> Vec<wit::Annotation> {
    let providers: Vec<&str> = w.providers.iter().map(|p| p.as_str()).collect();
    let pairs = [
        (
            "providers",
            (!providers.is_empty()).then(|| providers.join(",")),
        ),
        ("disk-gb", w.disk_gib.map(|d| d.to_string())),
        ("constraints", w.constraint.clone()),
        ("rank", w.rank.clone()),
        ("policy", w.policy.clone()),
    ];
    pairs
        .into_iter()
        .filter_map(|(key, value)| {
            value.map(|value| wit::Annotation {
                key: format!("cloud.aibrix.ai/{key}"),
                value,
            })
        })
        .collect()
}

/// An offer as a guest sees it: unknown reliability reads 1.0, unknown memory and disk 0; the
/// price is what renting costs (the minimum bid for spot).
pub fn offer(o: &Offer, region: u32) -> wit::Offer {
    wit::Offer {
        provider: provider(o.provider),
        gpu_model: gpu_model(&o.gpu),
        gpu_count: o.gpu_count,
        gpu_memory_gib: o.gpu.memory_gib().unwrap_or(0),
        price_per_hour: o.rent_price_per_hour(),
        spot: o.capacity.is_spot(),
        region,
        reliability: o.reliability.unwrap_or(1.0),
        verified: o.verified,
        disk_gib: o.disk_gib.unwrap_or(0),
    }
}

/// One placement decision's input: the offers in order, with their region table.
pub fn placement_input(workload: wit::Workload, offers: &[&Offer]) -> wit::PlacementInput {
    let mut regions = RegionTable::default();
    let offers = offers
        .iter()
        .map(|o| offer(o, regions.index(&o.region)))
        .collect();
    wit::PlacementInput {
        workload,
        regions: regions.into_names(),
        offers,
    }
}

/// One pricing decision's input (no on-demand reference: the broker does not pass one).
pub fn pricing_input(workload: wit::Workload, o: &Offer) -> wit::PricingInput {
    wit::PricingInput {
        workload,
        offer: offer(o, 0),
        region: o.region.clone(),
        on_demand_reference: None,
    }
}

/// Past attempts as a guest sees them, oldest first, the failure being handled last. Attempts
/// that did not fail are left out, except the last one, which carries `failure` (the ladder may
/// ask before recording it). Our attempts record neither GPU model nor region: `other` and "".
pub fn attempts(list: &[Attempt], failure: FailureClass, now: DateTime<Utc>) -> Vec<wit::Attempt> {
    let last = list.len().saturating_sub(1);
    list.iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let (class, message) = match &a.outcome {
                AttemptOutcome::Failed { class, message, .. } => (*class, message.clone()),
                _ if i == last => (failure, String::new()),
                _ => return None,
            };
            Some(wit::Attempt {
                provider: provider(a.provider),
                offer_id: a.offer_id.clone(),
                gpu_model: wit::GpuModel::Other,
                price_per_hour: a.price_per_hour,
                region: String::new(),
                failure: failure_class(class),
                message,
                age_ms: millis_since(a.started_at, now),
            })
        })
        .collect()
}

/// Whole milliseconds from `then` to `now`, 0 if `then` is in the future.
pub fn millis_since(then: DateTime<Utc>, now: DateTime<Utc>) -> u64 {
    u64::try_from((now - then).num_milliseconds()).unwrap_or(0)
}

/// A guest's fallback action as ours. `skip-provider(other)` names no provider we know, so it
/// is refused with the reason.
pub fn fallback_action(a: &wit::FallbackAction) -> Result<FallbackAction, String> {
    let ms = |v: u32| Duration::from_millis(u64::from(v));
    Ok(match a {
        wit::FallbackAction::RetrySame(after) => {
            FallbackAction::RetrySameOffer { after: ms(*after) }
        }
        wit::FallbackAction::NextOffer => FallbackAction::NextOffer,
        wit::FallbackAction::SkipProvider(p) => FallbackAction::SkipProvider {
            provider: provider_from_wit(*p)
                .ok_or("skip-provider named provider `other`, which the node does not run")?,
        },
        wit::FallbackAction::Wait(after) => FallbackAction::Wait {
            duration: ms(*after),
        },
        wit::FallbackAction::GiveUp(reason) => FallbackAction::GiveUp {
            reason: reason.clone(),
        },
    })
}

/// A guest's price decision as ours (`spot-bid-per-hour: none` stays `None`).
pub fn price_decision(d: &wit::PriceDecision) -> PriceDecision {
    match d {
        wit::PriceDecision::Accept(bid) => PriceDecision::Accept {
            max_price_per_hour: bid.max_price_per_hour,
            bid_per_hour: bid.spot_bid_per_hour,
        },
        wit::PriceDecision::Reject(reason) => PriceDecision::Reject {
            reason: reason.clone(),
        },
    }
}

/// Scores aligned with the input offers from a placement decision, and which offers the guest
/// excluded (a negative score, or left out of an `order`). An ordered offer at position `i` of
/// `n` scores `n - i`; an excluded one keeps its negative score, or `-inf` when left out.
pub fn placement_scores(d: &wit::PlacementDecision, n: usize) -> (Vec<f64>, Vec<bool>) {
    match d {
        wit::PlacementDecision::Scores(scores) => {
            let excluded = scores.iter().map(|s| *s < 0.0).collect();
            (scores.clone(), excluded)
        }
        wit::PlacementDecision::Order(order) => {
            let mut scores = vec![f64::NEG_INFINITY; n];
            let mut excluded = vec![true; n];
            for (rank, &i) in order.iter().enumerate() {
                if let Some(slot) = scores.get_mut(i as usize) {
                    *slot = (order.len() - rank) as f64;
                    excluded[i as usize] = false;
                }
            }
            (scores, excluded)
        }
    }
}

#[cfg(test)]
#[path = "wit_tests.rs"]
mod tests;
