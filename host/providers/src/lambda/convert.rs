//! Pure translations between Lambda Cloud wire types and `neocloud-core` types: instance types
//! to offers, offer ids to (type, region), instances to instance states.
//!
//! Not IO: nothing here talks to Lambda.

use neocloud_core::{
    Endpoint, GpuModel, InstancePhase, InstanceState, Offer, OfferCapacity, OfferQuery, ProviderId,
};

use super::wire::{Instance, InstanceType, TypeEntry};
use crate::common::{wants_count, wants_gpu};

/// The tag that carries our external name besides `name`.
pub(crate) const NAME_TAG: &str = "neocloud:external-name";

/// `instanceType/region`.
pub(crate) fn offer_id(instance_type: &str, region: &str) -> String {
    format!("{instance_type}/{region}")
}

/// The instance type and region of an offer id.
pub(crate) fn parse_offer_id(id: &str) -> Option<(&str, &str)> {
    let (kind, region) = id.split_once('/')?;
    (!kind.is_empty() && !region.is_empty() && !region.contains('/')).then_some((kind, region))
}

/// GPU memory from a description like "A100 (40 GB)" or "1x H100 (80 GB SXM5)".
fn memory_gib(description: &str) -> Option<u32> {
    let (_, after) = description.split_once('(')?;
    after.split_whitespace().next()?.parse().ok()
}

/// The GPU model of an instance type: from its name, or else from the words of its GPU
/// description ("A100 (40 GB PCIe)" → "A100 PCIe" with 40 GiB).
pub(crate) fn gpu_of(kind: &InstanceType) -> GpuModel {
    let memory = memory_gib(&kind.gpu_description);
    let by_name = GpuModel::from_provider(&kind.name, memory);
    if by_name.is_known() {
        return by_name;
    }
    let words: Vec<&str> = kind
        .gpu_description
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter(|w| !w.is_empty() && *w != "GB" && !w.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    let by_description = GpuModel::from_provider(&words.join(" "), memory);
    if by_description.is_known() {
        by_description
    } else {
        by_name
    }
}

/// The offers of one instance type: one per region with capacity now (on-demand only; Lambda
/// has no spot).
pub(crate) fn offers(entry: &TypeEntry, query: &OfferQuery) -> Vec<Offer> {
    let kind = &entry.instance_type;
    let gpu = gpu_of(kind);
    // A type without GPUs (`specs.gpus` 0 or missing, as for CPU types) is no GPU offer.
    let gpus = kind.specs.gpus;
    if gpus == 0 || !wants_gpu(query, &gpu) || !wants_count(query, gpus) {
        return Vec::new();
    }
    entry
        .regions_with_capacity_available
        .iter()
        .map(|region| Offer {
            provider: ProviderId::Lambda,
            id: offer_id(&kind.name, &region.name),
            gpu: gpu.clone(),
            gpu_count: kind.specs.gpus,
            price_per_hour: kind.price_cents_per_hour / 100.0,
            capacity: OfferCapacity::OnDemand,
            region: region.name.clone(),
            reliability: None,
            verified: true,
            disk_gib: (kind.specs.storage_gib > 0).then_some(kind.specs.storage_gib),
            machine_id: None,
            runpod_cloud: None,
            expires_at: None,
        })
        .collect()
}

/// The neutral phase of a Lambda status.
pub(crate) fn phase(status: &str) -> InstancePhase {
    match status {
        "booting" => InstancePhase::Starting,
        "active" => InstancePhase::Running,
        "preempted" => InstancePhase::Stopped,
        "terminating" => InstancePhase::Terminating,
        "terminated" => InstancePhase::Terminated,
        _ => InstancePhase::Unknown,
    }
}

/// Our external name: `name`, or the name tag when the name was changed.
pub(crate) fn external_name(instance: &Instance) -> String {
    let tagged = instance.tags.iter().flatten().find(|t| t.key == NAME_TAG);
    match (&instance.name, tagged) {
        (Some(name), _) if !name.is_empty() => name.clone(),
        (_, Some(tag)) => tag.value.clone(),
        _ => String::new(),
    }
}

/// Whether the instance still counts as rented (not terminating or gone).
pub(crate) fn is_live(state: &InstanceState) -> bool {
    !state.phase.is_terminal() && state.phase != InstancePhase::Terminating
}

/// An instance as an instance state.
pub(crate) fn state(instance: &Instance) -> InstanceState {
    let kind = instance.instance_type.as_ref();
    let endpoints = instance
        .ip
        .iter()
        .map(|ip| Endpoint {
            container_port: 22,
            host: ip.clone(),
            port: 22,
        })
        .collect();
    InstanceState {
        provider: ProviderId::Lambda,
        id: instance.id.clone(),
        external_name: external_name(instance),
        phase: phase(&instance.status),
        provider_status: instance.status.clone(),
        message: (instance.status == "preempted").then(|| "preempted by lambda".to_owned()),
        gpu: kind.map_or_else(|| GpuModel::from_provider("unknown", None), gpu_of),
        gpu_count: kind.map_or(0, |k| k.specs.gpus),
        price_per_hour: kind.map_or(0.0, |k| k.price_cents_per_hour / 100.0),
        region: instance
            .region
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_default(),
        endpoints,
        public_ip: instance.ip.clone(),
        created_at: None,
        // Lambda rents no spot; its `preempted` status says a reclaim by itself.
        interruptible: false,
        exit_code: None,
        ready: None,
    }
}
