//! The probes of one run of the workload as a kubelet runs them: when each is due
//! (`initialDelaySeconds` from the container's start, then every `periodSeconds`), what a run
//! of results means (`successThreshold` and `failureThreshold` in a row), the startup probe
//! gating the other two, and what follows: the container's `started` and `ready`, a failed
//! check to report as an `Unhealthy` event, and a liveness (or startup) probe that gave up, so
//! the runner restarts the workload. A pure state machine over the time since the run
//! started: the caller runs the checks (`probe_check`) and does the waiting.
//!
//! Not the checks themselves, and not the decision whether a killed run runs again (the Pod's
//! restart policy, in the runner's loop).

use std::time::Duration;

use neocloud_protocol::{Probe, ProbeFailure, ProbeKind, ProbeStatus, Probes};

/// One probe's counters.
#[derive(Debug, Clone)]
struct One {
    kind: ProbeKind,
    probe: Probe,
    /// When the next check is due, from the run's start.
    due: Duration,
    /// The probe's current result.
    passing: bool,
    successes: u32,
    failures: u32,
}

impl One {
    fn new(kind: ProbeKind, probe: &Probe) -> Self {
        Self {
            kind,
            probe: probe.clone(),
            due: Duration::from_secs(probe.initial_delay_seconds.into()),
            passing: false,
            successes: 0,
            failures: 0,
        }
    }

    /// Counts a result; `true` when the probe's result changed.
    fn record(&mut self, at: Duration, ok: bool) -> bool {
        self.due = at + Duration::from_secs(self.probe.period_seconds.max(1).into());
        let before = self.passing;
        if ok {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= self.probe.success_threshold.max(1) {
                self.passing = true;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= self.probe.failure_threshold.max(1) {
                self.passing = false;
            }
        }
        before != self.passing
    }

    /// Whether the probe has given up: `failureThreshold` failures in a row.
    fn gave_up(&self) -> bool {
        self.failures >= self.probe.failure_threshold.max(1)
    }
}

/// What a result led to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The check failed: report it (an `Unhealthy` event).
    pub failure: Option<ProbeFailure>,
    /// `started` or `ready` changed: report the new [`Prober::status`].
    pub changed: bool,
    /// The liveness or startup probe gave up: stop the workload, with this message (kubelet's
    /// `Container <name> failed liveness probe, will be restarted`).
    pub restart: Option<String>,
}

/// The probes of one run.
#[derive(Debug, Clone)]
pub struct Prober {
    startup: Option<One>,
    readiness: Option<One>,
    liveness: Option<One>,
    started: bool,
}

impl Prober {
    /// The probes of a run that just started: not started while a startup probe is to pass,
    /// not ready while a readiness probe is to pass.
    pub fn new(probes: &Probes) -> Self {
        let one = |kind, p: &Option<Probe>| p.as_ref().map(|p| One::new(kind, p));
        Self {
            startup: one(ProbeKind::Startup, &probes.startup),
            readiness: one(ProbeKind::Readiness, &probes.readiness),
            liveness: one(ProbeKind::Liveness, &probes.liveness),
            started: probes.startup.is_none(),
        }
    }

    /// The container's `started` and `ready` (ready once started when it has no readiness
    /// probe).
    pub fn status(&self) -> ProbeStatus {
        let ready = self.started && self.readiness.as_ref().is_none_or(|r| r.passing);
        ProbeStatus {
            ready,
            started: self.started,
            failure: None,
        }
    }

    /// The probes that run now: the startup probe until it passes, then the other two.
    fn active(&self) -> impl Iterator<Item = &One> {
        let (startup, gated) = if self.started {
            (None, [self.readiness.as_ref(), self.liveness.as_ref()])
        } else {
            (self.startup.as_ref(), [None, None])
        };
        startup.into_iter().chain(gated.into_iter().flatten())
    }

    /// The probes due at `now` (time since the run started).
    pub fn due(&self, now: Duration) -> Vec<ProbeKind> {
        self.active()
            .filter(|o| o.due <= now)
            .map(|o| o.kind)
            .collect()
    }

    /// When the next probe is due; `None` when none will be (no probes).
    pub fn next_due(&self) -> Option<Duration> {
        self.active().map(|o| o.due).min()
    }

    /// The probe `kind`, for its check.
    pub fn probe(&self, kind: ProbeKind) -> Option<&Probe> {
        self.slot(kind).as_ref().map(|o| &o.probe)
    }

    fn slot(&self, kind: ProbeKind) -> &Option<One> {
        match kind {
            ProbeKind::Startup => &self.startup,
            ProbeKind::Readiness => &self.readiness,
            ProbeKind::Liveness => &self.liveness,
        }
    }

    fn slot_mut(&mut self, kind: ProbeKind) -> &mut Option<One> {
        match kind {
            ProbeKind::Startup => &mut self.startup,
            ProbeKind::Readiness => &mut self.readiness,
            ProbeKind::Liveness => &mut self.liveness,
        }
    }

    /// Counts the result of `kind`'s check at `now`: `Err` carries why it failed.
    pub fn record(
        &mut self,
        kind: ProbeKind,
        now: Duration,
        result: Result<(), String>,
    ) -> Outcome {
        let before = self.status();
        let ok = result.is_ok();
        let Some(one) = self.slot_mut(kind).as_mut() else {
            return Outcome::default();
        };
        one.record(now, ok);
        let gave_up = !ok && one.gave_up();
        if kind == ProbeKind::Startup && one.passing {
            self.started = true;
            // The other probes count from now, their initial delay included.
            for other in [&mut self.readiness, &mut self.liveness]
                .into_iter()
                .flatten()
            {
                other.due = now + Duration::from_secs(other.probe.initial_delay_seconds.into());
            }
        }
        let restart = (gave_up && kind != ProbeKind::Readiness).then(|| {
            format!(
                "failed {} probe, will be restarted",
                kind.as_str().to_lowercase()
            )
        });
        Outcome {
            failure: result.err().map(|message| ProbeFailure {
                probe: kind,
                message,
            }),
            changed: self.status() != before,
            restart,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neocloud_protocol::ProbeAction;

    fn probe(delay: u32, period: u32, success: u32, failure: u32) -> Probe {
        Probe {
            initial_delay_seconds: delay,
            period_seconds: period,
            success_threshold: success,
            failure_threshold: failure,
            ..Probe::new(ProbeAction::TcpSocket {
                host: String::new(),
                port: 1,
            })
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn failed() -> Result<(), String> {
        Err("HTTP probe failed with statuscode: 503".into())
    }

    #[test]
    fn without_probes_the_container_is_started_and_ready_at_once() {
        let prober = Prober::new(&Probes::default());
        let status = prober.status();
        assert!(status.started && status.ready);
        assert_eq!(prober.next_due(), None);
    }

    #[test]
    fn readiness_starts_false_waits_its_initial_delay_and_follows_the_thresholds() {
        let probes = Probes {
            readiness: Some(probe(5, 10, 2, 3)),
            ..Probes::default()
        };
        let mut prober = Prober::new(&probes);
        assert!(prober.status().started && !prober.status().ready);
        assert!(prober.due(secs(4)).is_empty(), "not before its delay");
        assert_eq!(prober.due(secs(5)), [ProbeKind::Readiness]);
        let first = prober.record(ProbeKind::Readiness, secs(5), Ok(()));
        assert!(
            !first.changed && !prober.status().ready,
            "two successes needed"
        );
        assert!(prober.due(secs(14)).is_empty());
        assert_eq!(prober.next_due(), Some(secs(15)));
        assert!(
            prober
                .record(ProbeKind::Readiness, secs(15), Ok(()))
                .changed
        );
        assert!(prober.status().ready);
        for at in [25, 35] {
            let outcome = prober.record(ProbeKind::Readiness, secs(at), failed());
            assert!(outcome.failure.is_some() && !outcome.changed && outcome.restart.is_none());
        }
        let third = prober.record(ProbeKind::Readiness, secs(45), failed());
        assert!(
            third.changed && !prober.status().ready,
            "the third failure unreadies it"
        );
        assert_eq!(third.restart, None, "readiness never restarts");
        assert_eq!(
            third.failure.expect("failure").note(),
            "Readiness probe failed: HTTP probe failed with statuscode: 503"
        );
    }

    #[test]
    fn a_success_between_failures_starts_the_count_over() {
        let probes = Probes {
            liveness: Some(probe(0, 1, 1, 2)),
            ..Probes::default()
        };
        let mut prober = Prober::new(&probes);
        assert!(
            prober
                .record(ProbeKind::Liveness, secs(0), failed())
                .restart
                .is_none()
        );
        prober.record(ProbeKind::Liveness, secs(1), Ok(()));
        assert!(
            prober
                .record(ProbeKind::Liveness, secs(2), failed())
                .restart
                .is_none()
        );
        let gave_up = prober.record(ProbeKind::Liveness, secs(3), failed());
        assert_eq!(
            gave_up.restart.as_deref(),
            Some("failed liveness probe, will be restarted")
        );
        assert!(prober.status().ready, "liveness does not decide readiness");
    }

    #[test]
    fn the_startup_probe_gates_the_others_and_their_delay_counts_from_its_success() {
        let probes = Probes {
            startup: Some(probe(0, 2, 1, 3)),
            readiness: Some(probe(3, 10, 1, 3)),
            liveness: Some(probe(0, 10, 1, 3)),
        };
        let mut prober = Prober::new(&probes);
        assert!(!prober.status().started && !prober.status().ready);
        assert_eq!(
            prober.due(secs(100)),
            [ProbeKind::Startup],
            "only startup runs"
        );
        prober.record(ProbeKind::Startup, secs(0), failed());
        let passed = prober.record(ProbeKind::Startup, secs(2), Ok(()));
        assert!(passed.changed && prober.status().started && !prober.status().ready);
        assert_eq!(prober.due(secs(2)), [ProbeKind::Liveness]);
        assert_eq!(
            prober.due(secs(5)),
            [ProbeKind::Readiness, ProbeKind::Liveness]
        );
        assert!(prober.record(ProbeKind::Readiness, secs(5), Ok(())).changed);
        assert!(prober.status().ready);
    }

    #[test]
    fn a_startup_probe_that_never_passes_restarts_the_workload() {
        let probes = Probes {
            startup: Some(probe(0, 1, 1, 2)),
            ..Probes::default()
        };
        let mut prober = Prober::new(&probes);
        assert!(
            prober
                .record(ProbeKind::Startup, secs(0), failed())
                .restart
                .is_none()
        );
        let gave_up = prober.record(ProbeKind::Startup, secs(1), failed());
        assert_eq!(
            gave_up.restart.as_deref(),
            Some("failed startup probe, will be restarted")
        );
        assert!(!prober.status().started);
    }
}
