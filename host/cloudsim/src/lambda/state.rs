//! Lambda Cloud instances and SSH keys: launch against the market, `booting` → `active` after the
//! configured delays, `terminating` → gone, `preempted`, restart, rename, and the launch rate
//! limiter.
//!
//! Not HTTP: handlers validate requests and render results.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::runner::runner_command;
use super::wire::{LaunchRequest, Tag};
use crate::clock::SimClock;
use crate::market::Offer;
use crate::runner::{self, Phase, RunnerHost, RunnerSpec, Runners};
use crate::server::Core;

/// One instance.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    pub id: String,
    pub name: Option<String>,
    pub offer: Offer,
    pub ssh_key_names: Vec<String>,
    pub file_system_names: Vec<String>,
    pub hostname: Option<String>,
    pub tags: Vec<Tag>,
    pub started: Instant,
    pub terminated: Option<Instant>,
    pub preempted: bool,
    pub unhealthy: bool,
}

impl Instance {
    /// The documented status at `now`.
    pub fn status(&self, core: &Core, now: Instant) -> &'static str {
        let t = core.config.timing;
        if let Some(at) = self.terminated {
            let done = now >= at + SimClock::ms(t.terminating_ms);
            return if done { "terminated" } else { "terminating" };
        }
        if self.preempted {
            return "preempted";
        }
        if self.unhealthy {
            return "unhealthy";
        }
        let boot = SimClock::ms(t.provisioning_ms + t.starting_ms);
        if now < self.started + boot {
            "booting"
        } else {
            "active"
        }
    }
}

/// An SSH key.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct SshKey {
    pub id: String,
    pub name: String,
    pub public_key: String,
}

/// Why a launch failed.
#[derive(Debug, PartialEq)]
pub(crate) enum LaunchError {
    UnknownType,
    UnknownRegion,
    NoCapacity,
    QuotaExceeded,
}

#[derive(Debug, Default)]
struct Inner {
    instances: BTreeMap<String, Instance>,
    keys: Vec<SshKey>,
    launches: VecDeque<Instant>,
    refused_launches: u64,
}

/// The Lambda simulator's state.
#[derive(Debug)]
pub(crate) struct LambdaState {
    pub core: Arc<Core>,
    inner: Mutex<Inner>,
    pub runners: Runners,
}

impl LambdaState {
    pub fn new(core: Arc<Core>) -> Self {
        let keys = core
            .config
            .ssh_key_names
            .iter()
            .map(|name| new_key(name, ""))
            .collect();
        let inner = Inner {
            keys,
            ..Inner::default()
        };
        Self {
            core,
            inner: Mutex::new(inner),
            runners: Runners::default(),
        }
    }

    /// With `run_user_data`, schedules the runner of each launched instance for when it is
    /// active.
    pub fn start_runners(self: &Arc<Self>, ids: &[String], request: &LaunchRequest) {
        let config = &self.core.config;
        let Some(binary) = runner::configured_binary(config) else {
            return;
        };
        let Some(command) = request.user_data.as_deref().and_then(runner_command) else {
            return;
        };
        let spec = RunnerSpec {
            provider: "lambda",
            source: "user_data",
            binary,
            command,
        };
        let boot = runner::boot_delay(config);
        for id in ids {
            let state = Arc::downgrade(self);
            self.runners.schedule(state, id.clone(), spec.clone(), boot);
        }
    }

    /// The instance's status (`booting`, `active`, ...), if it exists.
    pub fn status_of(&self, id: &str) -> Option<&'static str> {
        let now = self.core.clock.now();
        self.get(id).map(|i| i.status(&self.core, now))
    }

    /// How many launches the rate limit refused (answered 429) so far.
    pub fn refused_launches(&self) -> u64 {
        self.inner.lock().refused_launches
    }

    /// Counts a launch request against the rate limit; `Err` is the seconds to wait.
    pub fn admit_launch(&self) -> Result<(), u64> {
        let limit = self.core.config.launch_rate_limit;
        if limit.window_ms == 0 {
            return Ok(());
        }
        let window = SimClock::ms(limit.window_ms);
        let now = self.core.clock.now();
        let mut inner = self.inner.lock();
        while inner.launches.front().is_some_and(|at| *at + window <= now) {
            inner.launches.pop_front();
        }
        if inner.launches.len() >= limit.max_requests as usize {
            let oldest = inner.launches.front().copied().unwrap_or(now);
            let wait = (oldest + window).saturating_duration_since(now);
            inner.refused_launches += 1;
            return Err(wait.as_secs_f64().ceil().max(1.0) as u64);
        }
        inner.launches.push_back(now);
        Ok(())
    }

    /// Whether an SSH key with this name exists.
    pub fn has_key(&self, name: &str) -> bool {
        self.inner.lock().keys.iter().any(|key| key.name == name)
    }

    /// Launches `quantity` instances; all or none.
    pub fn launch(
        &self,
        request: &LaunchRequest,
        quantity: u32,
    ) -> Result<Vec<String>, LaunchError> {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        let offer = self.reserve(request, quantity)?;
        let live = inner
            .instances
            .values()
            .filter(|i| i.terminated.is_none())
            .count();
        if self
            .core
            .config
            .quota
            .is_some_and(|q| live + quantity as usize > q as usize)
        {
            self.core.market.lock().release(offer.id, quantity);
            return Err(LaunchError::QuotaExceeded);
        }
        Ok((0..quantity)
            .map(|_| self.insert(&mut inner, &offer, request))
            .collect())
    }

    fn reserve(&self, request: &LaunchRequest, quantity: u32) -> Result<Offer, LaunchError> {
        let mut market = self.core.market.lock();
        let offers = market.offers();
        if !offers
            .iter()
            .any(|o| o.config.gpu == request.instance_type_name)
        {
            return Err(LaunchError::UnknownType);
        }
        if !offers
            .iter()
            .any(|o| o.config.region == request.region_name)
        {
            return Err(LaunchError::UnknownRegion);
        }
        let offer = offers
            .iter()
            .find(|o| {
                o.config.gpu == request.instance_type_name && o.config.region == request.region_name
            })
            .cloned()
            .ok_or(LaunchError::NoCapacity)?;
        if !market.reserve(offer.id, quantity) {
            return Err(LaunchError::NoCapacity);
        }
        Ok(offer)
    }

    fn insert(&self, inner: &mut Inner, offer: &Offer, request: &LaunchRequest) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = request.name.clone().unwrap_or_default();
        let price = offer.config.price_per_hour;
        self.core
            .ledger
            .lock()
            .open(&id, &name, offer.id, price, false, true);
        let instance = Instance {
            id: id.clone(),
            name: request.name.clone(),
            offer: offer.clone(),
            ssh_key_names: request.ssh_key_names.clone(),
            file_system_names: request.file_system_names.clone(),
            hostname: request.hostname.clone(),
            tags: request.tags.clone(),
            started: self.core.clock.now(),
            terminated: None,
            preempted: false,
            unhealthy: false,
        };
        inner.instances.insert(id.clone(), instance);
        id
    }

    /// A visible (not yet terminated) instance.
    pub fn get(&self, id: &str) -> Option<Instance> {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        inner.instances.get(id).cloned()
    }

    /// Every visible instance, oldest first.
    pub fn list(&self) -> Vec<Instance> {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        let mut all: Vec<Instance> = inner.instances.values().cloned().collect();
        all.sort_by_key(|i| i.started);
        all
    }

    /// Terminates every id, or none if one is unknown (`Err` names it).
    pub fn terminate(&self, ids: &[String]) -> Result<Vec<Instance>, String> {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        if let Some(missing) = ids.iter().find(|id| !inner.instances.contains_key(*id)) {
            return Err(missing.clone());
        }
        let now = self.core.clock.now();
        let mut done = Vec::new();
        for id in ids {
            let Some(instance) = inner.instances.get_mut(id) else {
                continue;
            };
            if instance.terminated.is_none() {
                instance.terminated = Some(now);
                self.core.market.lock().release(instance.offer.id, 1);
                self.core.ledger.lock().close(id);
            }
            done.push(instance.clone());
        }
        drop(inner);
        ids.iter().for_each(|id| self.runners.kill(id));
        Ok(done)
    }

    /// Reboots every id (back to `booting`), or none if one is unknown.
    pub fn restart(&self, ids: &[String]) -> Result<Vec<Instance>, String> {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        let unknown = ids.iter().find(|id| {
            inner
                .instances
                .get(*id)
                .is_none_or(|i| i.terminated.is_some())
        });
        if let Some(missing) = unknown {
            return Err(missing.clone());
        }
        let now = self.core.clock.now();
        let mut done = Vec::new();
        for id in ids {
            let Some(instance) = inner.instances.get_mut(id) else {
                continue;
            };
            instance.started = now;
            if std::mem::take(&mut instance.preempted) {
                self.core.ledger.lock().resume(id);
            }
            done.push(instance.clone());
        }
        drop(inner);
        ids.iter().for_each(|id| self.runners.kill(id));
        Ok(done)
    }

    /// Renames an instance.
    pub fn rename(&self, id: &str, name: &str) -> Option<Instance> {
        let mut inner = self.inner.lock();
        self.refresh(&mut inner);
        let instance = inner.instances.get_mut(id)?;
        instance.name = Some(name.to_string());
        Some(instance.clone())
    }

    /// Marks an instance preempted and stops billing it.
    pub fn preempt(&self, id: &str) -> bool {
        let mut inner = self.inner.lock();
        let now = self.core.clock.now();
        let preempted = match inner.instances.get_mut(id) {
            Some(instance) if instance.terminated.is_none() && !instance.preempted => {
                instance.preempted = true;
                self.core.ledger.lock().pause(id, now);
                true
            }
            _ => false,
        };
        drop(inner);
        if preempted {
            self.runners.kill(id);
        }
        preempted
    }

    /// Marks an instance unhealthy; false if unknown or terminated.
    pub fn fail(&self, id: &str) -> bool {
        let mut inner = self.inner.lock();
        let instance = inner
            .instances
            .get_mut(id)
            .filter(|i| i.terminated.is_none());
        instance.map(|i| i.unhealthy = true).is_some()
    }

    /// Registered SSH keys.
    pub fn keys(&self) -> Vec<SshKey> {
        self.inner.lock().keys.clone()
    }

    /// Registers a key; `None` if the name is taken.
    pub fn add_key(&self, name: &str, public_key: &str) -> Option<SshKey> {
        let mut inner = self.inner.lock();
        if inner.keys.iter().any(|key| key.name == name) {
            return None;
        }
        let key = new_key(name, public_key);
        inner.keys.push(key.clone());
        Some(key)
    }

    /// Deletes a key by id.
    pub fn delete_key(&self, id: &str) -> bool {
        let mut inner = self.inner.lock();
        let before = inner.keys.len();
        inner.keys.retain(|key| key.id != id);
        inner.keys.len() != before
    }

    /// Drops instances whose termination has completed.
    fn refresh(&self, inner: &mut Inner) {
        let now = self.core.clock.now();
        inner
            .instances
            .retain(|_, i| i.status(&self.core, now) != "terminated");
    }
}

impl RunnerHost for LambdaState {
    fn runners(&self) -> &Runners {
        &self.runners
    }

    fn phase(&self, id: &str) -> Phase {
        match self.status_of(id) {
            Some("active") => Phase::Running,
            Some("booting") => Phase::Booting,
            _ => Phase::Gone,
        }
    }
}

fn new_key(name: &str, public_key: &str) -> SshKey {
    let public_key = if public_key.is_empty() {
        format!("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{name} sim")
    } else {
        public_key.to_string()
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    SshKey {
        id,
        name: name.to_string(),
        public_key,
    }
}
