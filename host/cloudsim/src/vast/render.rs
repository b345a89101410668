//! The JSON of Vast.ai offers and instances, with the fields clients read, in the units of the
//! REST API (RAM in MB, disk in GB, prices in USD per hour).
//!
//! Not filtering or state: rendering is a pure function of an offer or instance and the time.

use serde_json::{Value, json};
use tokio::time::Instant;

use super::state::Instance;
use crate::market::Offer;
use crate::server::Core;

/// Offer columns that search may filter on; [`offer`] emits each of them.
pub(crate) const OFFER_COLUMNS: &[&str] = &[
    "id",
    "ask_contract_id",
    "bundle_id",
    "machine_id",
    "host_id",
    "gpu_name",
    "num_gpus",
    "gpu_ram",
    "gpu_total_ram",
    "cpu_cores",
    "cpu_cores_effective",
    "cpu_ram",
    "disk_space",
    "dph_base",
    "dph_total",
    "min_bid",
    "is_bid",
    "discounted_dph_total",
    "storage_cost",
    "reliability2",
    "reliability",
    "verification",
    "verified",
    "rentable",
    "rented",
    "external",
    "geolocation",
    "datacenter",
    "hosting_type",
    "cuda_max_good",
    "compute_cap",
    "direct_port_count",
    "inet_down",
    "inet_up",
    "public_ipaddr",
    "static_ip",
    "score",
    "end_date",
    "duration",
    "dlperf",
    "dlperf_per_dphtotal",
];

/// Instance columns that `select_filters` may filter on.
pub(crate) const INSTANCE_COLUMNS: &[&str] = &[
    "id",
    "label",
    "actual_status",
    "intended_status",
    "cur_state",
    "next_state",
    "gpu_name",
    "num_gpus",
    "machine_id",
    "host_id",
    "dph_total",
    "is_bid",
    "geolocation",
    "image_uuid",
];

/// An offer as search returns it; `bid` prices it at its minimum bid.
pub(crate) fn offer(offer: &Offer, bid: bool) -> Value {
    let c = &offer.config;
    let price = match (bid, offer.min_bid()) {
        (true, Some(min)) => min,
        _ => c.price_per_hour,
    };
    let gpu_ram = c.gpu_memory_gb * 1024;
    let score = c.reliability * 100.0 / price.max(0.01);
    json!({
        "id": offer.id, "ask_contract_id": offer.id, "bundle_id": offer.id,
        "machine_id": machine_id(offer.id), "host_id": host_id(offer.id),
        "gpu_name": c.gpu, "num_gpus": c.gpu_count, "gpu_ram": gpu_ram,
        "gpu_total_ram": gpu_ram * c.gpu_count, "cpu_cores": c.vcpus * 2,
        "cpu_cores_effective": c.vcpus, "cpu_ram": c.ram_gb * 1024, "disk_space": c.disk_gb,
        "dph_base": price, "dph_total": price, "min_bid": offer.min_bid(), "is_bid": bid,
        "search": { "totalHour": price, "gpuCostPerHour": price, "diskHour": 0.0 },
        "discounted_dph_total": price, "storage_cost": 0.1, "reliability2": c.reliability,
        "reliability": c.reliability,
        "verification": if c.verified { "verified" } else { "unverified" },
        "verified": c.verified, "rentable": offer.available > 0, "rented": offer.available == 0,
        "external": false, "geolocation": c.region, "datacenter": c.verified, "hosting_type": 0,
        "cuda_max_good": 12.8, "compute_cap": 890, "direct_port_count": 20, "inet_down": 800.0,
        "inet_up": 400.0, "public_ipaddr": public_ip(offer.id), "static_ip": true, "score": score,
        "end_date": null, "duration": null, "dlperf": 50.0, "dlperf_per_dphtotal": 50.0 / price.max(0.01),
    })
}

/// The three state fields of an instance: actual, intended, current.
fn states(instance: &Instance, core: &Core, now: Instant) -> (Value, &'static str, &'static str) {
    if instance.stopped.is_some() {
        return (json!("stopped"), "stopped", "stopped");
    }
    if instance.failed {
        return (json!("exited"), "running", "stopped");
    }
    let t = core.config.timing;
    let elapsed = now.saturating_duration_since(instance.started).as_millis() as u64;
    let actual = if elapsed < t.provisioning_ms {
        Value::Null
    } else if elapsed < t.provisioning_ms + t.starting_ms {
        json!("loading")
    } else {
        json!("running")
    };
    (actual, "running", "running")
}

/// An instance as `GET /api/v0/instances/{id}/` and the list return it.
pub(crate) fn instance(instance: &Instance, core: &Core, now: Instant) -> Value {
    let (actual, intended, cur) = states(instance, core, now);
    let running = actual == "running";
    let c = &instance.offer.config;
    let price = instance.bid.unwrap_or(c.price_per_hour);
    let ssh_port = 10_000 + instance.id % 50_000;
    let ports = running
        .then(|| json!({ "22/tcp": [{ "HostIp": "0.0.0.0", "HostPort": ssh_port.to_string() }] }));
    let start = core.clock.utc(instance.created).timestamp_millis() as f64 / 1000.0;
    let env: Vec<Value> = instance.env.iter().map(|(k, v)| json!([k, v])).collect();
    json!({
        "id": instance.id, "label": instance.label, "actual_status": actual,
        "intended_status": intended, "cur_state": cur, "next_state": cur,
        "status_msg": instance.pull_error.clone().unwrap_or_else(|| status_msg(&actual, intended)), "image_uuid": instance.image,
        "image_args": instance.args, "image_runtype": instance.runtype, "extra_env": env,
        "onstart": instance.onstart, "ssh_host": format!("ssh{}.vast.ai", instance.id % 9 + 1),
        "ssh_port": ssh_port, "ssh_idx": instance.id % 9 + 1,
        "public_ipaddr": public_ip(instance.offer.id), "local_ipaddrs": "10.0.0.5 172.17.0.2",
        "ports": ports, "machine_id": machine_id(instance.offer.id),
        "host_id": host_id(instance.offer.id), "gpu_name": c.gpu, "num_gpus": c.gpu_count,
        "gpu_ram": c.gpu_memory_gb * 1024, "cpu_ram": c.ram_gb * 1024, "cpu_cores": c.vcpus,
        "dph_total": price, "dph_base": price, "min_bid": instance.offer.min_bid(),
        "is_bid": instance.bid.is_some(), "disk_space": instance.disk, "geolocation": c.region,
        "start_date": start, "end_date": null, "reliability2": c.reliability,
    })
}

fn status_msg(actual: &Value, intended: &str) -> String {
    match (actual.as_str(), intended) {
        (None, _) => "Creating container".to_string(),
        (Some("loading"), _) => "Pulling image".to_string(),
        (Some("stopped"), _) => "Instance stopped".to_string(),
        (Some("exited"), _) => {
            "Error response from daemon: failed to create task: OCI runtime create failed"
                .to_string()
        }
        _ => "success, running".to_string(),
    }
}

fn machine_id(offer_id: u64) -> u64 {
    offer_id % 100_000 + 1_000
}

fn host_id(offer_id: u64) -> u64 {
    offer_id % 10_000 + 100
}

fn public_ip(offer_id: u64) -> String {
    format!("203.0.113.{}", offer_id % 250 + 1)
}
