//! The JSON of Lambda Cloud instance types, regions and instances.
//!
//! Not filtering or state: rendering is a pure function of the market, an instance and the time.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::state::Instance;
use crate::market::Offer;
use crate::server::Core;

fn region(name: &str) -> Value {
    json!({ "name": name, "description": region_description(name) })
}

fn region_description(name: &str) -> String {
    let mut words = name.split('-');
    let area = match words.next() {
        Some("us") => "United States",
        Some("europe") => "Europe",
        Some("asia") => "Asia",
        Some(other) => other,
        None => "",
    };
    format!("{area} ({name})")
}

/// The GPU as Lambda describes it, with the form factor after the memory as the real API
/// writes it ("H100 (80 GB SXM5)" for `gpu_1x_h100_sxm5`, "A100 (40 GB PCIe)" for
/// `gpu_1x_a100`): the type name's `sxm…` or `pcie` part, else PCIe for the cards Lambda
/// sells as such.
fn gpu_description(type_name: &str, memory_gb: u32) -> String {
    let mut parts = type_name.split('_').skip(2);
    let gpu = parts.next().unwrap_or(type_name).to_uppercase();
    let form = match parts.find(|p| p.starts_with("sxm") || *p == "pcie") {
        Some("pcie") => Some("PCIe".to_owned()),
        Some(form) => Some(form.to_uppercase()),
        None if matches!(gpu.as_str(), "A10" | "A100" | "A6000" | "RTX6000") => {
            Some("PCIe".to_owned())
        }
        None => None,
    };
    match form {
        Some(form) => format!("{gpu} ({memory_gb} GB {form})"),
        None => format!("{gpu} ({memory_gb} GB)"),
    }
}

/// An instance type object.
pub(crate) fn instance_type(offer: &Offer) -> Value {
    let c = &offer.config;
    let gpu_description = gpu_description(&c.gpu, c.gpu_memory_gb);
    json!({
        "name": c.gpu,
        "description": format!("{}x {gpu_description}", c.gpu_count),
        "gpu_description": gpu_description,
        "price_cents_per_hour": (c.price_per_hour * 100.0).round() as u64,
        "specs": { "vcpus": c.vcpus, "memory_gib": c.ram_gb, "storage_gib": c.disk_gb, "gpus": c.gpu_count },
    })
}

/// `GET /instance-types`: keyed by type name, with the regions that have capacity now.
pub(crate) fn instance_types(offers: &[Offer]) -> Value {
    let mut types: BTreeMap<&str, (Value, Vec<Value>)> = BTreeMap::new();
    for offer in offers {
        let entry = types
            .entry(&offer.config.gpu)
            .or_insert_with(|| (instance_type(offer), Vec::new()));
        if offer.available > 0 {
            entry.1.push(region(&offer.config.region));
        }
    }
    let map: serde_json::Map<String, Value> = types
        .into_iter()
        .map(|(name, (kind, regions))| {
            let value =
                json!({ "instance_type": kind, "regions_with_capacity_available": regions });
            (name.to_string(), value)
        })
        .collect();
    Value::Object(map)
}

/// `GET /regions`.
pub(crate) fn regions(offers: &[Offer]) -> Value {
    let mut names: Vec<&str> = offers.iter().map(|o| o.config.region.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Value::Array(names.into_iter().map(region).collect())
}

/// An instance object.
pub(crate) fn instance(instance: &Instance, core: &Core, now: Instant) -> Value {
    let status = instance.status(core, now);
    let has_ip = status != "booting";
    let n = instance.id.bytes().fold(0u32, |acc, b| {
        acc.wrapping_mul(31).wrapping_add(u32::from(b))
    });
    let ip = has_ip.then(|| format!("198.51.100.{}", n % 250 + 1));
    let action = |available: bool| json!({ "available": available });
    let alive = matches!(status, "booting" | "active" | "unhealthy" | "preempted");
    json!({
        "id": instance.id, "name": instance.name, "ip": ip,
        "private_ip": has_ip.then(|| format!("10.19.{}.{}", n % 200, n % 250 + 1)),
        "status": status, "ssh_key_names": instance.ssh_key_names,
        "file_system_names": instance.file_system_names, "file_system_mounts": [],
        "region": region(&instance.offer.config.region),
        "instance_type": instance_type(&instance.offer), "hostname": instance.hostname,
        "jupyter_token": has_ip.then(|| format!("jt{}", &instance.id[..8])),
        "jupyter_url": ip.as_ref().map(|ip| format!("https://{ip}:8888")),
        "tags": instance.tags, "firewall_rulesets": [],
        "actions": {
            "migrate": { "available": false, "reason_code": "not_supported", "reason_description": "Migration is not supported." },
            "rebuild": action(false), "restart": action(status == "active"),
            "cold_reboot": action(status == "active"), "terminate": action(alive),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::gpu_description;

    #[test]
    fn gpu_descriptions_carry_the_form_factor_as_lambda_writes_them() {
        assert_eq!(gpu_description("gpu_1x_h100_sxm5", 80), "H100 (80 GB SXM5)");
        assert_eq!(
            gpu_description("gpu_8x_a100_80gb_sxm4", 80),
            "A100 (80 GB SXM4)"
        );
        assert_eq!(gpu_description("gpu_1x_a100", 40), "A100 (40 GB PCIe)");
        assert_eq!(gpu_description("gpu_1x_gh200", 96), "GH200 (96 GB)");
        assert_eq!(gpu_description("gpu_1x_h100_pcie", 80), "H100 (80 GB PCIe)");
    }
}
