//! The runner callback's protocol: what the VM runner (`neocloud-runner`) and the node's callback
//! server agree on. The JSON shapes of each request and response ([`wire`]), the secret wrapper
//! that keeps tokens out of logs ([`Secret`]), the environment variables and executor names of
//! the runner's command line, which the node writes into each VM's `user_data`.
//!
//! Not behaviour: no HTTP, no TLS, no token issuing or checking. The server lives in
//! `neocloud-node`'s `callback` module, the client in `neocloud-runner`. Kept small on purpose:
//! the runner links it onto every rented VM.

mod egress;
mod probes;
pub mod relay;
mod secret;
pub mod session;
pub mod wire;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use egress::{CLUSTER_DOMAIN, EgressTarget, WORKLOAD_EGRESS_QUERY};
pub use probes::{
    Probe, ProbeAction, ProbeFailure, ProbeKind, ProbeStatus, Probes, WORKLOAD_PROBES_QUERY,
};
pub use secret::{BootstrapToken, Secret, SessionToken};
pub use wire::{
    EnvVar, ErrorBody, File, FileMount, GpuStats, HELD_FOR_A_POD, Handover, Heartbeat, LogRecord,
    LogStream, RENTAL_NOT_CURRENT, ReauthRequest, RegistryLogin, RestartPolicy, RunnerState,
    StatusReport, Termination, TokenRequest, TokenResponse, WORKLOAD_RESTARTS_QUERY, Workload,
    WorkloadStats,
};

/// The environment variable that may carry the bootstrap token instead of the runner's flag.
pub const BOOTSTRAP_TOKEN_ENV: &str = "NEOCLOUD_BOOTSTRAP_TOKEN";
/// The environment variable that may carry the re-authentication credential.
pub const CREDENTIAL_ENV: &str = "NEOCLOUD_RUNNER_CREDENTIAL";
/// The environment variable that may name the runner's secrets file (a path, not a secret):
/// `NAME=value` lines of [`BOOTSTRAP_TOKEN_ENV`] and [`CREDENTIAL_ENV`], mode 0600, which the
/// runner reads and deletes at start, so the secrets are neither in its environment (nor its
/// `/proc/<pid>/environ`) nor left on disk.
pub const SECRETS_FILE_ENV: &str = "NEOCLOUD_RUNNER_SECRETS_FILE";

/// The runner's heartbeat period unless its `--heartbeat-interval` says otherwise.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);

/// Seconds since the Unix epoch (0 if the clock is before it): the unit of session expiries.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// How the runner runs a workload: its `--executor` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorKind {
    /// A local process: `command` + `args` with `env`; the image is ignored.
    Process,
    /// `docker run --rm --gpus all` of the image.
    Docker,
}

/// An executor name that is neither `docker` nor `process`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid executor {0:?}: expected docker or process")]
pub struct UnknownExecutor(pub String);

impl ExecutorKind {
    /// The name on the runner's command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Docker => "docker",
        }
    }
}

impl std::str::FromStr for ExecutorKind {
    type Err = UnknownExecutor;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "process" => Ok(Self::Process),
            "docker" => Ok(Self::Docker),
            other => Err(UnknownExecutor(other.to_string())),
        }
    }
}

impl std::fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The container network mode unless the node's `runner.containerNetwork` says otherwise: the
/// Pod's ports are the VM's own, as a Pod's are its node's with `hostNetwork`.
pub const DEFAULT_CONTAINER_NETWORK: &str = "host";

/// Checks a container network mode (`docker run --network`): `host`, `bridge`, `none`, a
/// network's name, or `container:<name>`. Names are Docker's (`[A-Za-z0-9][A-Za-z0-9_.-]*`), so
/// a mode can never be read as an option or carry a second word.
pub fn check_network_mode(mode: &str) -> Result<(), String> {
    let name = mode.strip_prefix("container:").unwrap_or(mode);
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(())
    } else {
        Err(format!(
            "{mode:?} is not a network mode (host, bridge, none, a network name or \
             container:<name>; names are [A-Za-z0-9][A-Za-z0-9_.-]*)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_modes_are_docker_names_and_nothing_else() {
        for ok in ["host", "bridge", "none", "gpu-net_1.a", "container:sidecar"] {
            assert_eq!(check_network_mode(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "--privileged",
            "host --pid=host",
            "-x",
            "container:",
            "a;b",
            "ho\nst",
        ] {
            let err = check_network_mode(bad).expect_err(bad);
            assert!(
                err.starts_with(&format!("{bad:?} is not a network mode")),
                "{err}"
            );
        }
    }

    #[test]
    fn executor_names_round_trip_and_unknown_names_are_named() {
        for kind in [ExecutorKind::Process, ExecutorKind::Docker] {
            assert_eq!(kind.as_str().parse::<ExecutorKind>(), Ok(kind));
        }
        let err = "podman".parse::<ExecutorKind>().expect_err("podman");
        assert_eq!(
            err.to_string(),
            "invalid executor \"podman\": expected docker or process"
        );
    }

    #[test]
    fn unix_now_is_after_2026() {
        assert!(unix_now() > 1_767_225_600, "{}", unix_now());
    }
}
