//! `neocloud-node provider smoke --provider runpod|lambda|vast|fake`: drives one adapter through
//! a whole rental against whatever its base URL points at (a simulator in CI, the real cloud in
//! the gated `hack/e2e/` scripts): list offers, create the cheapest allowed instance, wait until
//! it runs, find it by name, delete it, and prove nothing is left. Any leftover is an error.
//!
//! Not a load test and not the Kubernetes path: no Pod, binding or broker is involved.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use neocloud_core::{
    CapacityType, GpuModel, GpuRequest, InstancePhase, Offer, OfferQuery, ProviderHints,
    ProviderId, RunpodCloudType, WorkloadSpec,
};
use neocloud_providers::{
    CreateRequest, FakeProvider, LambdaProvider, Provider, RunpodProvider, VastConfig, VastProvider,
};

/// What the smoke test rents and how long it waits.
#[derive(Debug, Clone)]
pub struct SmokeOptions {
    /// Acceptable GPU models in order of preference; a later model is tried only when every
    /// offer of the earlier ones was refused for capacity. Empty accepts any model.
    pub gpu_models: Vec<String>,
    /// GPUs in the instance.
    pub gpu_count: u32,
    /// On-demand or spot.
    pub capacity: CapacityType,
    /// The most the instance may cost per hour.
    pub max_price_per_hour: Option<f64>,
    /// Least host reliability, where the provider reports one.
    pub min_reliability: Option<f64>,
    /// Only verified hosts.
    pub verified_only: bool,
    /// RunPod cloud to rent in.
    pub runpod_cloud: Option<RunpodCloudType>,
    /// Container disk in GiB.
    pub disk_gib: Option<u32>,
    /// Image to run (ignored by Lambda, which rents virtual machines).
    pub image: String,
    /// The external name of the instance.
    pub name: String,
    /// How long to wait for the instance to run, and then to disappear.
    pub ready_timeout: Duration,
    /// Time between polls.
    pub poll_interval: Duration,
    /// Offers to try before giving up.
    pub max_attempts: usize,
    /// Succeed when every attempt is refused for capacity and that refusal is classified as
    /// capacity (the RunPod capacity-classification check).
    pub accept_capacity_refusal: bool,
}

impl SmokeOptions {
    /// The specification's defaults for `provider`: RunPod one A40; Lambda one A10, then one
    /// A100; Vast one verified GTX 1070, 20 GiB, reliability 0.95, at most $0.10/h.
    pub fn defaults_for(provider: ProviderId) -> SmokeOptions {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let models: &[&str] = match provider {
            ProviderId::Lambda => &["A10", "A100"],
            ProviderId::Vast => &["GTX 1070"],
            _ => &["A40"],
        };
        let vast = provider == ProviderId::Vast;
        SmokeOptions {
            gpu_models: models.iter().map(|m| (*m).to_owned()).collect(),
            gpu_count: 1,
            capacity: CapacityType::OnDemand,
            max_price_per_hour: vast.then_some(0.10),
            min_reliability: vast.then_some(0.95),
            verified_only: vast,
            runpod_cloud: None,
            disk_gib: vast.then_some(20),
            image: "ubuntu:22.04".to_owned(),
            name: format!("nc-smoke-{provider}-{secs:x}"),
            ready_timeout: Duration::from_secs(20 * 60),
            poll_interval: Duration::from_secs(10),
            max_attempts: 5,
            accept_capacity_refusal: false,
        }
    }
}

/// What happened, step by step.
#[derive(Debug, Clone, PartialEq)]
pub struct SmokeReport {
    /// The provider tested.
    pub provider: ProviderId,
    /// The external name used.
    pub name: String,
    /// The offer rented, if any.
    pub offer: Option<Offer>,
    /// The instance id, if one was created.
    pub instance_id: Option<String>,
    /// Each completed step and how long it took.
    pub steps: Vec<(&'static str, Duration)>,
    /// The capacity refusals met on the way (message per offer tried).
    pub capacity_refusals: Vec<String>,
}

/// Builds the adapter for `provider` from the specification's environment variables; Vast's
/// search defaults follow the options, and the fake gets a small market of its own.
pub fn provider_from_env(
    provider: ProviderId,
    opts: &SmokeOptions,
) -> anyhow::Result<Arc<dyn Provider>> {
    Ok(match provider {
        ProviderId::Runpod => Arc::new(RunpodProvider::from_env()?),
        ProviderId::Lambda => Arc::new(LambdaProvider::from_env()?),
        ProviderId::Vast => {
            let mut config = VastConfig::from_env()?;
            config.verified = opts.verified_only;
            config.min_reliability = opts.min_reliability.unwrap_or(0.0);
            config.disk_gib = opts.disk_gib.unwrap_or(config.disk_gib);
            Arc::new(VastProvider::new(config)?)
        }
        ProviderId::Fake => Arc::new(FakeProvider::sample_market()),
        ProviderId::Kube => bail!("the kube provider has no smoke test"),
    })
}

/// Runs the smoke test; an error names the step that failed and any instance left behind.
pub async fn run_smoke(
    provider: &dyn Provider,
    opts: &SmokeOptions,
) -> anyhow::Result<SmokeReport> {
    let mut report = SmokeReport {
        provider: provider.id(),
        name: opts.name.clone(),
        offer: None,
        instance_id: None,
        steps: Vec::new(),
        capacity_refusals: Vec::new(),
    };
    let started = Instant::now();
    provider.health().await.context("health check failed")?;
    report.steps.push(("health", started.elapsed()));
    let outcome = rent_and_release(provider, opts, &mut report).await;
    let leftovers = leftovers(provider, opts).await;
    match (outcome, leftovers) {
        (Ok(()), Ok(left)) if left.is_empty() => Ok(report),
        (result, left) => {
            let left = left.unwrap_or_else(|e| vec![format!("unknown: listing failed: {e}")]);
            let cleanup = clean_up(provider, &left).await;
            let why = result
                .err()
                .map_or("instances were left behind".to_owned(), |e| {
                    format!("{e:#}")
                });
            bail!(
                "smoke test of {} failed: {why}; leftovers: {left:?}{cleanup}",
                provider.id()
            )
        }
    }
}

async fn rent_and_release(
    provider: &dyn Provider,
    opts: &SmokeOptions,
    report: &mut SmokeReport,
) -> anyhow::Result<()> {
    let step = Instant::now();
    let candidates = allowed_offers(provider, opts).await?;
    report.steps.push(("offers", step.elapsed()));
    let step = Instant::now();
    let Some((offer, created)) = create_first(provider, opts, &candidates, report).await? else {
        return Ok(());
    };
    report.offer = Some(offer);
    report.instance_id = Some(created.clone());
    report.steps.push(("create", step.elapsed()));
    let step = Instant::now();
    wait_running(provider, opts, &created).await?;
    report.steps.push(("ready", step.elapsed()));
    check_found(provider, opts, &created).await?;
    let step = Instant::now();
    provider.delete(&created).await.context("delete failed")?;
    provider
        .delete(&created)
        .await
        .context("a second delete of the same instance failed")?;
    wait_gone(provider, opts, &created).await?;
    report.steps.push(("delete", step.elapsed()));
    Ok(())
}

/// Offers that satisfy every option, by model preference then price.
async fn allowed_offers(
    provider: &dyn Provider,
    opts: &SmokeOptions,
) -> anyhow::Result<Vec<Offer>> {
    let query = OfferQuery {
        gpu_models: opts.gpu_models.clone(),
        gpu_count: opts.gpu_count,
        capacity: Some(opts.capacity),
    };
    let offers = provider
        .list_offers(&query)
        .await
        .context("listing offers failed")?;
    let mut allowed: Vec<(usize, Offer)> = offers
        .into_iter()
        .filter(|o| allows(opts, o))
        .filter_map(|o| Some((preference(opts, &o)?, o)))
        .collect();
    allowed.sort_by(|(ra, a), (rb, b)| {
        ra.cmp(rb)
            .then(a.rent_price_per_hour().total_cmp(&b.rent_price_per_hour()))
    });
    if allowed.is_empty() {
        bail!(
            "no offer satisfies the smoke options ({:?}, {} gpu, {}, max {:?}/h)",
            opts.gpu_models,
            opts.gpu_count,
            opts.capacity,
            opts.max_price_per_hour
        );
    }
    Ok(allowed.into_iter().map(|(_, o)| o).collect())
}

/// The position of the offer's GPU among the wanted models (0 when any model is accepted).
fn preference(opts: &SmokeOptions, offer: &Offer) -> Option<usize> {
    if opts.gpu_models.is_empty() {
        return Some(0);
    }
    opts.gpu_models.iter().position(|m| {
        GpuModel::accepted_by_name(m)
            .iter()
            .any(|a| a.accepts(&offer.gpu))
    })
}

fn allows(opts: &SmokeOptions, offer: &Offer) -> bool {
    let capacity_ok = match opts.capacity {
        CapacityType::OnDemand => !offer.capacity.is_spot(),
        CapacityType::Spot => offer.capacity.is_spot(),
        CapacityType::Any => true,
    };
    let price_ok = opts
        .max_price_per_hour
        .is_none_or(|max| offer.rent_price_per_hour() <= max);
    let reliability_ok = opts
        .min_reliability
        .is_none_or(|min| offer.reliability.is_none_or(|r| r >= min));
    let cloud_ok = opts
        .runpod_cloud
        .is_none_or(|c| offer.runpod_cloud.is_none_or(|o| c.allows(o)));
    let disk_ok = opts
        .disk_gib
        .is_none_or(|d| offer.disk_gib.is_none_or(|o| o >= d));
    capacity_ok
        && price_ok
        && reliability_ok
        && cloud_ok
        && disk_ok
        && (offer.verified || !opts.verified_only)
}

/// Creates on the first candidate that has capacity; `None` when every one was refused for
/// capacity and that is acceptable.
async fn create_first(
    provider: &dyn Provider,
    opts: &SmokeOptions,
    candidates: &[Offer],
    report: &mut SmokeReport,
) -> anyhow::Result<Option<(Offer, String)>> {
    for offer in candidates.iter().take(opts.max_attempts.max(1)) {
        match provider.create(&request(opts, offer)).await {
            Ok(state) => return Ok(Some((offer.clone(), state.id))),
            Err(e) if e.class == neocloud_core::FailureClass::Capacity => {
                report.capacity_refusals.push(e.to_string())
            }
            Err(e) => {
                return Err(e).with_context(|| format!("create on offer {} failed", offer.id));
            }
        }
    }
    if opts.accept_capacity_refusal {
        return Ok(None);
    }
    bail!(
        "every offer tried was refused for capacity: {:?}",
        report.capacity_refusals
    )
}

fn request(opts: &SmokeOptions, offer: &Offer) -> CreateRequest {
    let workload = WorkloadSpec {
        image: opts.image.clone(),
        command: vec!["sleep".to_owned()],
        args: vec!["infinity".to_owned()],
        env: vec![],
        env_from: vec![],
        ports: vec![],
        gpu: GpuRequest {
            count: opts.gpu_count,
            accepted: vec![offer.gpu.clone()],
        },
        resources: Default::default(),
        disk_gib: opts.disk_gib,
        capacity_type: opts.capacity,
        regions: vec![],
        providers: vec![offer.provider],
        max_price_per_hour: opts.max_price_per_hour,
        constraint: None,
        rank: None,
        policy: None,
        hints: ProviderHints::default(),
    };
    let bid = offer
        .capacity
        .is_spot()
        .then(|| offer.rent_price_per_hour());
    CreateRequest {
        external_name: opts.name.clone(),
        offer: offer.clone(),
        workload,
        env: vec![("NEOCLOUD_SMOKE".to_owned(), "1".to_owned())],
        bid_per_hour: bid,
        boot: None,
        registry_login: None,
    }
}

async fn wait_running(
    provider: &dyn Provider,
    opts: &SmokeOptions,
    id: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + opts.ready_timeout;
    loop {
        let state = provider
            .get(id)
            .await
            .context("reading the instance failed")?;
        let Some(state) = state else {
            bail!("instance {id} disappeared before it ran")
        };
        match state.phase {
            InstancePhase::Running => return Ok(()),
            p if p.is_terminal() || p == InstancePhase::Stopped => bail!(
                "instance {id} ended as {p} ({}) before it ran",
                state.provider_status
            ),
            _ if Instant::now() >= deadline => bail!(
                "instance {id} was still {} after {:?}",
                state.provider_status,
                opts.ready_timeout
            ),
            _ => tokio::time::sleep(opts.poll_interval).await,
        }
    }
}

async fn check_found(provider: &dyn Provider, opts: &SmokeOptions, id: &str) -> anyhow::Result<()> {
    let found = provider
        .find_by_name(&opts.name)
        .await
        .context("finding the instance by name failed")?;
    if found.as_ref().map(|s| s.id.as_str()) != Some(id) {
        bail!(
            "finding {} by name returned {:?}, not instance {id}",
            opts.name,
            found.map(|s| s.id)
        );
    }
    let ours = provider
        .list_ours(&opts.name)
        .await
        .context("listing our instances failed")?;
    if !ours.iter().any(|s| s.id == id) {
        bail!(
            "listing instances with prefix {} did not return instance {id}",
            opts.name
        );
    }
    Ok(())
}

async fn wait_gone(provider: &dyn Provider, opts: &SmokeOptions, id: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + opts.ready_timeout;
    loop {
        let state = provider
            .get(id)
            .await
            .context("reading the deleted instance failed")?;
        let gone = state
            .as_ref()
            .is_none_or(|s| s.phase.is_terminal() || s.phase == InstancePhase::Terminating);
        if gone {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "instance {id} still exists after delete: {:?}",
                state.map(|s| s.provider_status)
            );
        }
        tokio::time::sleep(opts.poll_interval).await;
    }
}

/// Ids of live instances still carrying the smoke name (by name and by prefix listing).
async fn leftovers(provider: &dyn Provider, opts: &SmokeOptions) -> anyhow::Result<Vec<String>> {
    let mut left: Vec<String> = provider
        .list_ours(&opts.name)
        .await?
        .into_iter()
        .map(|s| s.id)
        .collect();
    if let Some(found) = provider.find_by_name(&opts.name).await? {
        left.push(found.id);
    }
    left.sort();
    left.dedup();
    Ok(left)
}

async fn clean_up(provider: &dyn Provider, ids: &[String]) -> String {
    let mut failed = Vec::new();
    for id in ids.iter().filter(|id| !id.starts_with("unknown")) {
        if let Err(e) = provider.delete(id).await {
            failed.push(format!("{id}: {e}"));
        }
    }
    match failed.is_empty() {
        true if ids.is_empty() => String::new(),
        true => " (deleted them now; check the provider console)".to_owned(),
        false => format!(" (could not delete: {failed:?}; delete them in the provider console)"),
    }
}
