//! What the runner is told: its flags ([`RunnerArgs`], with their parsers) and its secrets, read
//! from the mode-0600 file it deletes at start or, from older nodes, from its flags and
//! environment; and the CA it trusts for the callback.
//!
//! Not what it does with them (the crate root's `run`), and not the node's side of these
//! flags (`neocloud-remote`'s `user_data`, which writes them).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use neocloud_protocol::{CREDENTIAL_ENV, SECRETS_FILE_ENV, Secret};

use crate::{BOOTSTRAP_TOKEN_ENV, ExecutorKind, RunnerError};

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

pub(crate) fn ca_pem(args: &RunnerArgs) -> Result<Vec<u8>, RunnerError> {
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
}
