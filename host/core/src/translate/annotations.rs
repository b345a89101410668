//! The `cloud.aibrix.ai/*` annotations: each parsed strictly, an unparsable value refused (never a
//! silent default), and an unknown key under the prefix refused so a typo cannot be ignored.
//!
//! Not for evaluating CEL (the policy engine compiles `constraints` and `rank`).

use std::collections::BTreeMap;

use super::Refusal;
use super::container::ContainerParts;
use crate::gpu::GpuModel;
use crate::provider_id::ProviderId;
use crate::workload::{CapacityType, GpuRequest, ProviderHints, RunpodCloudType, WorkloadSpec};

/// The prefix of every annotation this module reads.
pub const ANNOTATION_PREFIX: &str = "cloud.aibrix.ai/";

/// Every annotation name (after the prefix) a Pod may carry.
pub const KNOWN_ANNOTATIONS: [&str; 18] = [
    "gpu-type",
    "max-price",
    "capacity-type",
    "regions",
    "providers",
    "constraints",
    "rank",
    "policy",
    "disk-gb",
    "vast-verified",
    "vast-machine-id",
    "vast-disk-gb",
    "vast-offer-id",
    "runpod-cloud-type",
    "runner",
    "egress",
    "gang",
    "gang-size",
];

/// The longest CEL expression accepted in `constraints` or `rank`.
pub const MAX_EXPRESSION_BYTES: usize = 4096;

/// Annotation values, parsed.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    gpu_models: Vec<GpuModel>,
    max_price: Option<f64>,
    capacity_type: CapacityType,
    regions: Vec<String>,
    providers: Vec<ProviderId>,
    constraint: Option<String>,
    rank: Option<String>,
    policy: Option<String>,
    disk_gib: Option<u32>,
    hints: ProviderHints,
}

type Outcome = Result<(), String>;

pub(super) fn parse(
    annotations: Option<&BTreeMap<String, String>>,
    out: &mut Vec<Refusal>,
) -> Parsed {
    let mut parsed = Parsed::default();
    for (key, value) in annotations.into_iter().flatten() {
        let Some(name) = key.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        if let Err(reason) = parsed.apply(name, value) {
            out.push(Refusal::new(format!("metadata.annotations[{key}]"), reason));
        }
    }
    parsed
}

impl Parsed {
    fn apply(&mut self, name: &str, value: &str) -> Outcome {
        match name {
            "gpu-type" => self.gpu_models = gpu_models(value)?,
            "max-price" => self.max_price = Some(price(value)?),
            "capacity-type" => self.capacity_type = capacity_type(value)?,
            "regions" => self.regions = regions(value)?,
            "providers" => self.providers = providers(value)?,
            "constraints" => self.constraint = Some(expression(value)?),
            "rank" => self.rank = Some(expression(value)?),
            "policy" => self.policy = Some(policy_name(value)?),
            "disk-gb" => self.disk_gib = Some(gib(value)?),
            "vast-verified" => self.hints.vast.verified = boolean(value)?,
            "vast-machine-id" => self.hints.vast.machine_id = Some(id(value, "a machine id")?),
            "vast-disk-gb" => self.hints.vast.disk_gib = gib(value)?,
            "vast-offer-id" => self.hints.vast.offer_id = Some(id(value, "an offer id")?),
            "runpod-cloud-type" => self.hints.runpod_cloud_type = Some(runpod_cloud(value)?),
            "runner" => self.hints.no_runner = !boolean(value)?,
            // Read on its own by `translate::egress`; checked here like every annotation.
            "egress" => {
                super::parse_egress(value)?;
            }
            // A gang and its size: they describe a group of Pods, not this Pod's rental, and are
            // read (and their values checked, the group's agreement included) where gangs are
            // held, `neocloud_controller::holds::gangs`.
            "gang" | "gang-size" => {}
            _ => {
                return Err(format!(
                    "unknown annotation; known ones are {}",
                    KNOWN_ANNOTATIONS.join(", ")
                ));
            }
        }
        Ok(())
    }

    pub(super) fn into_workload(self, c: ContainerParts) -> WorkloadSpec {
        WorkloadSpec {
            image: c.image,
            command: c.command,
            args: c.args,
            env: c.env,
            env_from: c.env_from,
            ports: c.ports,
            gpu: GpuRequest {
                count: c.gpu_count,
                accepted: self.gpu_models,
            },
            resources: c.resources,
            disk_gib: self.disk_gib,
            capacity_type: self.capacity_type,
            regions: self.regions,
            providers: self.providers,
            max_price_per_hour: self.max_price,
            constraint: self.constraint,
            rank: self.rank,
            policy: self.policy,
            hints: self.hints,
        }
    }
}

fn list(value: &str) -> Option<Vec<&str>> {
    let items: Vec<&str> = value.split(',').map(str::trim).collect();
    items.iter().all(|i| !i.is_empty()).then_some(items)
}

fn gpu_models(value: &str) -> Result<Vec<GpuModel>, String> {
    let names = list(value)
        .ok_or_else(|| format!("{value:?} is not a comma-separated list of GPU models"))?;
    let mut models: Vec<GpuModel> = Vec::new();
    for model in names.into_iter().flat_map(GpuModel::accepted_by_name) {
        if !models.contains(&model) {
            models.push(model);
        }
    }
    Ok(models)
}

fn price(value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|p| p.is_finite() && *p > 0.0)
        .ok_or_else(|| format!("{value:?} is not a positive price in USD per hour"))
}

fn capacity_type(value: &str) -> Result<CapacityType, String> {
    match value.trim() {
        "on-demand" => Ok(CapacityType::OnDemand),
        "spot" => Ok(CapacityType::Spot),
        "any" => Ok(CapacityType::Any),
        _ => Err(format!("{value:?} is not one of on-demand, spot, any")),
    }
}

fn regions(value: &str) -> Result<Vec<String>, String> {
    let valid = |r: &&str| {
        r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    match list(value) {
        Some(items) if items.iter().all(valid) => {
            Ok(items.into_iter().map(str::to_owned).collect())
        }
        _ => Err(format!(
            "{value:?} is not a comma-separated list of regions"
        )),
    }
}

fn providers(value: &str) -> Result<Vec<ProviderId>, String> {
    let items = list(value)
        .ok_or_else(|| format!("{value:?} is not a comma-separated list of providers"))?;
    let mut result = Vec::with_capacity(items.len());
    for item in items {
        let provider: ProviderId = item.parse().map_err(|e| format!("{e}"))?;
        if result.contains(&provider) {
            return Err(format!("{value:?} names {provider} twice"));
        }
        result.push(provider);
    }
    Ok(result)
}

fn expression(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("an empty expression is not allowed".to_owned())
    } else if value.len() > MAX_EXPRESSION_BYTES {
        Err(format!(
            "the expression is {} bytes long; at most {MAX_EXPRESSION_BYTES} are allowed",
            value.len()
        ))
    } else {
        Ok(value.to_owned())
    }
}

/// A DNS-1123 subdomain, as Kubernetes requires for a BurstPolicy name.
fn policy_name(value: &str) -> Result<String, String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if value.len() <= 253 && value.split('.').all(label_ok) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a valid policy name (a DNS-1123 subdomain)"
        ))
    }
}

fn gib(value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{value:?} is not a positive whole number of GiB"))
}

fn boolean(value: &str) -> Result<bool, String> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{value:?} is not true or false")),
    }
}

fn id(value: &str, what: &str) -> Result<u64, String> {
    value
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("{value:?} is not {what} (a whole number)"))
}

fn runpod_cloud(value: &str) -> Result<RunpodCloudType, String> {
    match value.trim().to_ascii_uppercase().as_str() {
        "SECURE" => Ok(RunpodCloudType::Secure),
        "COMMUNITY" => Ok(RunpodCloudType::Community),
        "ALL" => Ok(RunpodCloudType::All),
        _ => Err(format!("{value:?} is not one of SECURE, COMMUNITY, ALL")),
    }
}
