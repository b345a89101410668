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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use neocloud_broker::{
    AttemptRecorder, Broker, BrokerError, BudgetGuard, Catalog, CatalogConfig, CostLedger,
    DefaultFallback, LadderLimits, Placement, Renter,
};
use neocloud_cloudsim::{
    CloudSim, CloudSimConfig, FaultKind, FaultRule, LedgerEntry, SimConfig, SimHandle,
};
use neocloud_core::{
    Attempt, AttemptOutcome, FailureClass, InstancePhase, InstanceState, ProviderId,
};
use neocloud_providers::{
    ApiKey, HttpConfig, LambdaConfig, LambdaProvider, Provider, RunpodConfig, RunpodProvider,
    VastConfig, VastProvider,
};
use parking_lot::Mutex;
use tokio::time::{Duration, Instant};

use crate::jobs::Job;
use crate::strategy::Compiled;
use crate::trace::{Change, Cloud, Trace};

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

/// A job's place in the loop.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Not arrived yet.
    Future,
    /// Waiting to be placed.
    Waiting,
    /// Rented, not running yet.
    Booting,
    /// Running since this second.
    Running,
    /// Its instance was deleted; waiting until the provider confirms it gone.
    Retiring,
    /// Finished.
    Done,
    /// Given up.
    Abandoned,
}

#[derive(Debug)]
struct Rented {
    provider: ProviderId,
    instance_id: String,
}

#[derive(Debug)]
struct JobState {
    phase: Phase,
    history: Vec<Attempt>,
    rental: Option<Rented>,
    generation: u32,
    outcome: JobOutcome,
    /// After retiring: place again (true) or stop there (false: done or given up).
    then_place: bool,
    /// The second it last started waiting to be placed.
    waiting_since: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Wake {
    Market(usize),
    Arrive(usize),
    Place(usize),
    Finish(usize, u32),
    Poll,
    /// The end of a window of trouble: the fault rules at this index are disarmed.
    Disarm(usize),
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

/// A running replay.
struct Replay<'a> {
    trace: &'a Trace,
    jobs: &'a [Job],
    strategy: &'a Compiled,
    options: &'a Options,
    sim: CloudSim,
    renter: Renter,
    providers: BTreeMap<ProviderId, Arc<dyn Provider>>,
    states: Vec<JobState>,
    wakes: BinaryHeap<Reverse<(u64, u64, Wake)>>,
    seq: u64,
    origin: Instant,
    origin_utc: DateTime<Utc>,
    /// Instance id -> the second it was reclaimed.
    reclaimed: BTreeMap<String, f64>,
    poll_armed: bool,
    /// Fault rules armed for a window, by the index a [`Wake::Disarm`] names.
    windows: Vec<(Cloud, Vec<u64>)>,
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

fn is_gone(i: Option<&InstanceState>) -> bool {
    i.is_none_or(|i| i.phase == InstancePhase::Terminated)
}

impl Replay<'_> {
    fn now_s(&self) -> f64 {
        Instant::now()
            .saturating_duration_since(self.origin)
            .as_secs_f64()
    }

    fn at(&mut self, at_s: f64, wake: Wake) {
        self.seq += 1;
        let ms = (at_s.max(0.0) * 1000.0) as u64;
        self.wakes.push(Reverse((ms, self.seq, wake)));
    }

    fn sim(&self, cloud: Cloud) -> &SimHandle {
        match cloud {
            Cloud::Runpod => &self.sim.runpod,
            Cloud::Lambda => &self.sim.lambda,
            Cloud::Vast => &self.sim.vast,
        }
    }

    fn active(&self) -> bool {
        self.states
            .iter()
            .any(|s| matches!(s.phase, Phase::Booting | Phase::Running | Phase::Retiring))
    }

    fn arm_poll(&mut self) {
        if !self.poll_armed {
            self.poll_armed = true;
            let at = self.now_s() + self.options.poll_s as f64;
            self.at(at, Wake::Poll);
        }
    }

    async fn run(&mut self) -> anyhow::Result<Outcome> {
        for index in 0..self.trace.events.len() {
            self.at(self.trace.events[index].at_s as f64, Wake::Market(index));
        }
        for index in 0..self.jobs.len() {
            self.at(self.jobs[index].arrival_s as f64, Wake::Arrive(index));
        }
        let end = (self.trace.header.duration_s + self.options.drain_s) as f64;
        while let Some(Reverse((ms, _, wake))) = self.wakes.pop() {
            let at = ms as f64 / 1000.0;
            if at > end {
                break;
            }
            tokio::time::sleep_until(self.origin + Duration::from_millis(ms)).await;
            match wake {
                Wake::Market(index) => self.market(index),
                Wake::Arrive(index) => {
                    self.states[index].phase = Phase::Waiting;
                    self.states[index].waiting_since = at;
                    self.place(index).await;
                }
                Wake::Place(index) => self.place(index).await,
                Wake::Finish(index, generation) => self.finish(index, generation).await,
                Wake::Disarm(index) => {
                    let (cloud, ids) = &mut self.windows[index];
                    let (cloud, ids) = (*cloud, std::mem::take(ids));
                    for id in ids {
                        self.sim(cloud).remove_fault(id);
                    }
                }
                Wake::Poll => {
                    self.poll_armed = false;
                    self.poll().await;
                    if self.active() {
                        self.arm_poll();
                    }
                }
            }
        }
        self.stop_everything().await;
        Ok(self.outcome())
    }

    fn market(&mut self, index: usize) {
        let event = self.trace.events[index].clone();
        let now = self.now_s();
        let sim = self.sim(event.provider);
        match event.change {
            Change::Price {
                offer_id,
                price_per_hour,
                spot_price_per_hour,
            } => {
                sim.set_price(offer_id, price_per_hour, spot_price_per_hour);
            }
            Change::Capacity {
                offer_id,
                available,
            } => {
                sim.set_capacity(offer_id, available);
            }
            Change::Reclaim { offer_id } => {
                let hit: Vec<String> = sim
                    .ledger()
                    .entries
                    .into_iter()
                    .filter(|e| e.is_live() && e.spot && e.offer_id == offer_id)
                    .map(|e| e.instance_id)
                    .collect();
                let preempted: Vec<String> = hit.into_iter().filter(|id| sim.preempt(id)).collect();
                for id in preempted {
                    self.reclaimed.entry(id).or_insert(now);
                }
            }
            Change::RateLimit {
                for_s,
                retry_after_s,
            } => {
                let id = sim.add_fault(FaultRule {
                    route: None,
                    count: None,
                    fault: FaultKind::RateLimited {
                        retry_after_secs: retry_after_s,
                    },
                });
                self.window(event.provider, vec![id], now + for_s as f64);
            }
            Change::RefuseCapacity { for_s } => {
                let ids = create_routes(event.provider)
                    .iter()
                    .map(|route| {
                        sim.add_fault(FaultRule {
                            route: Some((*route).to_owned()),
                            count: None,
                            fault: FaultKind::CapacityExhausted,
                        })
                    })
                    .collect();
                self.window(event.provider, ids, now + for_s as f64);
            }
        }
    }

    fn window(&mut self, cloud: Cloud, ids: Vec<u64>, until_s: f64) {
        self.windows.push((cloud, ids));
        let index = self.windows.len() - 1;
        self.at(until_s, Wake::Disarm(index));
    }

    async fn place(&mut self, index: usize) {
        if self.states[index].phase != Phase::Waiting {
            return;
        }
        let jobs = self.jobs;
        let job = &jobs[index];
        let now = self.now_s();
        if now - self.states[index].waiting_since > self.options.give_up_s as f64 {
            self.states[index].phase = Phase::Abandoned;
            return;
        }
        let state = &self.states[index];
        let workload = self.strategy.workload(job, &state.history);
        let broker = Broker {
            planner: self.strategy.planner(&workload),
            renter: Renter {
                fallback: self.strategy.fallback(Arc::clone(&self.renter.fallback)),
                ..self.renter.clone()
            },
        };
        let name = format!("{NAME_PREFIX}{}-{}", job.id, state.generation);
        let recorder = Recorder::default();
        let history = state.history.clone();
        let placement = Placement {
            binding: &job.id,
            external_name: &name,
            workload: &workload,
            env: &[],
            history: &history,
            boot: None,
            registry_login: None,
        };
        let result = broker.place(&placement, &recorder).await;
        let recorded = recorder.attempts.into_inner();
        let state = &mut self.states[index];
        match result {
            Ok((rental, plan)) => {
                tracing::debug!(job = %job.id, instance = %rental.instance.id, provider = %rental.instance.provider, explanation = %plan.explanation, "rented");
                state.history = rental.attempts;
                state.rental = Some(Rented {
                    provider: rental.instance.provider,
                    instance_id: rental.instance.id.clone(),
                });
                state.outcome.rentals += 1;
                state.phase = Phase::Booting;
                self.arm_poll();
            }
            Err(error) => {
                tracing::debug!(job = %job.id, %error, "not placed");
                let attempts = match error {
                    BrokerError::GaveUp { attempts, .. }
                    | BrokerError::OffersTaken { attempts, .. } => attempts,
                    _ => {
                        let mut all = history;
                        all.extend(recorded);
                        all
                    }
                };
                state.history = trim(attempts);
                let again = self.now_s() + self.options.retry_s as f64;
                self.at(again, Wake::Place(index));
            }
        }
    }

    async fn poll(&mut self) {
        let mut seen: BTreeMap<(ProviderId, String), InstanceState> = BTreeMap::new();
        let mut answered = BTreeMap::new();
        for (id, provider) in &self.providers {
            let wanted = self
                .states
                .iter()
                .any(|s| s.rental.as_ref().is_some_and(|r| r.provider == *id));
            if !wanted {
                continue;
            }
            match provider.list_ours(NAME_PREFIX).await {
                Ok(list) => {
                    answered.insert(*id, true);
                    for i in list {
                        seen.insert((i.provider, i.id.clone()), i);
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, provider = %id, "poll failed; next time");
                    answered.insert(*id, false);
                }
            }
        }
        let now = self.now_s();
        for index in 0..self.states.len() {
            let Some(rented) = &self.states[index].rental else {
                continue;
            };
            if answered.get(&rented.provider) != Some(&true) {
                continue;
            }
            let instance = seen.get(&(rented.provider, rented.instance_id.clone()));
            match self.states[index].phase {
                Phase::Retiring if is_gone(instance) => self.retired(index),
                Phase::Retiring => {
                    // The delete failed (a 429 window, say): ask again, as the node does.
                    let provider = self.providers.get(&rented.provider).cloned();
                    let id = rented.instance_id.clone();
                    if let Some(provider) = provider
                        && let Err(error) = provider.delete(&id).await
                    {
                        tracing::debug!(%error, instance = %id, "delete failed again");
                    }
                }
                Phase::Booting | Phase::Running => {
                    let Some(i) = instance else {
                        self.stopped(index, FailureClass::Lost, "the provider no longer lists it")
                            .await;
                        continue;
                    };
                    if i.reclaimed() {
                        let at = self.reclaimed.get(&i.id).copied().unwrap_or(now);
                        self.states[index].outcome.detection_delays_s.push(now - at);
                        let message =
                            format!("{} reclaimed it ({})", i.provider, i.provider_status);
                        self.stopped(index, FailureClass::Preempted, &message).await;
                    } else if matches!(
                        i.phase,
                        InstancePhase::Stopped | InstancePhase::Failed | InstancePhase::Terminated
                    ) {
                        let message = format!("instance is {} ({})", i.phase, i.provider_status);
                        self.stopped(index, FailureClass::Lost, &message).await;
                    } else if i.phase == InstancePhase::Running
                        && self.states[index].phase == Phase::Booting
                    {
                        let job = &self.jobs[index];
                        let state = &mut self.states[index];
                        state.phase = Phase::Running;
                        if state.outcome.time_to_running_s.is_none() {
                            state.outcome.time_to_running_s = Some(now - job.arrival_s as f64);
                        }
                        let generation = state.generation;
                        self.at(now + job.work_s as f64, Wake::Finish(index, generation));
                    }
                }
                _ => {}
            }
        }
    }

    /// The instance stopped without us: the attempt is recorded with its class, the instance
    /// deleted, and the job placed again once it is gone.
    async fn stopped(&mut self, index: usize, class: FailureClass, message: &str) {
        tracing::debug!(job = %self.jobs[index].id, ?class, message, "instance stopped");
        let max = self.options.max_replacements;
        let state = &mut self.states[index];
        if class == FailureClass::Preempted {
            state.outcome.preemptions += 1;
        }
        // The node replaces an instance that stopped without it at most this many times, then
        // fails the Pod.
        let again = state.outcome.replacements < max;
        state.outcome.replacements += 1;
        state.outcome.failed = !again;
        if let Some(rented) = &state.rental {
            let number = state.history.iter().map(|a| a.number).max().unwrap_or(0) + 1;
            let price = state
                .history
                .iter()
                .rev()
                .find(|a| a.provider == rented.provider)
                .map_or(0.0, |a| a.price_per_hour);
            state.history.push(Attempt {
                number,
                provider: rented.provider,
                offer_id: String::new(),
                price_per_hour: price,
                started_at: Utc::now(),
                outcome: AttemptOutcome::Failed {
                    class,
                    code: None,
                    message: message.to_owned(),
                },
            });
        }
        self.retire(index, again).await;
    }

    /// Deletes the job's instance; `place` says whether the job is placed again once the
    /// provider confirms it gone.
    async fn retire(&mut self, index: usize, place: bool) {
        let job_id = self.jobs[index].id.clone();
        let state = &mut self.states[index];
        state.then_place = place;
        state.phase = Phase::Retiring;
        let Some(rented) = &state.rental else {
            self.retired(index);
            return;
        };
        let provider = self.providers.get(&rented.provider).cloned();
        let instance_id = rented.instance_id.clone();
        if let Some(provider) = provider
            && let Err(error) = provider.delete(&instance_id).await
        {
            // Polled again; the delete is retried when the instance is still there.
            tracing::debug!(%error, instance = %instance_id, "delete failed");
        }
        // What the node's broker does when an instance stops (its ledger keeps wall-clock time;
        // the report reads the simulators' ledgers instead).
        self.renter.budget.release(&job_id);
        self.renter.ledger.stop(&job_id, Utc::now());
        self.arm_poll();
    }

    fn retired(&mut self, index: usize) {
        let now = self.now_s();
        let state = &mut self.states[index];
        state.rental = None;
        state.generation += 1;
        if state.then_place {
            state.phase = Phase::Waiting;
            state.waiting_since = now;
            self.at(now, Wake::Place(index));
        } else if state.outcome.completed {
            state.phase = Phase::Done;
        } else {
            state.phase = Phase::Abandoned;
        }
    }

    async fn finish(&mut self, index: usize, generation: u32) {
        let state = &mut self.states[index];
        if state.generation != generation || state.phase != Phase::Running {
            return;
        }
        state.outcome.completed = true;
        self.retire(index, false).await;
    }

    /// After the drain: every instance still rented is deleted and confirmed gone.
    async fn stop_everything(&mut self) {
        for index in 0..self.states.len() {
            if matches!(self.states[index].phase, Phase::Booting | Phase::Running) {
                self.retire(index, false).await;
            } else if matches!(self.states[index].phase, Phase::Waiting | Phase::Future) {
                self.states[index].phase = Phase::Abandoned;
            }
        }
        for _ in 0..20 {
            if !self.active() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(self.options.poll_s)).await;
            // The poll confirms deleted instances gone and deletes again what is still there.
            self.poll().await;
        }
    }

    fn outcome(&self) -> Outcome {
        let simulated_s = self.now_s();
        let mut ledger = Vec::new();
        for cloud in Cloud::ALL {
            for entry in self.sim(cloud).ledger().entries {
                let at = (entry.created_at - self.origin_utc).num_milliseconds() as f64 / 1000.0;
                ledger.push((cloud, at, entry));
            }
        }
        let jobs: Vec<JobOutcome> = self.states.iter().map(|s| s.outcome.clone()).collect();
        let violations = crate::report::violations(
            self.jobs,
            &ledger,
            self.strategy.strategy.budget_usd_per_hour,
        );
        Outcome {
            strategy: self.strategy.strategy.name.clone(),
            jobs,
            ledger,
            violations,
            simulated_s,
        }
    }
}

/// The attempts a job carries into its next plan: every preemption and loss (policies count
/// them), and the last 32 others.
fn trim(attempts: Vec<Attempt>) -> Vec<Attempt> {
    let keep = |a: &Attempt| {
        matches!(
            a.failure(),
            Some(FailureClass::Preempted | FailureClass::Lost)
        )
    };
    let others = attempts.iter().filter(|a| !keep(a)).count();
    let mut skip = others.saturating_sub(32);
    attempts
        .into_iter()
        .filter(|a| {
            if keep(a) || skip == 0 {
                true
            } else {
                skip -= 1;
                false
            }
        })
        .collect()
}
