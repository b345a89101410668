//! `neocloud-node provider smoke`: rents the cheapest allowed instance from one provider, waits
//! until it is ready, finds it by name, deletes it, and fails if anything is left. Pointed at
//! the simulators by the `*_API_BASE_URL` variables in CI; at the real clouds only through the
//! gated scripts in `hack/e2e/`.

use std::time::Duration;

use clap::{Args, Subcommand};
use neocloud_core::{CapacityType, ProviderId, RunpodCloudType};

use crate::cli::smoke::{SmokeOptions, provider_from_env, run_smoke};

/// `neocloud-node provider ...`.
#[derive(Debug, Subcommand)]
pub enum ProviderCommand {
    /// Create, find and delete one instance, and prove nothing is left.
    Smoke(SmokeArgs),
}

/// Flags of `provider smoke`; unset flags keep the specification's defaults for the provider.
#[derive(Debug, Args)]
pub struct SmokeArgs {
    /// runpod, lambda, vast or fake.
    #[arg(long)]
    provider: ProviderId,
    /// Acceptable GPU models in preference order (repeatable).
    #[arg(long = "gpu")]
    gpus: Vec<String>,
    /// GPUs per instance.
    #[arg(long)]
    gpu_count: Option<u32>,
    /// on-demand or spot.
    #[arg(long)]
    capacity: Option<String>,
    /// RunPod cloud: SECURE or COMMUNITY.
    #[arg(long)]
    runpod_cloud: Option<String>,
    /// A capacity refusal counts as success (the capacity-classification check).
    #[arg(long)]
    accept_capacity_refusal: bool,
    /// Only verified hosts (Vast).
    #[arg(long)]
    verified: Option<bool>,
    /// Disk in GiB.
    #[arg(long)]
    disk_gb: Option<u32>,
    /// Minimum host reliability, 0 to 1.
    #[arg(long, allow_negative_numbers = true)]
    min_reliability: Option<f64>,
    /// Most USD per hour for the instance.
    #[arg(long, allow_negative_numbers = true)]
    max_price: Option<f64>,
    /// The external name (default: a fresh smoke name).
    #[arg(long)]
    name: Option<String>,
    /// The container image.
    #[arg(long)]
    image: Option<String>,
    /// How long to wait for the instance to be ready.
    #[arg(long)]
    ready_timeout_secs: Option<u64>,
}

/// Runs a provider subcommand and returns what to print.
pub async fn run(command: ProviderCommand) -> anyhow::Result<String> {
    let ProviderCommand::Smoke(args) = command;
    let opts = options(&args)?;
    let provider = provider_from_env(args.provider, &opts)?;
    let report = run_smoke(&*provider, &opts).await?;
    let mut out = format!("smoke passed on {}: {}\n", report.provider, report.name);
    for (step, took) in &report.steps {
        out.push_str(&format!("  {step}: {took:?}\n"));
    }
    for refusal in &report.capacity_refusals {
        out.push_str(&format!("  capacity refusal: {refusal}\n"));
    }
    Ok(out)
}

fn options(a: &SmokeArgs) -> anyhow::Result<SmokeOptions> {
    let mut o = SmokeOptions::defaults_for(a.provider);
    if !a.gpus.is_empty() {
        o.gpu_models = a.gpus.clone();
    }
    if let Some(c) = &a.capacity {
        o.capacity = match c.as_str() {
            "on-demand" => CapacityType::OnDemand,
            "spot" => CapacityType::Spot,
            other => anyhow::bail!("--capacity: {other:?} is not on-demand or spot"),
        };
    }
    if let Some(c) = &a.runpod_cloud {
        o.runpod_cloud = Some(match c.to_ascii_uppercase().as_str() {
            "SECURE" => RunpodCloudType::Secure,
            "COMMUNITY" => RunpodCloudType::Community,
            other => anyhow::bail!("--runpod-cloud: {other:?} is not SECURE or COMMUNITY"),
        });
    }
    if let Some(r) = a.min_reliability {
        anyhow::ensure!(
            (0.0..=1.0).contains(&r),
            "--min-reliability: {r} is not between 0 and 1"
        );
        o.min_reliability = Some(r);
    }
    if let Some(p) = a.max_price {
        anyhow::ensure!(
            p.is_finite() && p > 0.0,
            "--max-price: {p} is not a positive price"
        );
        o.max_price_per_hour = Some(p);
    }
    o.gpu_count = a.gpu_count.unwrap_or(o.gpu_count);
    o.verified_only = a.verified.unwrap_or(o.verified_only);
    o.disk_gib = a.disk_gb.or(o.disk_gib);
    o.accept_capacity_refusal |= a.accept_capacity_refusal;
    o.name = a.name.clone().unwrap_or(o.name);
    o.image = a.image.clone().unwrap_or(o.image);
    if let Some(s) = a.ready_timeout_secs {
        o.ready_timeout = Duration::from_secs(s);
    }
    Ok(o)
}
