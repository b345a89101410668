//! The cloud-init `user_data` that starts the runner on a rented VM.
//!
//! It carries the callback URL, the certificate to trust, the rental's bootstrap token and its
//! boot credential. The token is one-time and expires with the boot timeout (and the time
//! renting may take). The credential lets the runner get a session from whichever replica leads
//! if the node restarted before the token was used; it names this rental of this binding,
//! expires with the token, and is spent once the runner has called in (from then on the runner
//! renews with the credential it was handed with its session, which lives in its memory only).
//! So whoever reads this `user_data` later (the cloud's metadata service, a console, a
//! snapshot, cloud-init's copy on the VM) gets nothing usable, and the runner of a rental that
//! was replaced is refused whatever it holds.
//!
//! Both reach the runner in a secrets file of mode 0600 that it reads and deletes at start
//! (its `--secrets-file`): not on its command line (the VM's process list), not in its
//! environment (its `/proc/<pid>/environ`, which a process workload of the same user can read,
//! or a transient unit's `Environment=`, which `systemctl show` prints to anyone). On a VM,
//! cloud-init writes the file (`write_files`, root, 0600, under `/run`); in a container, where
//! the provider can only pass environment, the start command moves them from its environment
//! into the file and unsets them before it `exec`s the runner.
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

/// Where cloud-init writes the runner's secrets file on a VM (`/run` is a tmpfs: never on disk).
pub const VM_SECRETS_FILE: &str = "/run/neocloud-runner/secrets";
/// Where a container's start command writes it.
pub const CONTAINER_SECRETS_FILE: &str = "/tmp/.neocloud-runner-secrets";

#[derive(Serialize)]
struct CloudConfig {
    write_files: Vec<WriteFile>,
    runcmd: Vec<Vec<String>>,
}

#[derive(Serialize)]
struct WriteFile {
    path: String,
    owner: String,
    permissions: String,
    content: String,
}

/// The secrets file's content: `NAME=value` lines.
fn secrets(token: &BootstrapToken, credential: &Secret) -> String {
    format!(
        "{BOOTSTRAP_TOKEN_ENV}={}\n{CREDENTIAL_ENV}={}\n",
        token.expose(),
        credential.expose()
    )
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
    // The token and the credential reach the runner in a file it reads and deletes: not on its
    // command line (the process list), not in its unit's environment (`systemctl show`) or its
    // own (`/proc/<pid>/environ`). Only the file's path is on the command line.
    let mut start: Vec<String> = [
        "systemd-run",
        "--unit=neocloud-runner",
        "--collect",
        "--quiet",
    ]
    .map(String::from)
    .into();
    start.extend(runner_argv(
        path,
        callback_url,
        ca_pem,
        options.executor,
        Some(&options.network),
        options.heartbeat_interval,
    ));
    start.extend(["--secrets-file".to_owned(), VM_SECRETS_FILE.to_owned()]);
    runcmd.push(start);
    let write_files = vec![WriteFile {
        path: VM_SECRETS_FILE.to_owned(),
        owner: "root:root".to_owned(),
        permissions: "0600".to_owned(),
        content: secrets(token, credential),
    }];
    let config = CloudConfig {
        write_files,
        runcmd,
    };
    let yaml = serde_yaml::to_string(&config).unwrap_or_default();
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
/// The token and the credential are in the returned environment, not in the command; the
/// script writes them into [`CONTAINER_SECRETS_FILE`] (mode 0600) and unsets them before it
/// `exec`s the runner, so the runner's (the container's main process's) environment, which the
/// workload could read in `/proc/1/environ`, holds neither.
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
    // `printf` is a builtin of every `sh`: the values are on no process's command line.
    let file = quote(CONTAINER_SECRETS_FILE);
    lines.push(format!(
        "(umask 077; rm -f {file}; printf '%s=%s\\n' {BOOTSTRAP_TOKEN_ENV} \"${BOOTSTRAP_TOKEN_ENV}\" \
         {CREDENTIAL_ENV} \"${{{CREDENTIAL_ENV}-}}\" > {file})"
    ));
    lines.push(format!("unset {BOOTSTRAP_TOKEN_ENV} {CREDENTIAL_ENV}"));
    lines.push(format!("exec {} --secrets-file {file}", words.join(" ")));
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
            &Secret::new("ncr2:k:u:1:b:2:m"),
            &UserDataOptions::default(),
        );
        assert!(text.starts_with("#cloud-config\n"));
        let parsed: serde_yaml::Value = serde_yaml::from_str(&text).expect("yaml");
        let start: Vec<String> = serde_yaml::from_value(parsed["runcmd"][0].clone()).expect("argv");
        let at = start
            .iter()
            .position(|a| a == DEFAULT_RUNNER_PATH)
            .expect("runner path");
        // The secrets are in a root-only file, not on the command line nor in the unit's
        // environment (`systemctl show` prints it to anyone).
        assert!(
            !start
                .iter()
                .any(|w| w.contains("tok_abc") || w.contains("ncr2") || w.contains("--setenv")),
            "{start:?}"
        );
        let file = &parsed["write_files"][0];
        assert_eq!(file["path"].as_str(), Some(VM_SECRETS_FILE));
        assert_eq!(file["permissions"].as_str(), Some("0600"));
        assert_eq!(file["owner"].as_str(), Some("root:root"));
        assert_eq!(
            file["content"].as_str(),
            Some(
                format!("{BOOTSTRAP_TOKEN_ENV}=tok_abc\n{CREDENTIAL_ENV}=ncr2:k:u:1:b:2:m\n")
                    .as_str()
            )
        );
        // The runner's own parser reads what the node wrote: the two cannot drift apart.
        let args = neocloud_runner::RunnerArgs::try_parse_from(&start[at..]).expect("runner args");
        assert_eq!(args.callback_url, "https://10.0.0.1:8443");
        assert_eq!(
            args.secrets_file.as_deref(),
            Some(std::path::Path::new(VM_SECRETS_FILE))
        );
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
        assert!(parsed["runcmd"][1][4].as_str() == Some(DEFAULT_RUNNER_PATH));
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
    fn a_container_start_command_moves_the_secrets_into_a_file_before_it_execs_the_runner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let runner = dir.path().join("neocloud-runner");
        let out = dir.path().join("argv");
        // The stand-in runner writes its arguments, what its environment says of the secrets,
        // and the secrets file's mode and content (the real runner reads and deletes it).
        let o = out.display();
        std::fs::write(
            &runner,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{o}'\n\
                 env | grep -c -e ^{BOOTSTRAP_TOKEN_ENV}= -e ^{CREDENTIAL_ENV}= >> '{o}' || true\n\
                 stat -c '%a' {CONTAINER_SECRETS_FILE} >> '{o}'\n\
                 cat {CONTAINER_SECRETS_FILE} >> '{o}'\n"
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
            &Secret::new("ncr2:k:u:1:b:2:m"),
            &options,
        );
        assert_eq!(&command[..2], ["sh", "-c"]);
        // The secrets travel in the container's environment only, never in its command.
        assert!(
            !command
                .iter()
                .any(|w| w.contains("tok_abc") || w.contains("ncr2"))
        );
        assert_eq!(
            env,
            [
                (BOOTSTRAP_TOKEN_ENV.to_owned(), "tok_abc".to_owned()),
                (CREDENTIAL_ENV.to_owned(), "ncr2:k:u:1:b:2:m".to_owned())
            ]
        );
        let status = std::process::Command::new(&command[0])
            .args(&command[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .status()
            .unwrap();
        assert!(status.success());
        let _ = std::fs::remove_file(CONTAINER_SECRETS_FILE);
        let text = std::fs::read_to_string(&out).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let tail = lines.split_off(lines.len() - 4);
        // The runner's environment (its /proc/<pid>/environ) holds no secret; the file does,
        // readable by its owner only.
        assert_eq!(
            tail,
            [
                "0",
                "600",
                &format!("{BOOTSTRAP_TOKEN_ENV}=tok_abc"),
                &format!("{CREDENTIAL_ENV}=ncr2:k:u:1:b:2:m"),
            ]
        );
        // What the shell passed is what the runner's own parser accepts, run as a process.
        let mut argv = vec![runner.display().to_string()];
        argv.extend(lines);
        let args = neocloud_runner::RunnerArgs::try_parse_from(&argv).expect("runner args");
        assert_eq!(args.callback_url, "https://10.0.0.1:8443");
        assert_eq!(
            args.secrets_file.as_deref(),
            Some(std::path::Path::new(CONTAINER_SECRETS_FILE))
        );
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
