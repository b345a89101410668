//! `neocloud-runner`: the agent on a rented VM. Started by cloud-init (the node writes the
//! command into the VM's `user_data`), it exchanges its bootstrap token for a session with the
//! node's callback server over TLS (trusting only the certificate it was given), fetches the
//! workload, writes its files (ConfigMap, Secret and downward-API volumes, kept up to date: see
//! `files`), runs it, reports `Starting` → `Running` → `Exited`, heartbeats (saying its state),
//! streams logs, serves `kubectl exec` and `kubectl port-forward` sessions the node tunnels to
//! it ([`serve_sessions`]), and exits with the workload's exit code. When the node restarts or another
//! replica takes over, the runner carries on: the session stays valid (the replicas share its
//! key), a refused one is replaced with the binding's re-authentication credential, log records
//! of failed requests are sent again, and the final report is retried for minutes. When the node
//! says the runner's rental is no longer current (the machine was replaced or declared lost
//! while it was cut off), the runner stops the workload (SIGTERM, then SIGKILL after
//! [`STOP_GRACE`]; a docker container is removed) and exits with an error: the node no longer
//! believes it, and a second copy of the workload must not go on.
//!
//! Its secrets (bootstrap token, boot credential) come from a file of mode 0600 it reads and
//! deletes at start (`--secrets-file`), or, from older nodes, from its environment; either way
//! the workload's environment never holds them. What a workload can still read is in the
//! threat model (docs/SECURITY.md).
//!
//! Not the server side (`neocloud-node`'s `callback` module) and not the wire types
//! (`neocloud-protocol`). Downloaded onto every VM, so it links no Kubernetes client, no Wasm
//! engine and no simulator (`host/node/tests/layout.rs` checks).
//!
//! Here: [`run`], from authentication to the final report. Its flags and secrets are read in
//! `args`; the runs of the workload (each start, wait, restart in place and stop) are `runs`.

mod args;
pub mod backoff;
mod client;
pub mod egress;
mod executor;
mod files;
pub mod probe;
mod probe_check;
mod pull;
mod runs;
mod session;
mod shipper;
mod stats;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use neocloud_protocol::{RunnerState, Secret, StatusReport};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::args::ca_pem;
use crate::runs::{Runs, exit_code};

pub use args::{
    HOSTS_FILE_ENV, RESTART_BACKOFF_ENV, RunnerArgs, load_secrets, parse_duration, parse_executor,
    parse_gpus, parse_network,
};
pub use client::CallbackClient;
pub use executor::{EnvFile, container_name, docker_args};
pub use neocloud_protocol::{BOOTSTRAP_TOKEN_ENV, DEFAULT_HEARTBEAT_INTERVAL, ExecutorKind};
pub use session::{ExecTarget, forward, serve_session, serve_sessions};

/// How long the final `Exited` report is tried (heartbeats go on meanwhile), so a node that is
/// failing over still learns the exit code.
const FINAL_REPORT_PATIENCE: Duration = Duration::from_secs(300);
/// How long the runner waits for the last log lines to be delivered after the workload exits.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a workload stopped because its rental is no longer current has after SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Why the runner failed before the workload could report its own exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The callback URL is unusable (for example, plain http).
    #[error("invalid callback URL {0}")]
    Url(String),
    /// The CA could not be read or parsed.
    #[error("callback CA: {0}")]
    Ca(String),
    /// The request did not complete (connection, TLS, timeout).
    #[error("failed to {what}: {message}")]
    Http {
        /// What the runner was doing.
        what: &'static str,
        /// Why it failed.
        message: String,
    },
    /// The node answered with an error.
    #[error("failed to {what}: the node answered {status}: {message}")]
    Refused {
        /// What the runner was doing.
        what: &'static str,
        /// HTTP status.
        status: u16,
        /// The node's error message.
        message: String,
    },
    /// The node said the runner's rental is no longer current (replaced or declared lost).
    #[error("failed to {what}: {message}")]
    RentalNotCurrent {
        /// What the runner was doing.
        what: &'static str,
        /// The node's message.
        message: String,
    },
    /// The machine is held for a Pod that has not come: there is no workload yet.
    #[error("no workload yet: {message}")]
    HeldForAPod {
        /// The node's message.
        message: String,
    },
    /// The secrets file is missing, unsafe or unreadable, or no bootstrap token was given.
    #[error("runner secrets: {0}")]
    Secrets(String),
    /// A call needed a session before the token exchange.
    #[error("no session: the bootstrap token has not been exchanged")]
    NoSession,
    /// The workload has neither command nor args (process executor).
    #[error("the workload has no command to run")]
    NoCommand,
    /// The workload could not be started.
    #[error("failed to start {program}: {message}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        message: String,
    },
    /// The Docker env file could not be written.
    #[error("docker env file: {0}")]
    EnvFile(String),
    /// The workload's files are unsafe or could not be written.
    #[error("workload files: {0}")]
    Files(String),
    /// Waiting for the workload failed.
    #[error("failed to wait for the workload: {0}")]
    Wait(String),
}

/// The state the runner is in, shared with its heartbeats.
type Shared = Arc<Mutex<Option<RunnerState>>>;

/// Exchanges the bootstrap token, or, if the node refuses it (a node that restarted since it
/// issued it knows it no longer), authenticates with the credential.
async fn authenticate(client: &CallbackClient, bootstrap: &Secret) -> Result<String, RunnerError> {
    match client.exchange(bootstrap).await {
        Err(e) if e.is_unauthorized() && client.can_reauthenticate() => {
            tracing::warn!(error = %e, "runner: bootstrap token refused; using the credential");
            client.reauthenticate().await
        }
        other => other,
    }
}

/// The most a held machine's runner waits between polls for its Pod.
const HANDOVER_POLL: Duration = Duration::from_secs(2);

/// Polls the node until a Pod takes this held machine (at the heartbeat interval, at most
/// [`HANDOVER_POLL`]: each poll is a sign of life), and returns that Pod's bootstrap token and
/// boot credential. A node that is away (a failover) is waited for; a refusal ends the runner.
async fn wait_for_pod(
    client: &CallbackClient,
    every: Duration,
) -> Result<(Secret, Option<Secret>), RunnerError> {
    let every = every.min(HANDOVER_POLL);
    loop {
        match client.handover().await {
            Ok(handover) => {
                if let Some(token) = handover.bootstrap_token {
                    return Ok((Secret::new(token), handover.credential.map(Secret::new)));
                }
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "runner: the node is away; waiting for a Pod still");
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(every).await;
    }
}

/// Runs the workload to completion and returns its exit code. Under a restart policy that
/// asks for it (given by the node with the workload), a workload that ends runs again on this
/// machine after kubelet's back-off ([`backoff`]), and each end and restart is reported.
pub async fn run(args: RunnerArgs) -> Result<i32, RunnerError> {
    let (bootstrap, credential) = load_secrets(&args)?;
    let client = CallbackClient::new(&args.callback_url, &ca_pem(&args)?)?;
    let client = Arc::new(client.with_credential(credential));
    let spiffe_id = authenticate(&client, &bootstrap).await?;
    drop(bootstrap);
    tracing::info!(%spiffe_id, "runner: authenticated");
    let (client, spiffe_id, workload) = match client.workload().await {
        Err(e) if e.is_held_for_a_pod() => {
            tracing::info!(%spiffe_id, "runner: this machine is held for a Pod; waiting for it");
            let (bootstrap, credential) = wait_for_pod(&client, args.heartbeat_interval).await?;
            let pods = CallbackClient::new(&args.callback_url, &ca_pem(&args)?)?;
            let pods = Arc::new(pods.with_credential(credential));
            let spiffe_id = authenticate(&pods, &bootstrap).await?;
            tracing::info!(%spiffe_id, "runner: a Pod took this machine; authenticated as its runner");
            let workload = pods.workload().await?;
            (pods, spiffe_id, workload)
        }
        other => (client, spiffe_id, other?),
    };
    let state: Shared = Arc::default();
    report(&client, &state, StatusReport::new(RunnerState::Starting)).await?;
    let heartbeats = tokio::spawn(heartbeat(
        client.clone(),
        state.clone(),
        args.heartbeat_interval,
    ));
    let (logs_tx, logs_rx) = mpsc::channel(16 * 1024);
    let shipper = tokio::spawn(shipper::ship(client.clone(), logs_rx));
    let container = container_name(&spiffe_id);
    // The files are written once for every run on this machine, and follow their objects.
    let prepared = files::Files::prepare(args.executor, &workload.files, &container);
    // Served for every run on this machine.
    let (egress, loopback_hosts) = egress::start(&client, &workload.egress, &args).await;
    let mut runs = Runs {
        args: &args,
        client: &client,
        state: &state,
        workload: &workload,
        container: &container,
        logs: Some(logs_tx),
        docker_mounts: Vec::new(),
        loopback_hosts,
        backoff: backoff::Backoff::with_base(args.restart_backoff),
        restarts: 0,
        last: None,
    };
    let (ended, follow) = match prepared {
        Ok(files) => {
            runs.docker_mounts = files.docker_mounts();
            let follow = tokio::spawn(files.follow(client.clone(), args.heartbeat_interval));
            (runs.run_until_final().await, Some(follow))
        }
        // Files that cannot be written fail the same way on every run: not restarted.
        Err(e) => (Ok((127, e.to_string())), None),
    };
    if let Some(follow) = follow {
        follow.abort();
    }
    egress.abort();
    drop(runs.logs.take());
    let (code, message) = match ended {
        Ok(ended) => ended,
        Err(e) => {
            heartbeats.abort();
            return Err(e);
        }
    };
    if tokio::time::timeout(LOG_DRAIN_TIMEOUT, shipper)
        .await
        .is_err()
    {
        tracing::warn!("runner: gave up waiting for the last log lines to be delivered");
    }
    let final_report = StatusReport {
        exit_code: Some(code),
        message: Some(message),
        restart_count: runs.restarts,
        last_termination: runs.last.clone(),
        restarts_in_place: workload.restart_policy.is_some(),
        ..StatusReport::new(RunnerState::Exited)
    };
    let reported = finish(&client, &state, final_report).await;
    heartbeats.abort();
    reported?;
    Ok(code)
}

/// Reports `Exited`, trying again for [`FINAL_REPORT_PATIENCE`] while the failure may pass (the
/// node failing over); the caller keeps heartbeats going meanwhile.
async fn finish(
    client: &CallbackClient,
    state: &Shared,
    news: StatusReport,
) -> Result<(), RunnerError> {
    let deadline = tokio::time::Instant::now() + FINAL_REPORT_PATIENCE;
    loop {
        match report(client, state, news.clone()).await {
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "runner: the exit code is not delivered yet; trying again");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            other => return other,
        }
    }
}

async fn report(
    client: &CallbackClient,
    shared: &Shared,
    news: StatusReport,
) -> Result<(), RunnerError> {
    tracing::info!(state = ?news.state, exit_code = ?news.exit_code, restarts = news.restart_count, "runner: reporting state");
    if news.state != RunnerState::Exited {
        *shared.lock() = Some(news.state);
    }
    client.status(&news).await
}

async fn heartbeat(client: Arc<CallbackClient>, state: Shared, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = *state.lock();
        if let Err(e) = client.heartbeat(now).await {
            tracing::warn!(error = %e, "runner: heartbeat failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_in_transit_and_busy_nodes_are_retried() {
        let http = |message: &str| RunnerError::Http {
            what: "report the state",
            message: message.into(),
        };
        let refused = |status| RunnerError::Refused {
            what: "report the state",
            status,
            message: String::new(),
        };
        assert!(http("error sending request: connection refused").is_transient());
        assert!(!http("invalid peer certificate: UnknownIssuer").is_transient());
        assert!(refused(429).is_transient());
        assert!(refused(503).is_transient());
        for status in [400, 401, 403, 404] {
            assert!(!refused(status).is_transient(), "{status}");
        }
        assert!(!RunnerError::NoCommand.is_transient());
    }

    #[test]
    fn plain_http_callback_url_is_refused() {
        let err = CallbackClient::new("http://10.0.0.1:8443", b"").expect_err("http");
        assert!(err.to_string().contains("must use https"), "{err}");
    }
}
