//! The replay's event loop: each job's state, the wakes queued by simulated time (arrivals,
//! market changes, fault windows, polls) and the loop that serves them in order until every
//! job is done, then what it measured from the simulators' billing ledgers.
//!
//! Not what happens to one job at each step (`lifecycle`) and not the set-up (the parent's
//! `run`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use neocloud_broker::Renter;
use neocloud_cloudsim::{CloudSim, FaultKind, FaultRule, SimHandle};
use neocloud_core::{Attempt, InstancePhase, InstanceState, ProviderId};
use neocloud_providers::Provider;
use tokio::time::{Duration, Instant};

use super::{JobOutcome, Options, Outcome, create_routes};
use crate::jobs::Job;
use crate::strategy::Compiled;
use crate::trace::{Change, Cloud, Trace};

/// A job's place in the loop.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Phase {
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
pub(super) struct Rented {
    pub(super) provider: ProviderId,
    pub(super) instance_id: String,
}

#[derive(Debug)]
pub(super) struct JobState {
    pub(super) phase: Phase,
    pub(super) history: Vec<Attempt>,
    pub(super) rental: Option<Rented>,
    pub(super) generation: u32,
    pub(super) outcome: JobOutcome,
    /// After retiring: place again (true) or stop there (false: done or given up).
    pub(super) then_place: bool,
    /// The second it last started waiting to be placed.
    pub(super) waiting_since: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Wake {
    Market(usize),
    Arrive(usize),
    Place(usize),
    Finish(usize, u32),
    Poll,
    /// The end of a window of trouble: the fault rules at this index are disarmed.
    Disarm(usize),
}

/// A running replay.
pub(super) struct Replay<'a> {
    pub(super) trace: &'a Trace,
    pub(super) jobs: &'a [Job],
    pub(super) strategy: &'a Compiled,
    pub(super) options: &'a Options,
    pub(super) sim: CloudSim,
    pub(super) renter: Renter,
    pub(super) providers: BTreeMap<ProviderId, Arc<dyn Provider>>,
    pub(super) states: Vec<JobState>,
    pub(super) wakes: BinaryHeap<Reverse<(u64, u64, Wake)>>,
    pub(super) seq: u64,
    pub(super) origin: Instant,
    pub(super) origin_utc: DateTime<Utc>,
    /// Instance id -> the second it was reclaimed.
    pub(super) reclaimed: BTreeMap<String, f64>,
    pub(super) poll_armed: bool,
    /// Fault rules armed for a window, by the index a [`Wake::Disarm`] names.
    pub(super) windows: Vec<(Cloud, Vec<u64>)>,
}

pub(super) fn is_gone(i: Option<&InstanceState>) -> bool {
    i.is_none_or(|i| i.phase == InstancePhase::Terminated)
}

impl Replay<'_> {
    pub(super) fn now_s(&self) -> f64 {
        Instant::now()
            .saturating_duration_since(self.origin)
            .as_secs_f64()
    }

    pub(super) fn at(&mut self, at_s: f64, wake: Wake) {
        self.seq += 1;
        let ms = (at_s.max(0.0) * 1000.0) as u64;
        self.wakes.push(Reverse((ms, self.seq, wake)));
    }

    pub(super) fn sim(&self, cloud: Cloud) -> &SimHandle {
        match cloud {
            Cloud::Runpod => &self.sim.runpod,
            Cloud::Lambda => &self.sim.lambda,
            Cloud::Vast => &self.sim.vast,
        }
    }

    pub(super) fn active(&self) -> bool {
        self.states
            .iter()
            .any(|s| matches!(s.phase, Phase::Booting | Phase::Running | Phase::Retiring))
    }

    pub(super) fn arm_poll(&mut self) {
        if !self.poll_armed {
            self.poll_armed = true;
            let at = self.now_s() + self.options.poll_s as f64;
            self.at(at, Wake::Poll);
        }
    }

    pub(super) async fn run(&mut self) -> anyhow::Result<Outcome> {
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

    pub(super) fn market(&mut self, index: usize) {
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

    pub(super) fn window(&mut self, cloud: Cloud, ids: Vec<u64>, until_s: f64) {
        self.windows.push((cloud, ids));
        let index = self.windows.len() - 1;
        self.at(until_s, Wake::Disarm(index));
    }

    /// After the drain: every instance still rented is deleted and confirmed gone.
    pub(super) async fn stop_everything(&mut self) {
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

    pub(super) fn outcome(&self) -> Outcome {
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
