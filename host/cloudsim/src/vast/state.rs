//! Vast.ai instances: renting an ask, statuses derived from elapsed time, stop by preemption or
//! low bid, destroy, and the keyset-paginated list; with `run_user_data`, the runner of an
//! instance whose start command (`runtype: "args"`, `args`) runs `neocloud-runner` (see
//! `crate::runner`).
//!
//! Not HTTP: handlers translate requests into these calls and results into wire bodies.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::time::Instant;

use super::query::{self, Condition};
use super::wire::CreateRequest;
use crate::clock::SimClock;
use crate::market::Offer;
use crate::registries::{Login, PrivateRegistry, pull_error};
use crate::runner::{self, Phase, RunnerHost, RunnerSpec, Runners};
use crate::server::Core;

/// The largest page of `GET /api/v1/instances/`.
pub(crate) const MAX_PAGE: usize = 25;
/// The page size used when `limit` is zero or negative.
pub(crate) const SMALL_PAGE: usize = 5;
const FIRST_CONTRACT: u64 = 20_000_000;
const DEFAULT_DISK_GB: f64 = 10.0;

/// One rented instance.
#[derive(Clone)]
pub(crate) struct Instance {
    pub id: u64,
    pub label: String,
    pub offer: Offer,
    pub image: String,
    pub args: Vec<String>,
    pub disk: f64,
    pub env: Vec<(String, String)>,
    pub onstart: String,
    pub runtype: String,
    pub bid: Option<f64>,
    pub created: Instant,
    pub started: Instant,
    pub stopped: Option<Instant>,
    pub failed: bool,
    /// Docker's error when the image could not be pulled (the instance is `exited`).
    pub pull_error: Option<String>,
}

/// `Debug` shows what identifies it only: its env and start command carry the runner's secrets.
impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("id", &self.id)
            .field("label", &self.label)
            .field("image", &self.image)
            .field("runtype", &self.runtype)
            .finish_non_exhaustive()
    }
}

impl Instance {
    fn new(
        id: u64,
        offer: Offer,
        request: &CreateRequest,
        now: Instant,
        stopped: bool,
        pull_error: Option<String>,
    ) -> Self {
        Self {
            id,
            label: request.label.clone(),
            image: request.image.clone().unwrap_or_default(),
            args: request.args.clone(),
            disk: request.disk.unwrap_or(DEFAULT_DISK_GB),
            env: super::handlers::parse_env(request.env.as_ref()),
            onstart: request.onstart.clone(),
            runtype: request.runtype.clone().unwrap_or_else(|| "ssh".to_string()),
            bid: request.price,
            offer,
            created: now,
            started: now,
            stopped: stopped.then_some(now),
            failed: pull_error.is_some(),
            pull_error,
        }
    }

    fn phase(&self, core: &Core, now: Instant) -> Phase {
        if self.stopped.is_some() || self.failed {
            return Phase::Gone;
        }
        let t = core.config.timing;
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed < SimClock::ms(t.provisioning_ms + t.starting_ms) {
            Phase::Booting
        } else {
            Phase::Running
        }
    }
}

/// The runner's arguments in an instance's start command: `args` with `runtype: "args"` (see
/// [`runner::container_runner_args`]).
fn start_command_runner_args(runtype: &str, args: &[String]) -> Option<Vec<String>> {
    (runtype == "args")
        .then(|| runner::container_runner_args(args))
        .flatten()
}

/// Docker's error if the request's image cannot be pulled with its `image_login`.
fn image_pull_error(registries: &[PrivateRegistry], request: &CreateRequest) -> Option<String> {
    let image = request.image.as_deref().unwrap_or_default();
    let words = request.image_login.as_deref().and_then(shlex::split);
    let login = words.as_deref().and_then(docker_login);
    pull_error(registries, image, login)
}

/// The login in `docker login` arguments: `-u USER -p PASS [REGISTRY]`, in any order.
fn docker_login(words: &[String]) -> Option<Login<'_>> {
    let (mut username, mut password, mut registry) = (None, None, None);
    let mut words = words.iter();
    while let Some(word) = words.next() {
        match word.as_str() {
            "-u" | "--username" => username = words.next(),
            "-p" | "--password" => password = words.next(),
            _ => registry = Some(word),
        }
    }
    Some(Login {
        username: username?,
        password: password?,
        registry: registry.map(String::as_str),
    })
}

/// How a rental ended.
#[derive(Debug)]
pub(crate) enum Rental {
    /// Created and starting.
    Created(u64),
    /// The ask is gone or fully rented.
    NoSuchAsk,
    /// Created stopped because the bid is below the minimum.
    BidTooLow { id: u64, min_bid: f64 },
    /// The account's instance quota is used up.
    QuotaExceeded,
}

/// One page of the instance list.
#[derive(Debug)]
pub(crate) struct Page {
    pub instances: Vec<Value>,
    pub found: usize,
    pub total: usize,
    pub next_after: Option<u64>,
    pub label_counts: BTreeMap<String, usize>,
}

#[derive(Debug, Default)]
struct Inner {
    instances: BTreeMap<u64, Instance>,
    next_id: u64,
}

/// The Vast simulator's state.
#[derive(Debug)]
pub(crate) struct VastState {
    pub core: Arc<Core>,
    inner: Mutex<Inner>,
    pub runners: Runners,
    me: Weak<Self>,
}

impl VastState {
    pub fn new(core: Arc<Core>) -> Arc<Self> {
        let inner = Inner {
            instances: BTreeMap::new(),
            next_id: FIRST_CONTRACT,
        };
        Arc::new_cyclic(|me| Self {
            core,
            inner: Mutex::new(inner),
            runners: Runners::default(),
            me: me.clone(),
        })
    }

    /// With `run_user_data`, schedules the runner of the instance's start command for when it
    /// runs.
    fn start_runner(&self, instance: &Instance) {
        let Some(binary) = runner::configured_binary(&self.core.config) else {
            return;
        };
        let Some(args) = start_command_runner_args(&instance.runtype, &instance.args) else {
            return;
        };
        let spec = RunnerSpec {
            provider: "vast",
            source: "the instance's start command",
            binary,
            command: (args, instance.env.clone()),
        };
        let boot = runner::boot_delay(&self.core.config);
        let id = instance.id.to_string();
        self.runners.schedule(self.me.clone(), id, spec, boot);
    }

    /// Rents `ask_id`; `force_low_bid` treats any bid as too low.
    pub fn rent(&self, ask_id: u64, request: &CreateRequest, force_low_bid: bool) -> Rental {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        if let Some(quota) = self.core.config.quota
            && inner.instances.len() >= quota as usize
        {
            return Rental::QuotaExceeded;
        }
        let mut market = self.core.market.lock();
        let Some(offer) = market.get(ask_id).cloned() else {
            return Rental::NoSuchAsk;
        };
        if !market.reserve(ask_id, 1) {
            return Rental::NoSuchAsk;
        }
        drop(market);
        let min_bid = offer.min_bid().unwrap_or(offer.config.price_per_hour);
        let low = request
            .price
            .is_some_and(|bid| force_low_bid || bid < min_bid);
        let id = self.insert(&mut inner, offer, request, low);
        if low {
            Rental::BidTooLow { id, min_bid }
        } else {
            Rental::Created(id)
        }
    }

    fn insert(
        &self,
        inner: &mut Inner,
        offer: Offer,
        request: &CreateRequest,
        stopped: bool,
    ) -> u64 {
        inner.next_id += 1;
        let id = inner.next_id;
        let price = request.price.unwrap_or(offer.config.price_per_hour);
        let mut ledger = self.core.ledger.lock();
        let spot = request.price.is_some();
        ledger.open(
            &id.to_string(),
            &request.label,
            offer.id,
            price,
            spot,
            !stopped,
        );
        drop(ledger);
        let pull_error = image_pull_error(&self.core.config.private_registries, request);
        let now = self.core.clock.now();
        let instance = Instance::new(id, offer, request, now, stopped, pull_error);
        if !stopped && !instance.failed {
            self.start_runner(&instance);
        }
        inner.instances.insert(id, instance);
        id
    }

    /// Adds `count` running on-demand instances labelled `{prefix}{n}` without touching the
    /// market (for benchmarks and pagination tests).
    pub fn seed(&self, count: usize, prefix: &str) -> Vec<u64> {
        let offer = self.core.market.lock().offers().first().cloned();
        let Some(offer) = offer else {
            return Vec::new();
        };
        let mut inner = self.inner.lock();
        (0..count)
            .map(|n| {
                let request = CreateRequest {
                    label: format!("{prefix}{n}"),
                    ..Default::default()
                };
                self.insert(&mut inner, offer.clone(), &request, false)
            })
            .collect()
    }

    /// The instance's JSON, or `None` if it does not exist (or was destroyed).
    pub fn get(&self, id: u64) -> Option<Value> {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        inner
            .instances
            .get(&id)
            .map(|instance| self.render(instance))
    }

    /// Destroys an instance; false if it does not exist.
    pub fn destroy(&self, id: u64) -> bool {
        let mut inner = self.inner.lock();
        let Some(instance) = inner.instances.remove(&id) else {
            return false;
        };
        self.core.market.lock().release(instance.offer.id, 1);
        self.core.ledger.lock().close(&id.to_string());
        self.runners.kill(&id.to_string());
        true
    }

    /// Stops an instance now (preemption by a higher bid, or outbid); false if unknown or
    /// already stopped.
    pub fn stop(&self, id: u64) -> bool {
        let mut inner = self.inner.lock();
        let now = self.core.clock.now();
        match inner.instances.get_mut(&id) {
            Some(instance) if instance.stopped.is_none() => {
                instance.stopped = Some(now);
                self.core.ledger.lock().pause(&id.to_string(), now);
                self.runners.kill(&id.to_string());
                true
            }
            _ => false,
        }
    }

    /// Starts a stopped instance; false if unknown, or if its bid is below the minimum.
    pub fn start(&self, id: u64) -> bool {
        let mut inner = self.inner.lock();
        let now = self.core.clock.now();
        let Some(instance) = inner.instances.get_mut(&id) else {
            return false;
        };
        let min_bid = instance.offer.min_bid().unwrap_or(0.0);
        if instance.bid.is_some_and(|bid| bid < min_bid) {
            return false;
        }
        if instance.stopped.take().is_some() {
            instance.started = now;
            self.core.ledger.lock().resume(&id.to_string());
            self.start_runner(instance);
        }
        true
    }

    /// Marks an instance as failed (`exited`: the runner is killed); false if unknown.
    pub fn fail(&self, id: u64) -> bool {
        let mut inner = self.inner.lock();
        let failed = inner
            .instances
            .get_mut(&id)
            .map(|i| i.failed = true)
            .is_some();
        if failed {
            self.runners.kill(&id.to_string());
        }
        failed
    }

    /// Changes an instance's label or bid; false if it does not exist.
    pub fn update(&self, id: u64, label: Option<String>, bid: Option<f64>) -> bool {
        let mut inner = self.inner.lock();
        let Some(instance) = inner.instances.get_mut(&id) else {
            return false;
        };
        if let Some(label) = label {
            instance.label = label;
        }
        if bid.is_some() {
            instance.bid = bid;
        }
        true
    }

    /// One page of instances matching `filters`, ordered by id, after the keyset token. Only
    /// the page's instances are rendered when there are no filters.
    pub fn page(
        &self,
        filters: &[Condition],
        after: Option<u64>,
        limit: usize,
        desc: bool,
    ) -> Page {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        let total = inner.instances.len();
        let mut matching: Vec<&Instance> = inner
            .instances
            .values()
            .filter(|i| filters.is_empty() || query::matches(&self.render(i), filters))
            .collect();
        if desc {
            matching.reverse();
        }
        let label_counts = count_labels(&matching);
        let found = matching.len();
        let beyond = |i: &&Instance| {
            after.is_none_or(|token| if desc { i.id < token } else { i.id > token })
        };
        let rest: Vec<&Instance> = matching.into_iter().filter(beyond).collect();
        let next_after = (rest.len() > limit).then(|| rest[limit - 1].id);
        let instances = rest.iter().take(limit).map(|i| self.render(i)).collect();
        Page {
            instances,
            found,
            total,
            next_after,
            label_counts,
        }
    }

    /// Applies `preempt_spot_after_ms`: spot instances stop that long after they start running.
    fn refresh(&self, inner: &mut Inner) {
        let Some(after) = self.core.config.preempt_spot_after_ms else {
            return;
        };
        let timing = self.core.config.timing;
        let boot = SimClock::ms(timing.provisioning_ms + timing.starting_ms + after);
        let now = self.core.clock.now();
        for instance in inner.instances.values_mut() {
            let due = instance.started + boot;
            if instance.bid.is_some() && instance.stopped.is_none() && now >= due {
                instance.stopped = Some(due);
                self.core.ledger.lock().pause(&instance.id.to_string(), due);
                self.runners.kill(&instance.id.to_string());
            }
        }
    }

    fn render(&self, instance: &Instance) -> Value {
        super::render::instance(instance, &self.core, self.core.clock.now())
    }
}

impl RunnerHost for VastState {
    fn runners(&self) -> &Runners {
        &self.runners
    }

    fn phase(&self, id: &str) -> Phase {
        let Ok(id) = id.parse::<u64>() else {
            return Phase::Gone;
        };
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        let now = self.core.clock.now();
        inner
            .instances
            .get(&id)
            .map_or(Phase::Gone, |i| i.phase(&self.core, now))
    }
}

fn count_labels(instances: &[&Instance]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for instance in instances {
        *counts.entry(instance.label.clone()).or_default() += 1;
    }
    counts
}

/// Encodes a keyset position as an opaque token.
pub(crate) fn token(after: u64) -> String {
    format!("nt{after:x}")
}

/// Decodes a token; `None` if it is not one of ours.
pub(crate) fn parse_token(token: &str) -> Option<u64> {
    u64::from_str_radix(token.strip_prefix("nt")?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn only_an_args_runtype_start_command_runs_the_runner() {
        let script = "set -eu\nwget -qO /opt/nc/neocloud-runner https://n:1/r\n\
                      sha256sum -c /opt/nc/sum\nexec /opt/nc/neocloud-runner --callback-url \
                      'https://node:8443' --name 'a b'\n";
        let args = words(&["sh", "-c", script]);
        assert_eq!(
            start_command_runner_args("args", &args),
            Some(words(&[
                "--callback-url",
                "https://node:8443",
                "--name",
                "a b"
            ]))
        );
        assert_eq!(start_command_runner_args("ssh", &args), None);
        assert_eq!(
            start_command_runner_args("args", &words(&["python", "train.py"])),
            None
        );
        assert_eq!(start_command_runner_args("args", &[]), None);
    }

    #[test]
    fn port_keys_of_the_env_are_not_the_runner_environment() {
        let env = serde_json::json!({"NEOCLOUD_BOOTSTRAP_TOKEN": "t", "-p 8443:8443": "1"});
        assert_eq!(
            super::super::handlers::parse_env(Some(&env)),
            vec![("NEOCLOUD_BOOTSTRAP_TOKEN".to_owned(), "t".to_owned())]
        );
    }
}
