//! What the node knows of a binding's runner, kept here once: the state it last reported (or
//! told with a heartbeat), whether it exited or was declared lost, its restarts in place, what
//! its probes said and the failed checks not yet published, and when its boot timeout started.
//! The callback server writes it as the runner calls; the reconciler reads it through
//! [`CallbackHandle`](super::CallbackHandle) (`runner_status`, `in_place`, `probes`,
//! `take_unhealthy`) and takes the server's [`RunnerEvent`](super::RunnerEvent)s as triggers
//! only.
//!
//! Not what a status means for the Pod (the reconciler's `mirror` decides that), nor the
//! binding's rental and workload (the entry around this, in `state`).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use neocloud_protocol::ProbeStatus;

use super::{RunnerState, StatusReport, Termination};

/// What the node knows of a binding's runner, as the reconciler reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerStatus {
    /// Registered; the runner has not reported yet (the VM is booting).
    Booting,
    /// The runner has the workload and is starting it.
    Starting,
    /// The workload runs.
    Running,
    /// The workload ended with this code, and the node applies the restart policy (an older
    /// runner, which does not restart in place).
    Exited(i32),
    /// The workload ended with this code for good: the runner applied the restart policy
    /// itself and does not run it again.
    Finished(i32),
    /// The workload ended and the runner restarts it in place after a back-off
    /// ([`InPlace`] says how it ended and how long the wait is).
    BackOff,
    /// The runner authenticated, then stopped sending heartbeats.
    Lost,
    /// The runner never called back within the boot timeout (its bootstrap token expired).
    NeverCalled,
}

/// A runner's restarts of the workload on its machine, as it last reported them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InPlace {
    /// How many times it restarted the workload.
    pub restart_count: u32,
    /// When the current run started.
    pub started_at: Option<DateTime<Utc>>,
    /// How the last run that ended did.
    pub last: Option<Termination>,
    /// The wait before the next restart, while backing off.
    pub backoff_seconds: Option<u64>,
}

/// How many failed checks wait for their `Unhealthy` event at most: the events go out at the
/// next reconcile, which the report that carried them triggers.
const UNHEALTHY_KEPT: usize = 16;

/// The runner of one rental of a binding.
#[derive(Debug, Default)]
pub(crate) struct Runner {
    /// What it last said it is doing (by report, or with a heartbeat).
    pub state: Option<RunnerState>,
    /// It authenticated and then went silent past the heartbeat timeout.
    pub lost: bool,
    /// It reported its workload ended for good on this machine.
    pub exited: bool,
    /// How the `Exited` report ended: its code, and whether the runner had applied the restart
    /// policy itself.
    ended: Option<(i32, bool)>,
    in_place: InPlace,
    probes: Option<ProbeStatus>,
    unhealthy: Vec<String>,
    /// When its boot timeout started: the node's first ask once the instance existed, or its
    /// adoption.
    launched: Option<Instant>,
}

impl Runner {
    /// The runner of a binding adopted after a restart: `state` as the Pod showed it (`Some`
    /// when it was running), `probes` as its container showed them. Its boot timeout starts now.
    pub fn adopted(state: Option<RunnerState>, probes: Option<ProbeStatus>) -> Self {
        Self {
            state,
            probes,
            launched: Some(Instant::now()),
            ..Self::default()
        }
    }

    /// Whether `report` says nothing new: the state and restart count already known, and no
    /// word of the probes (what they say is news each time, since a failure is an event). A
    /// runner retries a report whose answer it lost, as across a leader change.
    pub fn repeats(&self, report: &StatusReport) -> bool {
        self.state == Some(report.state)
            && self.in_place.restart_count == report.restart_count
            && report.probes.is_none()
    }

    /// Takes in a report (or the state a heartbeat told, as a report without news of restarts).
    pub fn record(&mut self, report: &StatusReport) {
        self.state = Some(report.state);
        if report.state == RunnerState::Exited {
            self.exited = true;
            self.ended = Some((report.exit_code.unwrap_or(1), report.restarts_in_place));
        }
        // A heartbeat's news (no restart count, no ended run) keeps what the reports said.
        if report.restart_count > 0 || report.last_termination.is_some() {
            self.in_place = InPlace {
                restart_count: report.restart_count,
                started_at: report.started_at,
                last: report.last_termination.clone(),
                backoff_seconds: report.backoff_seconds,
            };
        } else if report.state == RunnerState::Running {
            self.in_place.backoff_seconds = None;
        }
        self.record_probes(report);
    }

    /// Keeps what a report says of the probes (a runner that runs them says so with each report
    /// of a run, a new run included); a run's end clears them, and a failed check waits for its
    /// event.
    fn record_probes(&mut self, report: &StatusReport) {
        match &report.probes {
            Some(said) => {
                let mut said = said.clone();
                if let Some(failure) = said.failure.take()
                    && self.unhealthy.len() < UNHEALTHY_KEPT
                {
                    self.unhealthy.push(failure.note());
                }
                self.probes = Some(said);
            }
            None if report.state == RunnerState::Running => {}
            None => self.probes = None,
        }
    }

    /// What the node makes of it; the first ask starts the boot timeout (asked once the
    /// instance exists), and a runner still silent `boot_timeout` after that never called.
    pub fn status(&mut self, boot_timeout: Duration) -> RunnerStatus {
        let launched = *self.launched.get_or_insert_with(Instant::now);
        if self.lost {
            return RunnerStatus::Lost;
        }
        match (self.state, self.ended) {
            (Some(RunnerState::Exited), Some((code, true))) => RunnerStatus::Finished(code),
            (Some(RunnerState::Exited), Some((code, false))) => RunnerStatus::Exited(code),
            (Some(RunnerState::Exited), None) => RunnerStatus::Exited(1),
            (Some(RunnerState::Starting), _) => RunnerStatus::Starting,
            (Some(RunnerState::Running), _) => RunnerStatus::Running,
            (Some(RunnerState::BackOff), _) => RunnerStatus::BackOff,
            (None, _) if launched.elapsed() > boot_timeout => RunnerStatus::NeverCalled,
            (None, _) => RunnerStatus::Booting,
        }
    }

    /// What it last said of its restarts in place.
    pub fn in_place(&self) -> InPlace {
        self.in_place.clone()
    }

    /// What its probes last said.
    pub fn probes(&self) -> Option<ProbeStatus> {
        self.probes.clone()
    }

    /// The notes of the failed checks since the last call.
    pub fn take_unhealthy(&mut self) -> Vec<String> {
        std::mem::take(&mut self.unhealthy)
    }
}

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;
