//! RunPod pods shared by REST v2 and GraphQL: placement on the market (GPU type, cloud, data
//! centers or country, count, spot bid), `PROVISIONING → STARTING → RUNNING` from elapsed time,
//! stop/start/restart, `EXITED` on preemption, and terminate; with `run_user_data`, the runner
//! of a pod whose start command (`args`) runs `neocloud-runner` (see `crate::runner`).
//!
//! Not HTTP: handlers validate requests and render pods.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::clock::SimClock;
use crate::market::Offer;
use crate::registries::{Login, pull_error};
use crate::runner::{self, Phase, RunnerHost, RunnerSpec, Runners};
use crate::server::Core;

/// A pod's v2 status.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Status {
    Provisioning,
    Starting,
    Running,
    Exited,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "PROVISIONING",
            Self::Starting => "STARTING",
            Self::Running => "RUNNING",
            Self::Exited => "EXITED",
            Self::Error => "ERROR",
        }
    }
}

/// Where and what to rent.
#[derive(Debug, Clone, Default)]
pub(crate) struct Placement {
    pub gpu_id: String,
    pub count: u32,
    /// `None` is any cloud (GraphQL `ALL`).
    pub cloud: Option<String>,
    pub data_centers: Vec<String>,
    pub country: Option<String>,
}

/// A pod to create.
#[derive(Clone, Default)]
pub(crate) struct NewPod {
    pub name: String,
    pub image: String,
    pub placement: Placement,
    pub disk_gb: i64,
    pub volume_gb: i64,
    pub env: BTreeMap<String, String>,
    pub ports: Vec<String>,
    pub args: Option<String>,
    pub bid_per_gpu: Option<f64>,
    /// The id of the registry credential the image is pulled with.
    pub registry: Option<String>,
}

/// `Debug` shows what identifies it only: its env carries the runner's secrets.
impl std::fmt::Debug for NewPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewPod")
            .field("name", &self.name)
            .field("image", &self.image)
            .finish_non_exhaustive()
    }
}

/// One pod.
#[derive(Debug, Clone)]
pub(crate) struct Pod {
    pub id: String,
    pub spec: NewPod,
    pub offer: Offer,
    pub created: Instant,
    pub started: Instant,
    pub exited: Option<Instant>,
    pub errored: bool,
    /// Docker's error when the image could not be pulled (the pod is `ERROR`).
    pub pull_error: Option<String>,
}

impl Pod {
    /// USD per hour while running.
    pub fn price(&self) -> f64 {
        let per_gpu = self
            .spec
            .bid_per_gpu
            .unwrap_or(self.offer.config.price_per_hour);
        per_gpu * f64::from(self.spec.placement.count)
    }

    pub fn interruptible(&self) -> bool {
        self.spec.bid_per_gpu.is_some()
    }

    pub fn status(&self, core: &Core, now: Instant) -> Status {
        if self.errored {
            return Status::Error;
        }
        if self.exited.is_some() {
            return Status::Exited;
        }
        let t = core.config.timing;
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed < SimClock::ms(t.provisioning_ms) {
            Status::Provisioning
        } else if elapsed < SimClock::ms(t.provisioning_ms + t.starting_ms) {
            Status::Starting
        } else {
            Status::Running
        }
    }
}

/// Why a create failed.
#[derive(Debug, PartialEq)]
pub(crate) enum CreateError {
    UnknownGpu,
    NoCapacity,
    BidTooLow { min_bid: f64 },
    Quota,
}

/// Why an action failed.
#[derive(Debug, PartialEq)]
pub(crate) enum ActionError {
    NotFound,
    Conflict,
}

/// The RunPod simulator's state.
#[derive(Debug)]
pub(crate) struct RunpodState {
    pub core: Arc<Core>,
    pods: Mutex<BTreeMap<String, Pod>>,
    pub ssh_keys: Mutex<Vec<String>>,
    /// Registry credentials by id (`/v2/registries`).
    pub registries: Mutex<BTreeMap<String, SavedRegistry>>,
    pub runners: Runners,
    me: Weak<Self>,
}

/// A registry credential: write-only, as at RunPod. `Debug` shows the name only.
#[derive(Clone)]
pub(crate) struct SavedRegistry {
    pub name: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for SavedRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavedRegistry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RunpodState {
    pub fn new(core: Arc<Core>) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            core,
            pods: Mutex::new(BTreeMap::new()),
            ssh_keys: Mutex::new(Vec::new()),
            registries: Mutex::new(BTreeMap::new()),
            runners: Runners::default(),
            me: me.clone(),
        })
    }

    /// With `run_user_data`, schedules the runner of the pod's start command for when the pod
    /// runs.
    fn start_runner(&self, pod: &Pod) {
        let Some(binary) = runner::configured_binary(&self.core.config) else {
            return;
        };
        let args = pod.spec.args.as_deref();
        let Some(args) = args.and_then(runner::command_line_runner_args) else {
            return;
        };
        let env = pod.spec.env.iter();
        let env = env.map(|(k, v)| (k.clone(), v.clone())).collect();
        let spec = RunnerSpec {
            provider: "runpod",
            source: "the pod's start command",
            binary,
            command: (args, env),
        };
        let boot = runner::boot_delay(&self.core.config);
        self.runners
            .schedule(self.me.clone(), pod.id.clone(), spec, boot);
    }

    /// Creates a pod; `force_low_bid` treats a spot bid as too low.
    pub fn create(&self, spec: NewPod, force_low_bid: bool) -> Result<Pod, CreateError> {
        let mut pods = self.pods.lock();
        self.refresh(&mut pods);
        if self
            .core
            .config
            .quota
            .is_some_and(|q| pods.len() >= q as usize)
        {
            return Err(CreateError::Quota);
        }
        let offer = self.place(&spec, force_low_bid)?;
        let id = uuid::Uuid::new_v4().simple().to_string()[..14].to_string();
        let now = self.core.clock.now();
        let pull_error = self.pull_error(&spec);
        let pod = Pod {
            id: id.clone(),
            spec,
            offer,
            created: now,
            started: now,
            exited: None,
            errored: pull_error.is_some(),
            pull_error,
        };
        let price = pod.price();
        let mut ledger = self.core.ledger.lock();
        ledger.open(
            &id,
            &pod.spec.name,
            pod.offer.id,
            price,
            pod.interruptible(),
            true,
        );
        drop(ledger);
        pods.insert(id, pod.clone());
        match &pod.pull_error {
            Some(error) => tracing::info!(pod = %pod.id, %error, "image pull refused"),
            None => self.start_runner(&pod),
        }
        Ok(pod)
    }

    /// Docker's error if the pod's image cannot be pulled with its registry credential (an id
    /// that names no credential is no login).
    fn pull_error(&self, spec: &NewPod) -> Option<String> {
        let saved = self.registries.lock();
        let credential = spec.registry.as_ref().and_then(|id| saved.get(id));
        let login = credential.map(|c| Login {
            username: &c.username,
            password: &c.password,
            registry: None,
        });
        pull_error(&self.core.config.private_registries, &spec.image, login)
    }

    fn place(&self, spec: &NewPod, force_low_bid: bool) -> Result<Offer, CreateError> {
        let mut market = self.core.market.lock();
        let p = &spec.placement;
        let same_gpu: Vec<&Offer> = market
            .offers()
            .iter()
            .filter(|o| o.config.gpu == p.gpu_id)
            .collect();
        if same_gpu.is_empty() {
            return Err(CreateError::UnknownGpu);
        }
        let mut fits: Vec<Offer> = same_gpu
            .into_iter()
            .filter(|o| fits(o, p))
            .cloned()
            .collect();
        fits.sort_by(|a, b| a.config.price_per_hour.total_cmp(&b.config.price_per_hour));
        if let Some(bid) = spec.bid_per_gpu {
            fits.retain(|o| o.min_bid().is_some());
            let min_bid = fits.iter().filter_map(Offer::min_bid).reduce(f64::min);
            match min_bid {
                Some(min_bid) if force_low_bid || bid < min_bid => {
                    return Err(CreateError::BidTooLow { min_bid });
                }
                _ => fits.retain(|o| o.min_bid().is_some_and(|m| m <= bid)),
            }
        }
        let offer = fits.into_iter().next().ok_or(CreateError::NoCapacity)?;
        if !market.reserve(offer.id, p.count) {
            return Err(CreateError::NoCapacity);
        }
        Ok(offer)
    }

    pub fn get(&self, id: &str) -> Option<Pod> {
        let mut pods = self.pods.lock();
        self.refresh(&mut pods);
        pods.get(id).cloned()
    }

    pub fn list(&self) -> Vec<Pod> {
        let mut pods = self.pods.lock();
        self.refresh(&mut pods);
        let mut all: Vec<Pod> = pods.values().cloned().collect();
        all.sort_by_key(|pod| pod.created);
        all
    }

    /// Terminates a pod; false if unknown.
    pub fn terminate(&self, id: &str) -> bool {
        let Some(pod) = self.pods.lock().remove(id) else {
            return false;
        };
        self.core
            .market
            .lock()
            .release(pod.offer.id, pod.spec.placement.count);
        self.core.ledger.lock().close(id);
        self.runners.kill(id);
        true
    }

    /// Stops a pod (to `EXITED`); a conflict if already exited.
    pub fn stop(&self, id: &str) -> Result<Pod, ActionError> {
        let now = self.core.clock.now();
        self.with_pod(id, |pod| {
            if pod.exited.is_some() {
                return Err(ActionError::Conflict);
            }
            pod.exited = Some(now);
            Ok(true)
        })
        .inspect(|_| self.runners.kill(id))
    }

    /// Starts an exited pod, optionally with a new bid; a conflict if not exited.
    pub fn start(&self, id: &str, bid_per_gpu: Option<f64>) -> Result<Pod, ActionError> {
        let now = self.core.clock.now();
        self.with_pod(id, |pod| {
            if pod.exited.is_none() {
                return Err(ActionError::Conflict);
            }
            let min_bid = pod.offer.min_bid().unwrap_or(0.0);
            if bid_per_gpu.is_some_and(|bid| bid < min_bid) {
                return Err(ActionError::Conflict);
            }
            if bid_per_gpu.is_some() {
                pod.spec.bid_per_gpu = bid_per_gpu;
            }
            pod.exited = None;
            pod.started = now;
            Ok(true)
        })
        .inspect(|pod| self.start_runner(pod))
    }

    /// Restarts a running pod; a conflict if exited.
    pub fn restart(&self, id: &str) -> Result<Pod, ActionError> {
        let now = self.core.clock.now();
        self.with_pod(id, |pod| {
            if pod.exited.is_some() {
                return Err(ActionError::Conflict);
            }
            pod.started = now;
            Ok(false)
        })
        .inspect(|pod| {
            self.runners.kill(id);
            self.start_runner(pod);
        })
    }

    /// Preempts a pod (to `EXITED`); false if unknown or already exited.
    pub fn preempt(&self, id: &str) -> bool {
        self.stop(id).is_ok()
    }

    /// Puts a pod in `ERROR` (its container is dead: the runner is killed); false if unknown.
    pub fn fail(&self, id: &str) -> bool {
        let failed = self
            .pods
            .lock()
            .get_mut(id)
            .map(|pod| pod.errored = true)
            .is_some();
        if failed {
            self.runners.kill(id);
        }
        failed
    }

    /// Applies `change` to a pod; `Ok(true)` toggles billing to match the new state.
    fn with_pod(
        &self,
        id: &str,
        change: impl FnOnce(&mut Pod) -> Result<bool, ActionError>,
    ) -> Result<Pod, ActionError> {
        let mut pods = self.pods.lock();
        self.refresh(&mut pods);
        let pod = pods.get_mut(id).ok_or(ActionError::NotFound)?;
        if change(pod)? {
            let mut ledger = self.core.ledger.lock();
            match pod.exited {
                Some(at) => ledger.pause(id, at),
                None => ledger.resume(id),
            }
        }
        Ok(pod.clone())
    }

    /// Applies `preempt_spot_after_ms` to interruptible pods.
    fn refresh(&self, pods: &mut BTreeMap<String, Pod>) {
        let Some(after) = self.core.config.preempt_spot_after_ms else {
            return;
        };
        let t = self.core.config.timing;
        let delay = SimClock::ms(t.provisioning_ms + t.starting_ms + after);
        let now = self.core.clock.now();
        for pod in pods
            .values_mut()
            .filter(|p| p.interruptible() && p.exited.is_none())
        {
            if now >= pod.started + delay {
                pod.exited = Some(pod.started + delay);
                self.core.ledger.lock().pause(&pod.id, pod.started + delay);
                self.runners.kill(&pod.id);
            }
        }
    }
}

impl RunnerHost for RunpodState {
    fn runners(&self) -> &Runners {
        &self.runners
    }

    fn phase(&self, id: &str) -> Phase {
        let now = self.core.clock.now();
        match self.get(id).map(|pod| pod.status(&self.core, now)) {
            Some(Status::Running) => Phase::Running,
            Some(Status::Provisioning | Status::Starting) => Phase::Booting,
            _ => Phase::Gone,
        }
    }
}

fn fits(offer: &Offer, p: &Placement) -> bool {
    let c = &offer.config;
    let cloud_ok = p
        .cloud
        .as_ref()
        .is_none_or(|cloud| c.cloud.as_deref().unwrap_or("SECURE") == cloud);
    let dc_ok = p.data_centers.is_empty() || p.data_centers.contains(&c.region);
    let country_ok = p
        .country
        .as_ref()
        .is_none_or(|cc| c.region.starts_with(&format!("{cc}-")));
    cloud_ok && dc_ok && country_ok && c.gpu_count >= p.count && offer.available >= p.count
}
