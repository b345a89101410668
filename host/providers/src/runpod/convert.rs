//! Pure translations between RunPod wire types and `neocloud-core` types: catalog entries to
//! offers, offer ids to placements, pods to instance states, workloads to create bodies.
//!
//! Not IO: nothing here talks to RunPod.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use neocloud_core::{
    Endpoint, GpuModel, InstancePhase, InstanceState, Offer, OfferCapacity, OfferQuery,
    PortProtocol, ProviderId, RunpodCloudType,
};

use super::wire::{CatalogGpu, Pod};
use crate::common::{wants_count, wants_gpu};
use crate::provider::CreateRequest;

/// Where an offer rents: GPU type, cloud, data center, and whether it is spot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub gpu_type: String,
    pub cloud: String,
    pub data_center: String,
    pub spot: bool,
}

impl Placement {
    /// `gpuTypeId/CLOUD/dataCenterId[/spot]`, as [`offer_id`] writes it.
    pub fn parse(id: &str) -> Option<Placement> {
        let parts: Vec<&str> = id.split('/').collect();
        let (spot, fixed) = match parts.as_slice() {
            [g, c, d] => (false, [*g, *c, *d]),
            [g, c, d, "spot"] => (true, [*g, *c, *d]),
            _ => return None,
        };
        let [gpu_type, cloud, data_center] = fixed.map(str::to_owned);
        let known_cloud = cloud == "SECURE" || cloud == "COMMUNITY";
        (known_cloud && !gpu_type.is_empty() && !data_center.is_empty()).then_some(Placement {
            gpu_type,
            cloud,
            data_center,
            spot,
        })
    }
}

/// The offer id of a placement.
pub(crate) fn offer_id(gpu_type: &str, cloud: &str, data_center: &str, spot: bool) -> String {
    let suffix = if spot { "/spot" } else { "" };
    format!("{gpu_type}/{cloud}/{data_center}{suffix}")
}

/// Spot prices per GPU type: (secure, community), USD per GPU and hour.
pub(crate) type SpotTable = HashMap<String, (Option<f64>, Option<f64>)>;

/// The offers one catalog GPU type yields in one cloud: per data center with availability, an
/// on-demand and a spot offer where the cloud has a price for them.
pub(crate) fn catalog_offers(
    gpu: &CatalogGpu,
    cloud: &str,
    query: &OfferQuery,
    (on_demand, spot): (bool, bool),
    spot_prices: &SpotTable,
) -> Vec<Offer> {
    let secure = cloud == "SECURE";
    let pick = |s: Option<f64>, c: Option<f64>| if secure { s } else { c };
    let model = GpuModel::from_provider(&gpu.id, gpu.memory);
    let count = query.gpu_count.max(1);
    let max = if secure {
        gpu.max_count.secure
    } else {
        gpu.max_count.community
    };
    if !wants_gpu(query, &model) || !wants_count(query, count) || max.unwrap_or(0) < count {
        return Vec::new();
    }
    let spot_price = spot_prices.get(&gpu.id).and_then(|(s, c)| pick(*s, *c));
    let prices = [
        (
            on_demand
                .then_some(())
                .and(pick(gpu.price.secure, gpu.price.community)),
            false,
        ),
        (spot.then_some(()).and(spot_price), true),
    ];
    let cloud_type = if secure {
        RunpodCloudType::Secure
    } else {
        RunpodCloudType::Community
    };
    let template = template(model, count, cloud_type);
    let available = gpu.data_centers.iter().filter(|d| d.availability != "NONE");
    available
        .flat_map(|dc| {
            let template = &template;
            prices.iter().filter_map(move |(price, is_spot)| {
                // A price that is negative or not finite would rank first and pass every
                // limit: no offer at it (the fuzzer found a negative spot price accepted).
                let price = (*price).filter(|p| p.is_finite() && *p >= 0.0)?;
                Some(located(template, &gpu.id, cloud, &dc.id, price, *is_spot))
            })
        })
        .collect()
}

fn template(gpu: GpuModel, gpu_count: u32, cloud: RunpodCloudType) -> Offer {
    Offer {
        provider: ProviderId::Runpod,
        id: String::new(),
        gpu,
        gpu_count,
        price_per_hour: 0.0,
        capacity: OfferCapacity::OnDemand,
        region: String::new(),
        reliability: None,
        verified: true,
        disk_gib: None,
        machine_id: None,
        runpod_cloud: Some(cloud),
        expires_at: None,
    }
}

/// The template placed in one data center at a price per GPU.
fn located(
    template: &Offer,
    gpu_id: &str,
    cloud: &str,
    dc: &str,
    per_gpu: f64,
    spot: bool,
) -> Offer {
    let price = per_gpu * f64::from(template.gpu_count);
    let capacity = match spot {
        true => OfferCapacity::Spot {
            min_bid_per_hour: price,
        },
        false => OfferCapacity::OnDemand,
    };
    Offer {
        id: offer_id(gpu_id, cloud, dc, spot),
        price_per_hour: price,
        capacity,
        region: dc.to_owned(),
        ..template.clone()
    }
}

/// The neutral phase of a v2 status (GraphQL spellings included).
pub(crate) fn phase(status: &str) -> InstancePhase {
    match status {
        "PROVISIONING" | "CREATED" => InstancePhase::Pending,
        "STARTING" | "RESTARTING" => InstancePhase::Starting,
        "RUNNING" => InstancePhase::Running,
        "EXITED" | "PAUSED" => InstancePhase::Stopped,
        "ERROR" => InstancePhase::Failed,
        "TERMINATED" => InstancePhase::Terminated,
        _ => InstancePhase::Unknown,
    }
}

/// A pod as an instance state.
pub(crate) fn state(pod: &Pod) -> InstanceState {
    let (gpu_id, count) = pod
        .gpu
        .as_ref()
        .map_or(("", 0), |g| (g.id.as_str(), g.count));
    let endpoints = pod
        .runtime
        .as_ref()
        .and_then(|r| r.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some(Endpoint {
                container_port: p.private,
                host: p.ip.clone()?,
                port: p.public?,
            })
        })
        .collect();
    InstanceState {
        provider: ProviderId::Runpod,
        id: pod.id.clone(),
        external_name: pod.name.clone(),
        phase: phase(&pod.status),
        provider_status: pod.status.clone(),
        message: None,
        gpu: GpuModel::from_provider(gpu_id, None),
        gpu_count: count,
        price_per_hour: pod.cost,
        region: pod.data_center_id.clone().unwrap_or_default(),
        endpoints,
        // Every public port of a pod is published on its host's address.
        public_ip: pod
            .runtime
            .as_ref()
            .and_then(|r| r.ports.as_ref())
            .into_iter()
            .flatten()
            .find(|p| p.public.is_some())
            .and_then(|p| p.ip.clone()),
        created_at: pod.created_at.as_deref().and_then(parse_time),
        interruptible: pod.interruptible,
        exit_code: None,
        ready: None,
    }
}

fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The container's argv (the Pod's command and args, or the runner's start command) as one
/// shell-quoted string for the image entrypoint.
pub(crate) fn args_string(request: &CreateRequest) -> Option<String> {
    let words: Vec<String> = request.container_argv().iter().map(|s| quote(s)).collect();
    (!words.is_empty()).then(|| words.join(" "))
}

fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,@%+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `N/tcp` for each TCP port; the first UDP port is returned as the error.
pub(crate) fn ports(request: &CreateRequest) -> Result<Vec<String>, u16> {
    request
        .workload
        .ports
        .iter()
        .map(|p| match p.protocol {
            PortProtocol::Tcp => Ok(format!("{}/tcp", p.container_port)),
            PortProtocol::Udp => Err(p.container_port),
        })
        .collect()
}

/// The resolved environment as a map (later duplicates win, as in a Pod).
pub(crate) fn env_map(request: &CreateRequest) -> BTreeMap<String, String> {
    request.container_env().collect()
}
