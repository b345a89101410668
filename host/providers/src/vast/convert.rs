//! Pure translations between Vast.ai wire types and `neocloud-core` types: our constraints and
//! the `vast-*` hints to a bundles query, offers to [`Offer`]s, instances to instance states, and
//! workloads to rental bodies.
//!
//! Not IO: nothing here talks to Vast.

use chrono::{DateTime, Utc};
use neocloud_core::{
    Endpoint, GpuModel, InstancePhase, InstanceState, Offer, OfferCapacity, OfferQuery,
    PortProtocol, ProviderId, WorkloadSpec,
};
use serde_json::{Map, Value, json};

use super::config::VastConfig;
use std::collections::BTreeMap;

use super::wire::{Rent, VastInstance, VastOffer};
use crate::common::{wants_count, wants_gpu};
use crate::provider::CreateRequest;

/// How Vast spells our canonical GPU names (`gpu_name` of offers).
const VAST_NAMES: &[(&str, &[&str])] = &[
    ("A100 SXM 80GB", &["A100 SXM4"]),
    ("A100 SXM 40GB", &["A100 SXM4"]),
    ("A100 PCIe 80GB", &["A100 PCIE"]),
    ("A100 PCIe 40GB", &["A100 PCIE"]),
    ("H100 PCIe", &["H100 PCIE"]),
    ("RTX 6000 Ada", &["RTX 6000Ada"]),
    ("Quadro RTX 6000", &["Q RTX 6000"]),
    ("V100 16GB", &["Tesla V100"]),
    ("V100 32GB", &["Tesla V100"]),
];

/// What a search asks of Vast beyond GPU model and count: the specification's defaults, the
/// Pod's `vast-*` hints, its max price and regions (country codes).
#[derive(Debug, Clone, PartialEq)]
pub struct VastSearch {
    /// Only verified hosts.
    pub verified: bool,
    /// Least `reliability2`.
    pub min_reliability: f64,
    /// Disk to allocate, in GiB (also a lower bound on the offer's disk).
    pub disk_gib: u32,
    /// Only this machine.
    pub machine_id: Option<u64>,
    /// Only this ask.
    pub offer_id: Option<u64>,
    /// Most USD per hour for the instance.
    pub max_price_per_hour: Option<f64>,
    /// Country codes ("US", "CA"); empty means anywhere.
    pub countries: Vec<String>,
}

impl VastSearch {
    /// The adapter's defaults.
    pub fn from_config(config: &VastConfig) -> VastSearch {
        VastSearch {
            verified: config.verified,
            min_reliability: config.min_reliability,
            disk_gib: config.disk_gib,
            machine_id: None,
            offer_id: None,
            max_price_per_hour: None,
            countries: Vec::new(),
        }
    }

    /// What a workload's hints, max price and regions ask for.
    pub fn for_workload(workload: &WorkloadSpec) -> VastSearch {
        let hints = &workload.hints.vast;
        VastSearch {
            verified: hints.verified,
            min_reliability: hints.min_reliability,
            disk_gib: workload
                .disk_gib
                .unwrap_or(hints.disk_gib)
                .max(hints.disk_gib),
            machine_id: hints.machine_id,
            offer_id: hints.offer_id,
            max_price_per_hour: workload.max_price_per_hour,
            countries: workload.regions.clone(),
        }
    }
}

/// The `gpu_name`s to ask for, or `None` when the query names no GPU.
fn gpu_names(query: &OfferQuery) -> Option<Vec<String>> {
    if query.gpu_models.is_empty() {
        return None;
    }
    let mut names = Vec::new();
    for model in query
        .gpu_models
        .iter()
        .flat_map(|n| GpuModel::accepted_by_name(n))
    {
        let canonical = model.name();
        match VAST_NAMES.iter().find(|(c, _)| *c == canonical) {
            Some((_, spelled)) => names.extend(spelled.iter().map(|s| (*s).to_owned())),
            None => names.push(canonical.to_owned()),
        }
    }
    names.sort();
    names.dedup();
    Some(names)
}

/// The `POST /api/v0/bundles/` body; `bid` prices offers at their minimum bid.
pub(crate) fn bundles_query(
    query: &OfferQuery,
    search: &VastSearch,
    bid: bool,
    limit: u32,
) -> Value {
    let mut q = filters(query, search);
    q.insert("order".into(), json!([["dph_total", "asc"]]));
    q.insert("type".into(), json!(if bid { "bid" } else { "on-demand" }));
    q.insert("limit".into(), json!(limit));
    q.insert("allocated_storage".into(), json!(search.disk_gib));
    Value::Object(q)
}

/// The `{column: {op: value}}` conditions of a search.
fn filters(query: &OfferQuery, search: &VastSearch) -> Map<String, Value> {
    let optional = [
        (
            "verified",
            "eq",
            search.verified.then_some(Value::Bool(true)),
        ),
        ("gpu_name", "in", gpu_names(query).map(|n| json!(n))),
        (
            "num_gpus",
            "eq",
            (query.gpu_count > 0).then(|| json!(query.gpu_count)),
        ),
        (
            "dph_total",
            "lte",
            search.max_price_per_hour.map(|m| json!(m)),
        ),
        ("machine_id", "eq", search.machine_id.map(|m| json!(m))),
        ("id", "eq", search.offer_id.map(|m| json!(m))),
        (
            "geolocation",
            "in",
            (!search.countries.is_empty()).then(|| json!(search.countries)),
        ),
    ];
    let always = [
        ("rentable", "eq", Some(json!(true))),
        ("rented", "eq", Some(json!(false))),
        ("external", "eq", Some(json!(false))),
        ("reliability2", "gte", Some(json!(search.min_reliability))),
        ("disk_space", "gte", Some(json!(search.disk_gib))),
    ];
    always
        .into_iter()
        .chain(optional)
        .filter_map(|(column, op, value)| Some((column.to_owned(), json!({ op: value? }))))
        .collect()
}

fn gpu(name: &str, ram_mb: Option<f64>) -> GpuModel {
    let gib = ram_mb.map(|mb| (mb / 1024.0).round() as u32);
    GpuModel::from_provider(name, gib)
}

/// An offer, if it is one the query wants.
pub(crate) fn offer(o: &VastOffer, query: &OfferQuery, bid: bool) -> Option<Offer> {
    let model = gpu(&o.gpu_name, o.gpu_ram);
    // An ask without GPUs (`num_gpus` 0 or missing) is no GPU offer, whatever the query.
    if o.num_gpus == 0 || !wants_gpu(query, &model) || !wants_count(query, o.num_gpus) {
        return None;
    }
    let capacity = match (bid, o.min_bid) {
        (true, Some(min)) => OfferCapacity::Spot {
            min_bid_per_hour: min,
        },
        (true, None) => return None,
        (false, _) => OfferCapacity::OnDemand,
    };
    let verified = o
        .verified
        .unwrap_or(o.verification.as_deref() == Some("verified"));
    Some(Offer {
        provider: ProviderId::Vast,
        id: o.id.to_string(),
        gpu: model,
        gpu_count: o.num_gpus,
        price_per_hour: o.dph_total,
        capacity,
        region: o.geolocation.clone().unwrap_or_default(),
        reliability: o.reliability2,
        verified,
        disk_gib: o.disk_space.map(|d| d.max(0.0) as u32),
        machine_id: o.machine_id,
        runpod_cloud: None,
        expires_at: None,
    })
}

/// The neutral phase of an instance's statuses.
pub(crate) fn phase(i: &VastInstance) -> InstancePhase {
    if i.cur_state.as_deref() == Some("unloaded") {
        return InstancePhase::Terminated;
    }
    let oci_failed = i
        .status_msg
        .as_deref()
        .is_some_and(|m| m.contains("OCI runtime create failed"));
    match i.actual_status.as_deref() {
        None if i.intended_status.as_deref() == Some("stopped") => InstancePhase::Stopped,
        None => InstancePhase::Pending,
        Some("created") if oci_failed => InstancePhase::Failed,
        Some("loading" | "created" | "rebooting") => InstancePhase::Starting,
        Some("running") => InstancePhase::Running,
        Some("stopped" | "frozen") => InstancePhase::Stopped,
        Some("exited" | "unknown" | "offline") => InstancePhase::Failed,
        Some(_) => InstancePhase::Unknown,
    }
}

/// The public SSH endpoint, from `ports["22/tcp"][0].HostPort` on `public_ipaddr`.
fn endpoints(i: &VastInstance) -> Vec<Endpoint> {
    let (Some(ports), Some(host)) = (i.ports.as_ref(), i.public_ipaddr.as_ref()) else {
        return Vec::new();
    };
    let Some(map) = ports.as_object() else {
        return Vec::new();
    };
    map.iter()
        .filter_map(|(key, bindings)| {
            let container_port = key.split('/').next()?.parse().ok()?;
            let host_port = bindings.get(0)?.get("HostPort")?;
            let port = host_port
                .as_str()
                .and_then(|p| p.parse().ok())
                .or(host_port.as_u64().and_then(|p| u16::try_from(p).ok()))?;
            Some(Endpoint {
                container_port,
                host: host.clone(),
                port,
            })
        })
        .collect()
}

/// An instance as an instance state.
pub(crate) fn state(i: &VastInstance) -> InstanceState {
    let status = i
        .actual_status
        .clone()
        .unwrap_or_else(|| "provisioning".to_owned());
    InstanceState {
        provider: ProviderId::Vast,
        id: i.id.to_string(),
        external_name: i.label.clone().unwrap_or_default(),
        phase: phase(i),
        provider_status: status,
        message: i.status_msg.clone().filter(|m| !m.is_empty()),
        gpu: gpu(i.gpu_name.as_deref().unwrap_or("unknown"), i.gpu_ram),
        gpu_count: i.num_gpus.unwrap_or(0),
        price_per_hour: i.dph_total.unwrap_or(0.0),
        region: i.geolocation.clone().unwrap_or_default(),
        endpoints: endpoints(i),
        // The API has been seen to pad it with whitespace.
        public_ip: i
            .public_ipaddr
            .as_deref()
            .map(str::trim)
            .filter(|ip| !ip.is_empty())
            .map(str::to_owned),
        created_at: i
            .start_date
            .and_then(|s| DateTime::<Utc>::from_timestamp_millis((s * 1000.0) as i64)),
        interruptible: i.is_bid.unwrap_or(false),
        exit_code: None,
        ready: None,
    }
}

/// The rental body: our name as `label`, the image run with its entrypoint and the Pod's
/// command and args (`runtype: "args"`), ports as `-p N:N` env keys, a price only for spot.
pub(crate) fn rent_body(request: &CreateRequest) -> Rent {
    let w = &request.workload;
    let mut env: BTreeMap<String, String> = request.container_env().collect();
    for port in &w.ports {
        let suffix = if port.protocol == PortProtocol::Udp {
            "/udp"
        } else {
            ""
        };
        env.insert(
            format!("-p {0}:{0}{suffix}", port.container_port),
            "1".to_owned(),
        );
    }
    let spot = request.offer.capacity.is_spot() || request.bid_per_hour.is_some();
    Rent {
        client_id: "me",
        image: w.image.clone(),
        disk: f64::from(VastSearch::for_workload(w).disk_gib),
        label: request.external_name.clone(),
        env,
        runtype: "args",
        args: request.container_argv(),
        price: spot.then(|| {
            request
                .bid_per_hour
                .unwrap_or(request.offer.rent_price_per_hour())
        }),
        cancel_unavail: true,
        target_state: "running",
        image_login: request.registry_login.as_ref().map(image_login),
    }
}

/// Vast's `image_login`: `docker login` arguments in shell words, each quoted where it needs to
/// be (a password may hold spaces or quotes).
fn image_login(login: &neocloud_core::RegistryCredential) -> String {
    let words = [
        "-u",
        login.username.as_str(),
        "-p",
        login.password.as_str(),
        login.server.as_str(),
    ];
    // Quoting refuses only NUL bytes, which no registry login can hold; they are dropped.
    shlex::try_join(words).unwrap_or_else(|_| {
        let clean: Vec<String> = words.iter().map(|w| w.replace('\0', "")).collect();
        shlex::try_join(clean.iter().map(String::as_str)).unwrap_or_default()
    })
}
