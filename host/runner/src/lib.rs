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

pub mod backoff;
mod client;
pub mod egress;
mod executor;
mod files;
pub mod probe;
mod probe_check;
mod pull;
mod session;
mod shipper;
mod stats;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::Utc;
use neocloud_protocol::{
    CREDENTIAL_ENV, LogRecord, Probes, RunnerState, SECRETS_FILE_ENV, Secret, StatusReport,
    Termination, Workload,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;

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

/// Flags of `neocloud-runner`. `Debug` shows `<redacted>` for the bootstrap token and the
/// credential.
#[derive(Clone, clap::Parser)]
#[command(name = "neocloud-runner", version, about)]
pub struct RunnerArgs {
    /// The node's callback URL (https only), e.g. `https://node.example:8443`.
    #[arg(long)]
    pub callback_url: String,
    /// The one-time bootstrap token from the VM's user_data (prefer `--secrets-file`: a flag is
    /// on the process list, and the environment in `/proc/<pid>/environ`).
    #[arg(long, env = BOOTSTRAP_TOKEN_ENV, hide_env_values = true)]
    pub bootstrap_token: Option<String>,
    /// A file of `NAME=value` lines giving `NEOCLOUD_BOOTSTRAP_TOKEN` and
    /// `NEOCLOUD_RUNNER_CREDENTIAL`, of mode 0600 (refused otherwise); read and deleted at start.
    #[arg(long, env = SECRETS_FILE_ENV)]
    pub secrets_file: Option<std::path::PathBuf>,
    /// The binding's re-authentication credential from the VM's user_data: gets a new session
    /// when the node no longer accepts the runner's one (after a restart or failover).
    #[arg(long, env = CREDENTIAL_ENV, hide_env_values = true)]
    pub credential: Option<String>,
    /// PEM file of the certificate (or CA) to trust for the callback; the only trusted root.
    #[arg(
        long,
        conflicts_with = "ca_pem_base64",
        required_unless_present = "ca_pem_base64"
    )]
    pub ca_file: Option<std::path::PathBuf>,
    /// The same PEM, base64-encoded (as cloud-init user_data carries it).
    #[arg(long)]
    pub ca_pem_base64: Option<String>,
    /// How to run the workload.
    #[arg(long, default_value = "docker", value_parser = parse_executor)]
    pub executor: ExecutorKind,
    /// The container's network mode with the docker executor (`docker run --network`): `host`
    /// (the default: the Pod's ports are the VM's), `bridge`, `none` or a network's name.
    #[arg(long, default_value = neocloud_protocol::DEFAULT_CONTAINER_NETWORK, value_parser = parse_network)]
    pub network: String,
    /// The container's GPUs with the docker executor (`docker run --gpus`): `all` (the
    /// default), a count, or `device=0,1`; `none` runs it without GPUs (a machine without
    /// NVIDIA's container toolkit, where `--gpus` fails).
    #[arg(long, default_value = "all", value_parser = parse_gpus)]
    pub gpus: String,
    /// Heartbeat period: `15s`, `500ms` or plain seconds.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// The first wait before restarting a workload in place (kubelet's 10 s, doubling to 30
    /// times it). A knob for tests only, hidden: only kubelet's default belongs in production.
    #[arg(long, hide = true, env = RESTART_BACKOFF_ENV, default_value = "10s", value_parser = parse_duration)]
    pub restart_backoff: Duration,
    /// The hosts file the process executor adds the egress destinations' names to (a knob for
    /// tests, hidden: on a rented VM it is `/etc/hosts`).
    #[arg(long, hide = true, env = HOSTS_FILE_ENV, default_value = "/etc/hosts")]
    pub hosts_file: std::path::PathBuf,
}

/// The environment variable of the runner's hidden `--hosts-file`.
pub const HOSTS_FILE_ENV: &str = "NEOCLOUD_RUNNER_HOSTS_FILE";

/// The environment variable of the runner's hidden `--restart-backoff` (tests shorten the
/// restart back-off with it).
pub const RESTART_BACKOFF_ENV: &str = "NEOCLOUD_RUNNER_RESTART_BACKOFF";

impl std::fmt::Debug for RunnerArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |set: bool| if set { "<redacted>" } else { "<none>" };
        f.debug_struct("RunnerArgs")
            .field("callback_url", &self.callback_url)
            .field("bootstrap_token", &redacted(true))
            .field("credential", &redacted(self.credential.is_some()))
            .field("ca_file", &self.ca_file)
            .field("ca_pem_base64", &self.ca_pem_base64)
            .field("executor", &self.executor)
            .field("network", &self.network)
            .field("gpus", &self.gpus)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("restart_backoff", &self.restart_backoff)
            .field("hosts_file", &self.hosts_file)
            .finish()
    }
}

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

/// Parses `docker` or `process`.
pub fn parse_executor(text: &str) -> Result<ExecutorKind, String> {
    text.parse()
        .map_err(|e: neocloud_protocol::UnknownExecutor| e.to_string())
}

/// Parses a container network mode (see [`neocloud_protocol::check_network_mode`]).
pub fn parse_network(text: &str) -> Result<String, String> {
    neocloud_protocol::check_network_mode(text).map(|()| text.to_owned())
}

/// Parses a `docker run --gpus` value: `all`, `none`, a count, or `device=<ids>` (letters,
/// digits and `,:._-` only, so it stays one option of docker's).
pub fn parse_gpus(text: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || ",:._-=".contains(c);
    let word = !text.is_empty() && !text.starts_with('-') && text.chars().all(allowed);
    let known = matches!(text, "all" | "none")
        || text.parse::<u32>().is_ok()
        || text
            .strip_prefix("device=")
            .is_some_and(|d| !d.is_empty() && !d.contains('='));
    if word && known {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a GPU request: use all, none, a count or device=<ids>"
        ))
    }
}

/// Parses `15s`, `500ms`, `1m` or plain (possibly fractional) seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("invalid duration unit in {text:?} (ms, s or m)")),
    };
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("invalid duration {text:?}"))
}

fn ca_pem(args: &RunnerArgs) -> Result<Vec<u8>, RunnerError> {
    match (&args.ca_file, &args.ca_pem_base64) {
        (Some(path), _) => std::fs::read(path)
            .map_err(|e| RunnerError::Ca(format!("failed to read {}: {e}", path.display()))),
        (None, Some(b64)) => STANDARD
            .decode(b64.trim())
            .map_err(|e| RunnerError::Ca(format!("--ca-pem-base64 is not base64: {e}"))),
        (None, None) => Err(RunnerError::Ca("give --ca-file or --ca-pem-base64".into())),
    }
}

/// The bootstrap token and credential: from `--secrets-file` (read, checked to be of mode 0600
/// or stricter, and deleted), else from the flags or the environment.
pub fn load_secrets(args: &RunnerArgs) -> Result<(Secret, Option<Secret>), RunnerError> {
    let mut token = args.bootstrap_token.clone();
    let mut credential = args.credential.clone();
    if let Some(path) = &args.secrets_file {
        let text = read_secrets_file(path)?;
        for line in text.lines() {
            match line.split_once('=') {
                Some((BOOTSTRAP_TOKEN_ENV, value)) => token = Some(value.to_owned()),
                Some((CREDENTIAL_ENV, value)) if !value.trim().is_empty() => {
                    credential = Some(value.to_owned());
                }
                _ => {}
            }
        }
    }
    let token = token
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| RunnerError::Secrets("no bootstrap token was given".into()))?;
    let credential = credential.map(|c| Secret::new(c.trim()));
    Ok((Secret::new(token.trim()), credential))
}

fn read_secrets_file(path: &std::path::Path) -> Result<String, RunnerError> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| RunnerError::Secrets(format!("failed to read {shown}: {e}")))?;
    let mode = meta.permissions().mode() & 0o777;
    if !meta.is_file() || mode & 0o077 != 0 {
        return Err(RunnerError::Secrets(format!(
            "{shown} must be a regular file of mode 0600 or stricter, not {mode:o}"
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| RunnerError::Secrets(format!("failed to read {shown}: {e}")))?;
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(file = %shown, error = %e, "runner: could not delete the secrets file");
    }
    Ok(text)
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
    let workload = client.workload().await?;
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

/// The runs of one workload on this machine.
struct Runs<'a> {
    args: &'a RunnerArgs,
    client: &'a Arc<CallbackClient>,
    state: &'a Shared,
    workload: &'a Workload,
    container: &'a str,
    logs: Option<mpsc::Sender<LogRecord>>,
    /// The workload's file directories, bind-mounted by the docker executor.
    docker_mounts: Vec<(std::path::PathBuf, String)>,
    /// The egress destinations' names, resolved to the loopback by the docker executor.
    loopback_hosts: Vec<String>,
    backoff: backoff::Backoff,
    /// Restarts in place so far: the number of the current run.
    restarts: u32,
    /// How the last run that ended did.
    last: Option<Termination>,
}

impl Runs<'_> {
    /// Runs the workload, again after each end the restart policy restarts, and returns the
    /// final exit code and message; an error when the runner must stop (the node no longer
    /// believes this rental).
    async fn run_until_final(&mut self) -> Result<(i32, String), RunnerError> {
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
            _ = term.recv() => forward_sigterm(child),
            _ = interrupt.recv() => forward_sigterm(child),
            Ok(_) = revoked.wait_for(|revoked| *revoked) => return Waited::Revoked,
        }
    }
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

fn exit_code(status: std::process::ExitStatus) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, format!("exited with code {code}")),
        (None, Some(signal)) => (128 + signal, format!("killed by signal {signal}")),
        (None, None) => (1, "exited".into()),
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
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0.25"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("abc").is_err());
    }

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

    fn args_with(file: &std::path::Path) -> RunnerArgs {
        use clap::Parser;
        RunnerArgs::try_parse_from([
            "neocloud-runner",
            "--callback-url",
            "https://n:1",
            "--ca-pem-base64",
            "UEVN",
            "--secrets-file",
            &file.display().to_string(),
        ])
        .expect("args")
    }

    #[test]
    fn the_secrets_file_is_read_once_and_deleted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secrets");
        let text = format!("{BOOTSTRAP_TOKEN_ENV}=tok\n{CREDENTIAL_ENV}=ncr2:cred\n");
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (token, credential) = load_secrets(&args_with(&file)).expect("secrets");
        assert_eq!(token.expose(), "tok");
        assert_eq!(credential.as_ref().map(Secret::expose), Some("ncr2:cred"));
        assert!(!file.exists(), "the file is deleted once read");
        let again = load_secrets(&args_with(&file)).expect_err("gone");
        assert!(again.to_string().contains("failed to read"), "{again}");
    }

    #[test]
    fn a_secrets_file_others_can_read_is_refused_and_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secrets");
        std::fs::write(&file, format!("{BOOTSTRAP_TOKEN_ENV}=tok\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = load_secrets(&args_with(&file)).expect_err("group-readable");
        assert!(
            err.to_string()
                .contains("must be a regular file of mode 0600 or stricter, not 640"),
            "{err}"
        );
        assert!(file.exists());
    }

    #[test]
    fn debug_of_the_runner_s_flags_redacts_the_token_and_the_credential() {
        use clap::Parser;
        let args = RunnerArgs::try_parse_from([
            "neocloud-runner",
            "--callback-url=https://node:8443",
            "--bootstrap-token=bt-very-secret",
            "--credential=ncr1.very-secret-credential",
            "--ca-file=/etc/ca.pem",
        ])
        .expect("flags");
        let debug = format!("{args:?} {args:#?}");
        assert!(!debug.contains("very-secret"), "{debug}");
        assert!(debug.contains("bootstrap_token: \"<redacted>\""), "{debug}");
        assert!(debug.contains("credential: \"<redacted>\""), "{debug}");
        assert!(debug.contains("https://node:8443"), "{debug}");
    }

    #[test]
    fn plain_http_callback_url_is_refused() {
        let err = CallbackClient::new("http://10.0.0.1:8443", b"").expect_err("http");
        assert!(err.to_string().contains("must use https"), "{err}");
    }
}
