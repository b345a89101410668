//! The JSON of RunPod pods (REST v2 and GraphQL shapes), the v2 GPU and data-center catalog,
//! and GraphQL `gpuTypes`.
//!
//! Not filtering or state: rendering is a pure function of the market, a pod and the time.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::state::{Pod, Status};
use crate::market::Offer;
use crate::server::Core;

fn runtime_ports(pod: &Pod) -> Vec<Value> {
    pod.spec.ports.iter().enumerate().map(|(i, spec)| {
        let (port, kind) = spec.split_once('/').unwrap_or((spec, "tcp"));
        let private: u64 = port.parse().unwrap_or(0);
        json!({ "private": private, "public": 40_000 + i as u64, "type": kind, "ip": "192.0.2.10" })
    }).collect()
}

/// A pod in the REST v2 shape.
pub(crate) fn pod_v2(pod: &Pod, core: &Core, now: Instant) -> Value {
    let status = pod.status(core, now);
    let running = status == Status::Running;
    let uptime = now.saturating_duration_since(pod.started).as_secs();
    let runtime = running.then(|| {
        json!({
            "uptime": uptime, "gpus": [{ "util": 0, "memoryUtil": 0 }], "cpu": { "util": 1 },
            "memory": { "util": 2 }, "ports": runtime_ports(pod),
        })
    });
    let direct = (running && pod.spec.ports.iter().any(|p| p == "22/tcp"))
        .then(|| json!({ "host": "192.0.2.10", "port": 40_000, "username": "root" }));
    let actions = match status {
        Status::Exited => json!(["start", "terminate"]),
        Status::Error => json!(["terminate"]),
        Status::Running => json!(["stop", "restart", "terminate"]),
        _ => json!(["stop", "terminate"]),
    };
    json!({
        "id": pod.id, "name": pod.spec.name, "status": status.as_str(), "actions": actions,
        "image": pod.spec.image, "args": pod.spec.args, "disk": pod.spec.disk_gb,
        "env": pod.spec.env, "ports": pod.spec.ports, "registry": pod.spec.registry, "mounts": {},
        "gpu": { "id": pod.spec.placement.gpu_id, "count": pod.spec.placement.count }, "cpu": null,
        "cloud": pod.offer.config.cloud.as_deref().unwrap_or("SECURE"),
        "dataCenterId": pod.offer.config.region, "cudaVersion": "12.8",
        "ssh": { "proxy": { "host": "ssh.runpod.io", "port": 22, "username": format!("{}-64410065", pod.id),
                  "command": format!("ssh {}-64410065@ssh.runpod.io", pod.id) }, "direct": direct },
        "template": null, "cost": if status == Status::Exited { 0.0 } else { pod.price() },
        "locked": false, "globalNetworking": { "enabled": false }, "runtime": runtime,
        "createdAt": core.clock.utc(pod.created).to_rfc3339(),
        "startedAt": running.then(|| core.clock.utc(pod.started).to_rfc3339()),
    })
}

/// A pod in the GraphQL shape.
pub(crate) fn pod_gql(pod: &Pod, core: &Core, now: Instant) -> Value {
    let status = pod.status(core, now);
    let running = status == Status::Running;
    let ports: Vec<Value> = runtime_ports(pod).into_iter().map(|p| json!({
        "ip": p["ip"], "isIpPublic": true, "privatePort": p["private"], "publicPort": p["public"], "type": p["type"],
    })).collect();
    let uptime = now.saturating_duration_since(pod.started).as_secs();
    let runtime = running.then(|| json!({ "uptimeInSeconds": uptime, "ports": ports,
        "gpus": [{ "id": "gpu0", "gpuUtilPercent": 0, "memoryUtilPercent": 0 }], "container": { "cpuPercent": 1, "memoryPercent": 2 } }));
    let env: Vec<String> = pod
        .spec
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let machine_id = format!("m{}", &pod.id[..12]);
    json!({
        "id": pod.id, "name": pod.spec.name,
        "desiredStatus": if status == Status::Exited { "EXITED" } else { "RUNNING" },
        "podType": if pod.interruptible() { "INTERRUPTABLE" } else { "RESERVED" },
        "costPerHr": pod.price(), "gpuCount": pod.spec.placement.count, "imageName": pod.spec.image,
        "env": env, "ports": pod.spec.ports.join(","), "dockerArgs": pod.spec.args.clone().unwrap_or_default(),
        "containerDiskInGb": pod.spec.disk_gb, "volumeInGb": pod.spec.volume_gb,
        "volumeMountPath": "/workspace", "vcpuCount": pod.offer.config.vcpus, "memoryInGb": pod.offer.config.ram_gb,
        "machineId": machine_id, "uptimeSeconds": if running { uptime } else { 0 },
        "lastStatusChange": core.clock.utc(pod.exited.unwrap_or(pod.started)).to_rfc2822(),
        "machine": { "podHostId": format!("{}-64410065", pod.id), "gpuDisplayName": display_name(&pod.offer.config.gpu),
                     "gpuTypeId": pod.offer.config.gpu, "location": pod.offer.config.region },
        "runtime": runtime,
    })
}

fn display_name(id: &str) -> String {
    id.trim_start_matches("NVIDIA ")
        .trim_start_matches("GeForce ")
        .to_string()
}

fn availability(available: u32) -> &'static str {
    match available {
        0 => "NONE",
        1..=2 => "LOW",
        3..=5 => "MEDIUM",
        _ => "HIGH",
    }
}

fn cloud(offer: &Offer) -> &str {
    offer.config.cloud.as_deref().unwrap_or("SECURE")
}

fn cheapest(offers: &[&Offer], which: &str, price: fn(&Offer) -> Option<f64>) -> Value {
    offers
        .iter()
        .filter(|o| cloud(o) == which)
        .filter_map(|o| price(o))
        .reduce(f64::min)
        .map_or(Value::Null, Value::from)
}

/// Offers grouped by GPU type id.
pub(crate) fn by_gpu(offers: &[Offer]) -> BTreeMap<String, Vec<&Offer>> {
    let mut groups: BTreeMap<String, Vec<&Offer>> = BTreeMap::new();
    for offer in offers {
        groups
            .entry(offer.config.gpu.clone())
            .or_default()
            .push(offer);
    }
    groups
}

/// One GPU type in the v2 catalog.
pub(crate) fn catalog_gpu(id: &str, offers: &[&Offer]) -> Value {
    let max = |which: &str| {
        offers
            .iter()
            .filter(|o| cloud(o) == which)
            .map(|o| o.config.gpu_count)
            .max()
            .unwrap_or(0)
    };
    let total: u32 = offers.iter().map(|o| o.available).sum();
    let data_centers: Vec<Value> = offers.iter().map(|o| json!({
        "id": o.config.region, "name": data_center_name(&o.config.region), "availability": availability(o.available),
    })).collect();
    json!({
        "id": id, "name": display_name(id), "pool": pool(id), "manufacturer": "NVIDIA",
        "memory": offers.first().map_or(0, |o| o.config.gpu_memory_gb),
        "secure": max("SECURE") > 0, "community": max("COMMUNITY") > 0,
        "price": { "secure": cheapest(offers, "SECURE", |o| Some(o.config.price_per_hour)),
                   "community": cheapest(offers, "COMMUNITY", |o| Some(o.config.price_per_hour)), "serverless": null },
        "maxCount": { "secure": max("SECURE"), "community": max("COMMUNITY") },
        "availability": availability(total), "dataCenters": data_centers,
        "cudaVersions": [{ "version": "12.8", "available": true }],
    })
}

/// One GPU type in GraphQL `gpuTypes`.
pub(crate) fn gql_gpu_type(id: &str, offers: &[&Offer]) -> Value {
    let v2 = catalog_gpu(id, offers);
    let spot = |which: &str| cheapest(offers, which, Offer::min_bid);
    let stock = match v2["availability"].as_str() {
        Some("HIGH") => json!("High"),
        Some("MEDIUM") => json!("Medium"),
        Some("LOW") => json!("Low"),
        _ => Value::Null,
    };
    let max_unreserved: u32 = offers.iter().map(|o| o.available).sum();
    json!({
        "id": id, "displayName": v2["name"], "manufacturer": "NVIDIA", "memoryInGb": v2["memory"],
        "maxGpuCount": v2["maxCount"]["secure"].as_u64().max(v2["maxCount"]["community"].as_u64()),
        "secureCloud": v2["secure"], "communityCloud": v2["community"],
        "securePrice": v2["price"]["secure"], "communityPrice": v2["price"]["community"],
        "secureSpotPrice": spot("SECURE"), "communitySpotPrice": spot("COMMUNITY"),
        "lowestPrice": {
            "minimumBidPrice": cheapest(offers, "SECURE", Offer::min_bid), "uninterruptablePrice": v2["price"]["secure"],
            "minVcpu": offers.first().map_or(0, |o| o.config.vcpus), "minMemory": offers.first().map_or(0, |o| o.config.ram_gb),
            "stockStatus": stock, "availableGpuCounts": [1], "maxUnreservedGpuCount": max_unreserved,
            "countryCode": offers.first().map(|o| o.config.region.split('-').next().unwrap_or_default().to_string()),
        },
    })
}

/// `GET /v2/catalog/datacenters`.
pub(crate) fn data_centers(offers: &[Offer]) -> Value {
    let mut groups: BTreeMap<&str, Vec<&Offer>> = BTreeMap::new();
    for offer in offers {
        groups
            .entry(offer.config.region.as_str())
            .or_default()
            .push(offer);
    }
    let list: Vec<Value> = groups.into_iter().map(|(id, offers)| {
        let gpus: Vec<Value> = offers.iter().map(|o| json!({
            "id": o.config.gpu, "name": display_name(&o.config.gpu), "availability": availability(o.available),
        })).collect();
        json!({ "id": id, "name": data_center_name(id), "region": region_of(id), "globalNetwork": false,
                "networkVolumeTypes": ["STANDARD", "HIGH_PERFORMANCE"], "compliance": [], "gpuAvailability": gpus })
    }).collect();
    json!({ "dataCenters": list })
}

/// The continent a data center id belongs to.
pub(crate) fn region_of(id: &str) -> &'static str {
    match id.split('-').next() {
        Some("US" | "CA") => "NORTH_AMERICA",
        Some("EU" | "EUR") => "EUROPE",
        Some("AP" | "OC") => "ASIA_PACIFIC",
        _ => "OTHER",
    }
}

fn data_center_name(id: &str) -> String {
    id.replace('-', " ")
}

fn pool(id: &str) -> String {
    let name = display_name(id).to_uppercase().replace(' ', "_");
    format!("{name}_POOL")
}
