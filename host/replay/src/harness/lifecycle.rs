//! A job's lifecycle in the replay, as the node's reconciler goes through it for a Pod: placed
//! (plan and rent), polled until its instance runs, a reclaim recorded as a preemption and the
//! job placed again once the provider confirms the instance gone, and retired when its work is
//! done.
//!
//! Not the order in which jobs are served (the event loop, `replay`).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use neocloud_broker::{Broker, BrokerError, Placement, Renter};
use neocloud_core::{
    Attempt, AttemptOutcome, FailureClass, InstancePhase, InstanceState, ProviderId,
};

use super::replay::{Phase, Rented, Replay, Wake, is_gone};
use super::{NAME_PREFIX, Recorder};

impl Replay<'_> {
    pub(super) async fn place(&mut self, index: usize) {
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

    pub(super) async fn poll(&mut self) {
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
    pub(super) async fn stopped(&mut self, index: usize, class: FailureClass, message: &str) {
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
    pub(super) async fn retire(&mut self, index: usize, place: bool) {
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

    pub(super) fn retired(&mut self, index: usize) {
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

    pub(super) async fn finish(&mut self, index: usize, generation: u32) {
        let state = &mut self.states[index];
        if state.generation != generation || state.phase != Phase::Running {
            return;
        }
        state.outcome.completed = true;
        self.retire(index, false).await;
    }
}

/// The attempts a job carries into its next plan: every preemption and loss (policies count
/// them), and the last 32 others.
pub(super) fn trim(attempts: Vec<Attempt>) -> Vec<Attempt> {
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
