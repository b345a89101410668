//! The cloud-init `user_data` that starts the runner on a rented VM.
//!
//! It carries the callback URL, the certificate to trust, the binding's bootstrap token and its
//! re-authentication credential. The token is one-time and expires within minutes. The
//! credential is not: it lets the runner get a new session from whichever replica leads after
//! a restart or failover, for this one binding, while the binding lives and until the node's
//! runner identity is rotated; so whoever can read this `user_data` later (the cloud's
//! metadata service, a console, a snapshot) can act as this binding's runner. Both reach the
//! runner through its systemd unit's environment, not its command line, so neither is on the
//! VM's process list.
//!
//! Not how the runner binary gets onto an image that lacks it beyond an optional download with a
//! mandatory SHA-256 check.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;

use neocloud_protocol::{BOOTSTRAP_TOKEN_ENV, CREDENTIAL_ENV};

use super::{BootstrapToken, ExecutorKind, Secret};

/// Where the runner binary (`neocloud-runner`) is on the VM unless configured otherwise.
pub const DEFAULT_RUNNER_PATH: &str = "/usr/local/bin/neocloud-runner";

/// How the rendered `user_data` starts the runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDataOptions {
    /// The runner binary's path on the VM.
    pub runner_path: String,
    /// Download the binary from here first (with its SHA-256), if the image lacks it.
    pub download: Option<RunnerDownload>,
    /// How the runner runs the workload.
    pub executor: ExecutorKind,
    /// The container's network mode with the docker executor (`docker run --network`).
    pub network: String,
    /// Heartbeat period.
    pub heartbeat_interval: Duration,
}

impl Default for UserDataOptions {
    fn default() -> Self {
        Self {
            runner_path: DEFAULT_RUNNER_PATH.to_string(),
            download: None,
            executor: ExecutorKind::Docker,
            network: neocloud_protocol::DEFAULT_CONTAINER_NETWORK.to_string(),
            heartbeat_interval: neocloud_protocol::DEFAULT_HEARTBEAT_INTERVAL,
        }
    }
}

/// Where to fetch the runner binary and the digest it must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerDownload {
    /// HTTPS URL of the binary.
    pub url: String,
    /// Its lowercase hex SHA-256.
    pub sha256: String,
}

#[derive(Serialize)]
struct CloudConfig {
    runcmd: Vec<Vec<String>>,
}

/// Renders `#cloud-config` whose `runcmd` starts `neocloud-runner` as a transient systemd
/// unit (so cloud-init finishes while the workload runs).
pub fn render_user_data(
    callback_url: &str,
    ca_pem: &str,
    token: &BootstrapToken,
    credential: &Secret,
    options: &UserDataOptions,
) -> String {
    let path = options.runner_path.clone();
    let mut runcmd = Vec::new();
    if let Some(download) = &options.download {
        // Everything inserted into the shell step is quoted as one word (the node's settings
        // check also refuses such values; this holds whatever reaches here), and `--` ends
        // curl's options before the URL.
        let (q_path, q_url, q_line) = (
            quote(&path),
            quote(&download.url),
            quote(&format!("{}  {path}", download.sha256)),
        );
        let script = format!(
            "curl -fsSL -o {q_path} -- {q_url} && printf '%s\\n' {q_line} | sha256sum -c - && \
             chmod 0755 -- {q_path}",
        );
        runcmd.push(vec!["sh".into(), "-c".into(), script]);
    }
    // The token and the credential reach the runner through its unit's environment, not its
    // command line: they are not on the VM's process list while it runs.
    let mut start: Vec<String> = [
        "systemd-run",
        "--unit=neocloud-runner",
        "--collect",
        "--quiet",
    ]
    .map(String::from)
    .into();
    start.extend([
        format!("--setenv={BOOTSTRAP_TOKEN_ENV}={}", token.expose()),
        format!("--setenv={CREDENTIAL_ENV}={}", credential.expose()),
    ]);
    start.extend(runner_argv(
        path,
        callback_url,
        ca_pem,
        options.executor,
        Some(&options.network),
        options.heartbeat_interval,
    ));
    runcmd.push(start);
    let yaml = serde_yaml::to_string(&CloudConfig { runcmd }).unwrap_or_default();
    format!("#cloud-config\n{yaml}")
}

/// The runner at `path` and its flags: the callback to call, the CA to trust, how to run the
/// workload, and how often to beat.
fn runner_argv(
    path: String,
    callback_url: &str,
    ca_pem: &str,
    executor: ExecutorKind,
    network: Option<&str>,
    heartbeat_interval: Duration,
) -> Vec<String> {
    let mut argv = vec![
        path,
        "--callback-url".into(),
        callback_url.to_owned(),
        "--ca-pem-base64".into(),
        STANDARD.encode(ca_pem),
        "--executor".into(),
        executor.as_str().into(),
    ];
    if let Some(network) = network {
        argv.extend(["--network".into(), network.to_owned()]);
    }
    argv.extend([
        "--heartbeat-interval".into(),
        format!("{}ms", heartbeat_interval.as_millis()),
    ]);
    argv
}

/// Where a container downloads the runner to (a container's `/tmp` is writable by any user).
pub const CONTAINER_RUNNER_PATH: &str = "/tmp/neocloud-runner";

/// A container's start command that starts the runner in place of the Pod's command (RunPod's
/// `args`, Vast.ai's `args`), and the environment it needs: `sh -c` with a script that, when
/// `options.download` is set, fetches the runner to [`CONTAINER_RUNNER_PATH`] with whichever of
/// curl, wget or python3 the image has, checks its SHA-256, and then `exec`s it with the
/// process executor, so that the runner is the container's main process and runs the Pod's
/// command as its child (signals sent to the container reach the runner, which passes SIGTERM
/// on). Without a download, the runner must be at `options.runner_path` in the image. The image
/// needs `sh` (and `sha256sum` to download): an image without them is run without the runner
/// (the Pod's `cloud.aibrix.ai/runner: "false"`).
///
/// The token and the credential are in the returned environment, not in the command.
pub fn render_container_start(
    callback_url: &str,
    ca_pem: &str,
    token: &BootstrapToken,
    credential: &Secret,
    options: &UserDataOptions,
) -> (Vec<String>, Vec<(String, String)>) {
    let mut lines = vec!["set -e".to_owned()];
    let path = match &options.download {
        Some(download) => {
            let (p, url) = (quote(CONTAINER_RUNNER_PATH), quote(&download.url));
            let line = quote(&format!("{}  {CONTAINER_RUNNER_PATH}", download.sha256));
            lines.push(format!(
                "if command -v curl >/dev/null 2>&1; then curl -fsSL -o {p} -- {url}; \
                 elif command -v wget >/dev/null 2>&1; then wget -q -O {p} -- {url}; \
                 elif command -v python3 >/dev/null 2>&1; then python3 -c \
                 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
                 {url} {p}; \
                 else echo 'neocloud: the image has no curl, wget or python3 to fetch the runner' >&2; \
                 exit 127; fi"
            ));
            lines.push(format!("printf '%s\\n' {line} | sha256sum -c - >/dev/null"));
            lines.push(format!("chmod 0755 {p}"));
            CONTAINER_RUNNER_PATH.to_owned()
        }
        None => options.runner_path.clone(),
    };
    // No `--network`: the process executor has no container network.
    let start = runner_argv(
        path,
        callback_url,
        ca_pem,
        ExecutorKind::Process,
        None,
        options.heartbeat_interval,
    );
    let words: Vec<String> = start.iter().map(|w| quote(w)).collect();
    lines.push(format!("exec {}", words.join(" ")));
    let command = vec!["sh".to_owned(), "-c".to_owned(), lines.join("\n")];
    let env = vec![
        (BOOTSTRAP_TOKEN_ENV.to_owned(), token.expose().to_owned()),
        (CREDENTIAL_ENV.to_owned(), credential.expose().to_owned()),
    ];
    (command, env)
}

/// `text` as one POSIX shell word. A NUL byte, which no shell word can hold, quotes as empty
/// (the step then fails instead of running something else).
fn quote(text: &str) -> String {
    shlex::try_quote(text).map_or_else(|_| "''".to_owned(), |q| q.into_owned())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn user_data_is_cloud_config_that_starts_the_runner() {
        let token = Secret::new("tok_abc");
        let text = render_user_data(
            "https://10.0.0.1:8443",
            "PEM",
            &token,
            &Secret::new("ncr1:k:u:m"),
            &UserDataOptions::default(),
        );
        assert!(text.starts_with("#cloud-config\n"));
        let parsed: serde_yaml::Value = serde_yaml::from_str(&text).expect("yaml");
        let start: Vec<String> = serde_yaml::from_value(parsed["runcmd"][0].clone()).expect("argv");
        let at = start
            .iter()
            .position(|a| a == DEFAULT_RUNNER_PATH)
            .expect("runner path");
        // The secrets are in the unit's environment, not on the runner's command line.
        let setenv = |name: &str| {
            start[..at]
                .iter()
                .find_map(|w| w.strip_prefix(&format!("--setenv={name}=")))
                .expect("setenv")
                .to_owned()
        };
        let (tok, cred) = (setenv(BOOTSTRAP_TOKEN_ENV), setenv(CREDENTIAL_ENV));
        assert!(
            !start[at..]
                .iter()
                .any(|w| w.contains("tok_abc") || w.contains("ncr1"))
        );
        // The runner's own parser reads what the node wrote (the environment given as its
        // flags, which it reads the same way): the two cannot drift apart.
        let mut argv = start[at..].to_vec();
        argv.extend(["--bootstrap-token".into(), tok, "--credential".into(), cred]);
        let args = neocloud_runner::RunnerArgs::try_parse_from(&argv).expect("runner args");
        assert_eq!(args.callback_url, "https://10.0.0.1:8443");
        assert_eq!(args.bootstrap_token, "tok_abc");
        assert_eq!(args.credential.as_deref(), Some("ncr1:k:u:m"));
        assert_eq!(args.ca_pem_base64, Some(STANDARD.encode("PEM")));
        assert_eq!(args.executor, ExecutorKind::Docker);
        assert_eq!(args.network, "host");
        assert_eq!(args.heartbeat_interval, Duration::from_secs(15));
    }

    /// The user_data rendered for a runner at `path` downloaded from `url`, parsed.
    fn with_download(path: &str, url: &str) -> serde_yaml::Value {
        let options = UserDataOptions {
            runner_path: path.into(),
            download: Some(RunnerDownload {
                url: url.into(),
                sha256: "ab".repeat(32),
            }),
            ..UserDataOptions::default()
        };
        let (token, credential) = (Secret::new("t"), Secret::new("c"));
        let text = render_user_data("https://n:1", "PEM", &token, &credential, &options);
        serde_yaml::from_str(&text).expect("yaml")
    }

    #[test]
    fn download_step_checks_the_digest_before_running() {
        let parsed = with_download(DEFAULT_RUNNER_PATH, "https://example.com/neocloud-runner");
        let script = parsed["runcmd"][0][2].as_str().expect("script");
        assert!(script.contains("sha256sum -c"), "{script}");
        assert!(parsed["runcmd"][1][6].as_str() == Some(DEFAULT_RUNNER_PATH));
    }

    #[test]
    fn what_the_download_step_inserts_stays_one_shell_word() {
        let parsed = with_download(
            "/opt/r; touch /tmp/pwned",
            "https://example.com/r?a=1&b=$(id)'",
        );
        let script = parsed["runcmd"][0][2].as_str().expect("script");
        // The shell's own word splitting gives the values back whole.
        let words = shlex::split(script).expect("shell words");
        let at = words.iter().position(|w| w == "-o").expect("-o");
        assert_eq!(words[at + 1], "/opt/r; touch /tmp/pwned", "{script}");
        assert_eq!(words[at + 2], "--");
        assert_eq!(
            words[at + 3],
            "https://example.com/r?a=1&b=$(id)'",
            "{script}"
        );
        assert!(words.contains(&format!("{}  /opt/r; touch /tmp/pwned", "ab".repeat(32))));
        assert_eq!(
            words.last().map(String::as_str),
            Some("/opt/r; touch /tmp/pwned")
        );
    }

    #[test]
    fn a_container_start_command_execs_the_runner_through_a_real_shell() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let runner = dir.path().join("neocloud-runner");
        let out = dir.path().join("argv");
        std::fs::write(
            &runner,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\necho \"token=${BOOTSTRAP_TOKEN_ENV}\" >> '{}'\n",
                out.display(),
                out.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = UserDataOptions {
            runner_path: runner.display().to_string(),
            ..UserDataOptions::default()
        };
        let (command, env) = render_container_start(
            "https://10.0.0.1:8443",
            "PEM",
            &Secret::new("tok_abc"),
            &Secret::new("ncr1:k:u:m"),
            &options,
        );
        assert_eq!(&command[..2], ["sh", "-c"]);
        // The secrets travel in the environment only.
        assert!(
            !command
                .iter()
                .any(|w| w.contains("tok_abc") || w.contains("ncr1"))
        );
        assert_eq!(
            env,
            [
                (BOOTSTRAP_TOKEN_ENV.to_owned(), "tok_abc".to_owned()),
                (CREDENTIAL_ENV.to_owned(), "ncr1:k:u:m".to_owned())
            ]
        );
        let status = std::process::Command::new(&command[0])
            .args(&command[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .status()
            .unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(&out).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        assert_eq!(lines.pop().as_deref(), Some("token=tok_abc"));
        // What the shell passed is what the runner's own parser accepts, run as a process.
        let mut argv = vec![runner.display().to_string()];
        argv.extend(lines);
        argv.extend(["--bootstrap-token".into(), "tok_abc".into()]);
        let args = neocloud_runner::RunnerArgs::try_parse_from(&argv).expect("runner args");
        assert_eq!(args.callback_url, "https://10.0.0.1:8443");
        assert_eq!(args.ca_pem_base64, Some(STANDARD.encode("PEM")));
        assert_eq!(args.executor, ExecutorKind::Process);
    }

    #[test]
    fn a_container_download_is_verified_before_the_runner_is_executed() {
        let options = UserDataOptions {
            download: Some(RunnerDownload {
                url: "https://example.com/r?a=1&b=$(id)'".into(),
                sha256: "ab".repeat(32),
            }),
            ..UserDataOptions::default()
        };
        let (command, _) = render_container_start(
            "https://n:1",
            "PEM",
            &Secret::new("t"),
            &Secret::new("c"),
            &options,
        );
        let script = &command[2];
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(lines[0], "set -e");
        assert!(
            lines[1].contains("curl -fsSL -o /tmp/neocloud-runner -- "),
            "{script}"
        );
        assert!(
            lines[1].contains("wget -q -O") && lines[1].contains("python3"),
            "{script}"
        );
        // The URL stays one word, unexpanded.
        let words = shlex::split(lines[1]).expect("shell words");
        assert!(
            words.contains(&"https://example.com/r?a=1&b=$(id)'".to_owned()),
            "{words:?}"
        );
        assert!(lines[2].contains("sha256sum -c"), "{script}");
        assert!(lines[2].contains(&"ab".repeat(32)), "{script}");
        let exec = shlex::split(lines.last().unwrap()).unwrap();
        assert_eq!(&exec[..2], ["exec", CONTAINER_RUNNER_PATH]);
    }
}
