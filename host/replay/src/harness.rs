//! The replay: the three cloud simulators started in-process with a trace's market, the
//! trace's events applied at their times, and each job placed through the same broker, fallback
//! ladder, price and budget guards and provider adapters the node runs, over real HTTP.
//!
//! Time is tokio's paused clock: the loop sleeps until the next event and the runtime jumps
//! there at once, so a week of market time takes minutes. That only holds if nothing else holds
//! a timer while a request is in flight (the runtime jumps to the earliest timer whenever it
//! waits, even for a response): the adapters run without HTTP timeouts or idle-connection
//! timers and the catalog without a fetch deadline. The ladder's own waits (backoff, a
//! provider's `Retry-After`) are real simulated time, and hold up the whole loop while they
//! last, as if the node placed one Pod at a time.
//!
//! The loop does what the node's reconciler does for a Pod, per job: plan and rent; poll the
//! provider until the instance runs; when it stops without us (a reclaim), record a preemption
//! attempt, delete it, wait until the provider confirms it gone, and place again; when the work
//! is done, delete it. Everything it reports is measured from the simulators' billing ledgers,
//! not from what the broker believes.
//!
//! Must run on a current-thread runtime with a paused clock (`start_paused`).
//!
//! Here: the options and outcome, and [`run`], which starts the simulators and the broker.
//! The event loop is `replay`; what happens to one job at each step is `lifecycle`.

mod lifecycle;
mod replay;

use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use neocloud_broker::{
    AttemptRecorder, BudgetGuard, Catalog, CatalogConfig, CostLedger, DefaultFallback,
    LadderLimits, Renter,
};
use neocloud_cloudsim::{CloudSim, CloudSimConfig, LedgerEntry, SimConfig};
use neocloud_core::Attempt;
use neocloud_providers::{
    ApiKey, HttpConfig, LambdaConfig, LambdaProvider, Provider, RunpodConfig, RunpodProvider,
    VastConfig, VastProvider,
};
use parking_lot::Mutex;
use tokio::time::{Duration, Instant};

use crate::jobs::Job;
use crate::strategy::Compiled;
use crate::trace::{Cloud, Trace};
use replay::{JobState, Phase, Replay};

/// Every instance a replay rents is named with this prefix.
pub const NAME_PREFIX: &str = "replay-";

/// How the replay behaves (not the market, not the strategy).
#[derive(Debug, Clone)]
pub struct Options {
    /// How often running and booting instances are polled (the node's status poll).
    pub poll_s: u64,
    /// How long a job that could not be placed waits before it is planned again.
    pub retry_s: u64,
    /// A job waiting this long to be placed (since it arrived, or since its instance stopped)
    /// is given up: never placed, or unfinished.
    pub give_up_s: u64,
    /// After the trace ends, jobs still running get this long to finish; then they are
    /// stopped and counted as unfinished.
    pub drain_s: u64,
    /// A job whose instance stopped without us this many times is failed, not placed again
    /// (the node's `MAX_REPLACEMENTS`: a Pod fails after 5 replacements).
    pub max_replacements: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            poll_s: 30,
            retry_s: 60,
            give_up_s: 24 * 3600,
            drain_s: 2 * 86_400,
            max_replacements: 5,
        }
    }
}

/// What became of one job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    /// The job.
    pub id: String,
    /// GPUs per instance.
    pub gpus: u32,
    /// Seconds of work.
    pub work_s: u64,
    /// Seconds from arrival until it first ran, if it ran.
    pub time_to_running_s: Option<f64>,
    /// Whether its work completed.
    pub completed: bool,
    /// How many times it was preempted.
    pub preemptions: u32,
    /// For each preemption, seconds from the reclaim until the replay noticed it.
    pub detection_delays_s: Vec<f64>,
    /// Instances it rented.
    pub rentals: u32,
    /// Instances that stopped without us (preempted or lost).
    pub replacements: u32,
    /// Failed after the most replacements the node makes.
    pub failed: bool,
}

/// A replay's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The strategy's name.
    pub strategy: String,
    /// Per job.
    pub jobs: Vec<JobOutcome>,
    /// Every instance the simulators billed, with the second (from the trace's start) it
    /// was created at.
    pub ledger: Vec<(Cloud, f64, LedgerEntry)>,
    /// Broken invariants (overspend, leaks, double rentals), one line each; empty is good.
    pub violations: Vec<String>,
    /// Simulated seconds the replay covered.
    pub simulated_s: f64,
}

/// Keeps a rental's attempts as the broker records them (the node's binding status).
#[derive(Debug, Default)]
struct Recorder {
    attempts: Mutex<Vec<Attempt>>,
}

#[async_trait]
impl AttemptRecorder for Recorder {
    async fn record(&self, attempt: &Attempt) -> Result<(), String> {
        let mut attempts = self.attempts.lock();
        match attempts.iter_mut().find(|a| a.number == attempt.number) {
            Some(known) => *known = attempt.clone(),
            None => attempts.push(attempt.clone()),
        }
        Ok(())
    }
}

/// The HTTP client settings a paused clock needs (see the module's documentation).
pub fn virtual_clock_http() -> HttpConfig {
    HttpConfig {
        timeout_ms: 0,
        connect_timeout_ms: 0,
        idle_timeout_ms: 0,
        ..HttpConfig::default()
    }
}

fn sim_config(trace: &Trace, cloud: Cloud) -> SimConfig {
    let mut config = SimConfig {
        offers: Some(trace.offers_of(cloud)),
        ..SimConfig::default()
    };
    if let Some(timing) = trace.timing_of(cloud) {
        config.timing = timing;
    }
    config
}

/// The routes a create takes on each simulator (for capacity refusals).
fn create_routes(cloud: Cloud) -> &'static [&'static str] {
    match cloud {
        Cloud::Runpod => &["POST /v2/pods", "POST /graphql"],
        Cloud::Lambda => &["POST /api/v1/instance-operations/launch"],
        Cloud::Vast => &["PUT /api/v0/asks/{id}/"],
    }
}

/// The simulators' configuration for a trace's market at time zero (what a test that runs the
/// same market through the node starts).
pub fn cloudsim_config(trace: &Trace) -> CloudSimConfig {
    CloudSimConfig {
        runpod: sim_config(trace, Cloud::Runpod),
        lambda: sim_config(trace, Cloud::Lambda),
        vast: sim_config(trace, Cloud::Vast),
    }
}

/// Replays `jobs` on `trace` under `strategy`.
pub async fn run(
    trace: &Trace,
    jobs: &[Job],
    strategy: &Compiled,
    options: &Options,
) -> anyhow::Result<Outcome> {
    let sim = CloudSim::start(cloudsim_config(trace)).await?;
    let origin = Instant::now();
    let origin_utc = Utc::now();
    let http = virtual_clock_http();
    let runpod = RunpodProvider::new(RunpodConfig {
        base_url: sim.runpod.base_url(),
        http: http.clone(),
        ..RunpodConfig::new(ApiKey::new(sim.runpod.api_key()))
    })?;
    let lambda = LambdaProvider::new(LambdaConfig {
        base_url: sim.lambda.base_url(),
        http: http.clone(),
        ..LambdaConfig::new(
            ApiKey::new(sim.lambda.api_key()),
            neocloud_cloudsim::config::DEFAULT_SSH_KEY,
        )
    })?;
    let vast = VastProvider::new(VastConfig {
        base_url: sim.vast.base_url(),
        http,
        ..VastConfig::new(ApiKey::new(sim.vast.api_key()))
    })?;
    let list: Vec<Arc<dyn Provider>> = vec![Arc::new(runpod), Arc::new(lambda), Arc::new(vast)];
    let providers = list.iter().map(|p| (p.id(), Arc::clone(p))).collect();
    let catalog = Catalog::new(
        list,
        CatalogConfig {
            fetch_timeout: Duration::ZERO,
            ..CatalogConfig::default()
        },
    );
    let renter = Renter {
        catalog,
        fallback: Arc::new(DefaultFallback::default()),
        limits: LadderLimits::default(),
        budget: BudgetGuard::new(strategy.strategy.budget_usd_per_hour),
        ledger: Arc::new(CostLedger::new()),
    };
    let states = jobs
        .iter()
        .map(|job| JobState {
            phase: Phase::Future,
            history: Vec::new(),
            rental: None,
            generation: 0,
            outcome: JobOutcome {
                id: job.id.clone(),
                gpus: job.gpus,
                work_s: job.work_s,
                time_to_running_s: None,
                completed: false,
                preemptions: 0,
                detection_delays_s: Vec::new(),
                rentals: 0,
                replacements: 0,
                failed: false,
            },
            then_place: false,
            waiting_since: 0.0,
        })
        .collect();
    let mut replay = Replay {
        trace,
        jobs,
        strategy,
        options,
        sim,
        renter,
        providers,
        states,
        wakes: BinaryHeap::new(),
        seq: 0,
        origin,
        origin_utc,
        reclaimed: BTreeMap::new(),
        poll_armed: false,
        windows: Vec::new(),
    };
    replay.run().await
}
