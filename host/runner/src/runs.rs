//! The runs of one workload on this machine: each run started with its executor, its probes,
//! usage reports and sessions served while it runs, SIGTERM and SIGINT passed on to it, and
//! its end; a restart in place after kubelet's back-off when the restart policy asks for one;
//! and the stop (SIGTERM, then SIGKILL after [`STOP_GRACE`]) when the node no longer believes
//! the rental.
//!
//! Not the runner's start and end (authentication, the workload's fetch, the final report: the
//! crate root's `run`) and not how a process or container is started (`executor`).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use neocloud_protocol::{LogRecord, Probes, RunnerState, StatusReport, Termination, Workload};
use tokio::sync::mpsc;

use crate::{
    CallbackClient, ExecTarget, ExecutorKind, RunnerArgs, RunnerError, STOP_GRACE, Shared, backoff,
    executor, probe, probe_check, pull, report, serve_sessions, stats,
};

/// The runs of one workload on this machine.
pub(crate) struct Runs<'a> {
    pub(crate) args: &'a RunnerArgs,
    pub(crate) client: &'a Arc<CallbackClient>,
    pub(crate) state: &'a Shared,
    pub(crate) workload: &'a Workload,
    pub(crate) container: &'a str,
    pub(crate) logs: Option<mpsc::Sender<LogRecord>>,
    /// The workload's file directories, bind-mounted by the docker executor.
    pub(crate) docker_mounts: Vec<(std::path::PathBuf, String)>,
    /// The egress destinations' names, resolved to the loopback by the docker executor.
    pub(crate) loopback_hosts: Vec<String>,
    pub(crate) backoff: backoff::Backoff,
    /// Restarts in place so far: the number of the current run.
    pub(crate) restarts: u32,
    /// How the last run that ended did.
    pub(crate) last: Option<Termination>,
}

impl Runs<'_> {
    /// Runs the workload, again after each end the restart policy restarts, and returns the
    /// final exit code and message; an error when the runner must stop (the node no longer
    /// believes this rental).
    pub(crate) async fn run_until_final(&mut self) -> Result<(i32, String), RunnerError> {
        loop {
            let started_at = Utc::now();
            let began = tokio::time::Instant::now();
            let (code, message) = match self.run_once(started_at).await? {
                Ok(ended) => ended,
                // Spawning fails the same way on this machine every time: not restarted.
                Err(message) => return Ok((127, message)),
            };
            let restart = self
                .workload
                .restart_policy
                .is_some_and(|p| p.restarts(code));
            if !restart {
                return Ok((code, message));
            }
            let ended = Termination::new(code, started_at, Utc::now());
            let delay = self.backoff.next_delay(began.elapsed());
            let waiting = StatusReport {
                exit_code: Some(code),
                message: Some(message.clone()),
                restart_count: self.restarts,
                last_termination: Some(ended.clone()),
                backoff_seconds: Some(delay.as_secs_f64().ceil() as u64),
                ..StatusReport::new(RunnerState::BackOff)
            };
            self.last = Some(ended);
            tracing::info!(
                code,
                ?delay,
                restarts = self.restarts,
                "runner: restarting the workload after a back-off"
            );
            self.report_or_go_on(waiting).await?;
            match wait_or_stop(delay, self.client.revoked()).await {
                Some(Waited::Revoked) => return Err(revoked()),
                // Stopped while backing off: the last run's code is the answer.
                Some(Waited::Exited(_)) => return Ok((code, message)),
                None => {}
            }
            self.restarts += 1;
        }
    }

    /// One run: `Ok(Ok((code, message)))` when it ended, `Ok(Err(why))` when it could not be
    /// started.
    async fn run_once(
        &mut self,
        started_at: chrono::DateTime<Utc>,
    ) -> Result<Result<(i32, String), String>, RunnerError> {
        let args = self.args;
        let docker = executor::DockerOptions {
            network: args.network.clone(),
            gpus: (args.gpus != "none").then(|| args.gpus.clone()),
            mounts: self.docker_mounts.clone(),
            loopback_hosts: self.loopback_hosts.clone(),
        };
        let Some(logs) = self.logs.as_ref() else {
            return Ok(Err("the log channel is closed".into()));
        };
        // A private image is pulled with its login before the first run; later runs find it.
        if args.executor == ExecutorKind::Docker
            && self.restarts == 0
            && let Err(e) = pull::pull_private(self.workload).await
        {
            return Ok(Err(e.to_string()));
        }
        let started = executor::start(
            args.executor,
            self.workload,
            &docker,
            self.container,
            logs,
            self.restarts,
        );
        let mut started = match started {
            Ok(started) => started,
            Err(e) => return Ok(Err(e.to_string())),
        };
        // Only a node that gave a restart policy reads the restart fields; an older one refuses
        // fields it does not know, so it gets the report's old shape.
        let restarting = self.workload.restart_policy.is_some();
        // Likewise, only a node that gave probes reads what they say.
        let probes = self.workload.probes.as_ref().filter(|p| !p.is_empty());
        let running = StatusReport {
            restart_count: self.restarts,
            started_at: restarting.then_some(started_at),
            last_termination: self.last.clone(),
            probes: probes.map(|p| probe::Prober::new(p).status()),
            ..StatusReport::new(RunnerState::Running)
        };
        if let Err(e) = self.report_or_go_on(running.clone()).await {
            stop(&mut started.child, args.executor, self.container).await;
            return Err(e);
        }
        // The process executor's child is the workload; docker's is the client, not the container.
        let root = (args.executor == ExecutorKind::Process)
            .then(|| started.child.id())
            .flatten();
        let client = self.client.clone();
        let stats = tokio::spawn(stats::report(client.clone(), root, args.heartbeat_interval));
        let target = ExecTarget::for_workload(args.executor, self.workload, self.container);
        let mut probing = probes.and_then(|p| {
            let checks = probe_check::Checker::new(target.clone())
                .inspect_err(|e| tracing::warn!(error = %e, "runner: the probes cannot run"))
                .ok()?;
            let reports = (client.clone(), self.state.clone(), running.clone());
            Some(tokio::spawn(probe_run(p.clone(), checks, reports)))
        });
        let sessions = tokio::spawn(serve_sessions(client.clone(), Arc::new(target)));
        let waited = tokio::select! {
            waited = wait_forwarding_signals(&mut started.child, client.revoked()) => Ok(waited),
            why = gave_up(&mut probing) => Err(why),
        };
        if let Some(probing) = probing {
            probing.abort();
        }
        sessions.abort();
        stats.abort();
        let waited = match waited {
            Ok(waited) => waited,
            Err(why) => {
                tracing::warn!(why, "runner: a probe gave up; stopping the workload");
                stop(&mut started.child, args.executor, self.container).await;
                let status = started.child.wait().await;
                let code = status.map_or(1, |s| exit_code(s).0);
                return Ok(Ok((code, format!("Container {why}"))));
            }
        };
        let status = match waited {
            Waited::Exited(status) => status,
            Waited::Revoked => {
                tracing::warn!(
                    "runner: the node says this rental is no longer current; stopping the workload"
                );
                stop(&mut started.child, args.executor, self.container).await;
                return Err(revoked());
            }
        };
        drop(started.env_file.take());
        Ok(Ok(match status {
            Ok(status) => exit_code(status),
            Err(e) => (1, format!("failed to wait for the workload: {e}")),
        }))
    }

    /// Reports a state between runs; only a refusal of the rental stops the runner (other
    /// failures pass: the heartbeats say the state, and the next report the rest).
    async fn report_or_go_on(&self, news: StatusReport) -> Result<(), RunnerError> {
        match report(self.client, self.state, news).await {
            Err(e) if e.is_rental_not_current() => Err(e),
            Err(e) if self.restarts == 0 && self.last.is_none() => Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "runner: a state report was not delivered");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }
}

fn revoked() -> RunnerError {
    RunnerError::RentalNotCurrent {
        what: "run the workload",
        message: "the node no longer believes this rental (it was replaced or declared \
                  lost); the workload was stopped"
            .into(),
    }
}

/// Waits `delay` before a restart; `Some` when the runner was told to stop meanwhile (SIGTERM
/// or SIGINT: [`Waited::Exited`]) or its rental was revoked.
async fn wait_or_stop(
    delay: Duration,
    mut revoked: tokio::sync::watch::Receiver<bool>,
) -> Option<Waited> {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut interrupt) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(interrupt)) => (term, interrupt),
        (Err(e), _) | (_, Err(e)) => return Some(Waited::Exited(Err(e))),
    };
    tokio::select! {
        () = tokio::time::sleep(delay) => None,
        _ = term.recv() => Some(Waited::Exited(Err(std::io::Error::other("stopped")))),
        _ = interrupt.recv() => Some(Waited::Exited(Err(std::io::Error::other("stopped")))),
        Ok(_) = revoked.wait_for(|revoked| *revoked) => Some(Waited::Revoked),
    }
}

/// Runs the probes of one run (see [`probe`]), reporting each change of `started` or `ready`
/// and each failed check as a `Running` report like `reports`' (the client, the shared state
/// and the run's report); returns when the liveness or startup probe gives up, with why.
async fn probe_run(
    probes: Probes,
    checks: probe_check::Checker,
    reports: (Arc<CallbackClient>, Shared, StatusReport),
) -> String {
    let (client, state, running) = reports;
    let began = tokio::time::Instant::now();
    let mut prober = probe::Prober::new(&probes);
    // A report that was not delivered is sent again with the next check's.
    let mut unsent = false;
    while let Some(next) = prober.next_due() {
        tokio::time::sleep_until(began + next).await;
        let now = began.elapsed().max(next);
        for kind in prober.due(now) {
            let Some(check) = prober.probe(kind).cloned() else {
                continue;
            };
            let outcome = prober.record(kind, now, checks.check(&check).await);
            if outcome.changed || outcome.failure.is_some() || unsent {
                let mut status = prober.status();
                status.failure = outcome.failure;
                let news = StatusReport {
                    probes: Some(status),
                    ..running.clone()
                };
                unsent = report(&client, &state, news)
                    .await
                    .inspect_err(
                        |e| tracing::warn!(error = %e, "runner: a probe's news was not delivered"),
                    )
                    .is_err();
            }
            if let Some(why) = outcome.restart {
                return why;
            }
        }
    }
    std::future::pending().await
}

/// Why the probes gave up on the run, once they do; never without probes.
async fn gave_up(probing: &mut Option<tokio::task::JoinHandle<String>>) -> String {
    match probing.as_mut() {
        Some(task) => match task.await {
            Ok(why) => why,
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// How waiting for the workload ended.
enum Waited {
    /// It ended by itself (or after a signal passed on).
    Exited(std::io::Result<std::process::ExitStatus>),
    /// The node said the rental is no longer current; the workload still runs.
    Revoked,
}

/// Waits for the workload, or for `revoked`. SIGTERM or SIGINT to the runner is passed on as
/// SIGTERM (`docker run` proxies it to the container), so stopping the runner stops the
/// workload, which then still reports `Exited` with its own code.
async fn wait_forwarding_signals(
    child: &mut tokio::process::Child,
    mut revoked: tokio::sync::watch::Receiver<bool>,
) -> Waited {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut interrupt) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(interrupt)) => (term, interrupt),
        (Err(e), _) | (_, Err(e)) => return Waited::Exited(Err(e)),
    };
    loop {
        tokio::select! {
            status = child.wait() => return Waited::Exited(status),
            _ = term.recv() => received("SIGTERM", child),
            _ = interrupt.recv() => received("SIGINT", child),
            Ok(_) = revoked.wait_for(|revoked| *revoked) => return Waited::Revoked,
        }
    }
}

/// The runner itself was told to stop (by its VM's shutdown, `docker stop`, or Ctrl-C): said in
/// its log, then passed on to the workload.
fn received(signal: &str, child: &tokio::process::Child) {
    tracing::info!(signal, "runner: received a signal to stop");
    forward_sigterm(child);
}

/// Stops the workload: SIGTERM, then SIGKILL after [`STOP_GRACE`]; a docker container, which
/// killing its `docker run` client does not stop, is removed as well.
async fn stop(child: &mut tokio::process::Child, executor: ExecutorKind, container: &str) {
    forward_sigterm(child);
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        tracing::warn!("runner: the workload outlived SIGTERM; killing it");
        if let Err(e) = child.kill().await {
            tracing::warn!(error = %e, "runner: failed to kill the workload");
        }
    }
    if executor == ExecutorKind::Docker {
        let removed = tokio::process::Command::new("docker")
            .args(["rm", "--force", container])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await;
        if let Err(e) = removed {
            tracing::warn!(container, error = %e, "runner: failed to remove the container");
        }
    }
}

fn forward_sigterm(child: &tokio::process::Child) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) else {
        return;
    };
    tracing::info!(pid, "runner: passing SIGTERM on to the workload");
    if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGTERM) {
        tracing::warn!(pid, error = %e, "runner: failed to signal the workload");
    }
}

pub(crate) fn exit_code(status: std::process::ExitStatus) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, format!("exited with code {code}")),
        (None, Some(signal)) => (128 + signal, format!("killed by signal {signal}")),
        (None, None) => (1, "exited".into()),
    }
}
