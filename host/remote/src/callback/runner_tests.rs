use std::time::Duration;

use chrono::Utc;
use neocloud_protocol::{ProbeFailure, ProbeKind, ProbeStatus};

use super::*;

const BOOT: Duration = Duration::from_secs(600);

fn report(state: RunnerState) -> StatusReport {
    StatusReport::new(state)
}

fn probed(ready: bool, failure: Option<&str>) -> ProbeStatus {
    ProbeStatus {
        ready,
        started: true,
        failure: failure.map(|m| ProbeFailure {
            probe: ProbeKind::Readiness,
            message: m.into(),
        }),
    }
}

#[test]
fn a_registered_runner_boots_until_its_boot_timeout_passes_from_the_first_ask() {
    let mut runner = Runner::default();
    assert_eq!(runner.status(BOOT), RunnerStatus::Booting);
    // The clock started at the first ask: with no time left, the runner never called.
    assert_eq!(runner.status(Duration::ZERO), RunnerStatus::NeverCalled);
    // Adoption starts the clock too, and a runner the Pod showed running is running.
    let mut adopted = Runner::adopted(Some(RunnerState::Running), None);
    assert_eq!(adopted.status(Duration::ZERO), RunnerStatus::Running);
    let mut booting = Runner::adopted(None, None);
    assert_eq!(booting.status(Duration::ZERO), RunnerStatus::NeverCalled);
}

#[test]
fn an_exit_is_finished_only_when_the_runner_applied_the_restart_policy_itself() {
    let mut old = Runner::default();
    old.record(&StatusReport {
        exit_code: Some(3),
        ..report(RunnerState::Exited)
    });
    assert_eq!(old.status(BOOT), RunnerStatus::Exited(3));
    assert!(old.exited);

    let mut new = Runner::default();
    new.record(&StatusReport {
        exit_code: None,
        restarts_in_place: true,
        ..report(RunnerState::Exited)
    });
    // No code said is a failure, as a kubelet's unknown exit.
    assert_eq!(new.status(BOOT), RunnerStatus::Finished(1));
}

#[test]
fn lost_wins_over_what_the_runner_said_last() {
    let mut runner = Runner::default();
    runner.record(&report(RunnerState::Running));
    runner.lost = true;
    assert_eq!(runner.status(BOOT), RunnerStatus::Lost);
}

#[test]
fn restarts_in_place_are_kept_across_reports_without_news_and_a_run_clears_the_back_off() {
    let mut runner = Runner::default();
    let ended = Termination::new(1, Utc::now(), Utc::now());
    runner.record(&StatusReport {
        restart_count: 2,
        last_termination: Some(ended.clone()),
        backoff_seconds: Some(20),
        ..report(RunnerState::BackOff)
    });
    assert_eq!(runner.status(BOOT), RunnerStatus::BackOff);
    let kept = runner.in_place();
    assert_eq!(
        (kept.restart_count, kept.backoff_seconds, kept.last),
        (2, Some(20), Some(ended.clone()))
    );
    // A state told with a heartbeat carries no restart count: what the reports said stays,
    // but the workload runs again, so there is no back-off.
    runner.record(&report(RunnerState::Running));
    let kept = runner.in_place();
    assert_eq!(
        (kept.restart_count, kept.backoff_seconds, kept.last),
        (2, None, Some(ended))
    );
    // The same state and count again is a repeat; a new count is not.
    assert!(runner.repeats(&StatusReport {
        restart_count: 2,
        ..report(RunnerState::Running)
    }));
    assert!(!runner.repeats(&StatusReport {
        restart_count: 3,
        ..report(RunnerState::Running)
    }));
}

#[test]
fn probes_are_kept_while_running_cleared_by_a_run_s_end_and_failures_wait_bounded() {
    let mut runner = Runner::default();
    runner.record(&StatusReport {
        probes: Some(probed(true, None)),
        ..report(RunnerState::Running)
    });
    // A report of the run that says nothing of them keeps them.
    runner.record(&report(RunnerState::Running));
    assert_eq!(runner.probes().map(|p| p.ready), Some(true));
    // Failures wait for their events, a bounded number of them, and are taken once.
    for i in 0..40 {
        runner.record(&StatusReport {
            probes: Some(probed(
                false,
                Some(&format!("HTTP probe failed with statuscode: {i}")),
            )),
            ..report(RunnerState::Running)
        });
    }
    let kept = runner.probes().expect("probes said");
    assert!(!kept.ready && kept.failure.is_none());
    let notes = runner.take_unhealthy();
    assert_eq!(notes.len(), UNHEALTHY_KEPT);
    assert_eq!(
        notes[0],
        "Readiness probe failed: HTTP probe failed with statuscode: 0"
    );
    assert!(runner.take_unhealthy().is_empty());
    // A repeat that says what the probes found is news.
    assert!(!runner.repeats(&StatusReport {
        probes: Some(probed(true, None)),
        ..report(RunnerState::Running)
    }));
    // The run's end clears them.
    runner.record(&report(RunnerState::BackOff));
    assert_eq!(runner.probes(), None);
}
