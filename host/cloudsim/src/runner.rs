//! Opt-in (`run_user_data`): the `neocloud-runner` process a real machine would run, started
//! as a local child process once an instance is running and killed with it. Shared by the
//! three simulators; each finds the command in its own place: Lambda in cloud-init `user_data`
//! (`lambda::runner`), RunPod and Vast in the container's start command
//! ([`container_runner_args`]).
//!
//! The runner leads a process group standing in for the VM or container: killing the instance
//! (terminate, stop, preemption, restart, or dropping the simulator) sends the runner SIGTERM,
//! as a container's stop or a VM's shutdown would, and kills the whole group
//! [`STOP_GRACE`] later (at once once the runner has exited).
//! Its stdout is discarded and its stderr logged line by line.
//!
//! Not a shell: a start command is recognised by its shape only, and nothing in it (downloads,
//! variable expansion, redirections) is run or interpreted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Weak;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::oneshot;

use crate::clock::SimClock;
use crate::config::SimConfig;

/// The binary name the runner command starts with.
pub(crate) const RUNNER_BINARY: &str = "neocloud-runner";

/// How long a stopped instance's runner has between SIGTERM and SIGKILL (`docker stop` gives
/// 10 s; the simulator is faster).
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);

/// How soon an instance that is still booting is looked at again.
const RECHECK: Duration = Duration::from_millis(20);

/// The runner's arguments and the environment it starts with.
pub(crate) type RunnerCommand = (Vec<String>, Vec<(String, String)>);

/// Where an instance is, as far as its runner is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Not running yet: the runner waits.
    Booting,
    /// Running: the runner starts.
    Running,
    /// Gone, stopped, preempted or broken: the runner does not start.
    Gone,
}

/// A simulator state that runs runners.
pub(crate) trait RunnerHost: Send + Sync + 'static {
    /// The runners of this simulator.
    fn runners(&self) -> &Runners;
    /// The phase of instance `id` now (`Gone` if unknown).
    fn phase(&self, id: &str) -> Phase;
}

/// What to start for one instance. `Debug` shows the environment's names only (the runner's
/// bootstrap token and credential are there).
#[derive(Clone)]
pub(crate) struct RunnerSpec {
    /// The simulator's name, for logs.
    pub provider: &'static str,
    /// Where the command came from, for logs (`user_data`, `the start command`).
    pub source: &'static str,
    pub binary: PathBuf,
    pub command: RunnerCommand,
}

impl std::fmt::Debug for RunnerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (args, env) = &self.command;
        let env: Vec<String> = env.iter().map(|(k, _)| format!("{k}=<redacted>")).collect();
        f.debug_struct("RunnerSpec")
            .field("provider", &self.provider)
            .field("source", &self.source)
            .field("binary", &self.binary)
            .field("args", args)
            .field("env", &env)
            .finish()
    }
}

/// The binary to run in place of the runner path, if `run_user_data` is on.
pub(crate) fn configured_binary(config: &SimConfig) -> Option<PathBuf> {
    config.run_user_data.then(|| {
        config
            .runner_binary
            .clone()
            .unwrap_or_else(|| RUNNER_BINARY.into())
    })
}

/// How long after creation (or a start) an instance is running.
pub(crate) fn boot_delay(config: &SimConfig) -> Duration {
    let t = config.timing;
    SimClock::ms(t.provisioning_ms + t.starting_ms)
}

/// Whether `word` names the runner binary: exactly `neocloud-runner`, or a path ending in
/// `/neocloud-runner`.
pub(crate) fn is_runner_path(word: &str) -> bool {
    word == RUNNER_BINARY
        || word
            .strip_suffix(RUNNER_BINARY)
            .is_some_and(|dir| dir.ends_with('/'))
}

/// The runner's arguments in a container start command given as one POSIX-shell command line
/// (RunPod's `args` string): see [`container_runner_args`].
pub(crate) fn command_line_runner_args(line: &str) -> Option<Vec<String>> {
    container_runner_args(&shlex::split(line)?)
}

/// The runner's arguments in a container start command given as words (Vast's `args` list):
/// `sh -c SCRIPT` (the shell may be `bash` or a path to either; words after the script are
/// ignored) whose last non-empty line is `exec RUNNER ARGS…` (or `RUNNER ARGS…`), where
/// RUNNER is a path ending in `/neocloud-runner` (or exactly `neocloud-runner`), the line in
/// shell words. Earlier lines, such as downloading and verifying the runner, are ignored.
/// `None` for any other command.
pub(crate) fn container_runner_args(argv: &[String]) -> Option<Vec<String>> {
    let [shell, flag, script, ..] = argv else {
        return None;
    };
    let shell = Path::new(shell).file_name()?;
    if !(shell == "sh" || shell == "bash") || flag != "-c" {
        return None;
    }
    let line = script.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    let words = shlex::split(line)?;
    let words = match words.split_first() {
        Some((exec, rest)) if exec == "exec" => rest,
        _ => &words[..],
    };
    let (binary, args) = words.split_first()?;
    let mut args = args.to_vec();
    // The script's earlier lines move the secrets from the environment into this file; here
    // they stay in the environment the runner is given.
    take_secrets_file(&mut args);
    is_runner_path(binary).then_some(args)
}

/// Drops `--secrets-file PATH` (or `--secrets-file=PATH`) from a runner's arguments and returns
/// PATH. The simulator runs neither the shell lines nor the cloud-init step that write that file
/// (nor could it write a VM's `/run`), so it hands the runner the secrets as environment
/// instead: the older way, which the runner still accepts.
pub(crate) fn take_secrets_file(args: &mut Vec<String>) -> Option<String> {
    let at = args
        .iter()
        .position(|a| a == "--secrets-file" || a.starts_with("--secrets-file="))?;
    let word = args.remove(at);
    match word.strip_prefix("--secrets-file=") {
        Some(path) => Some(path.to_owned()),
        None => (at < args.len()).then(|| args.remove(at)),
    }
}

/// The runner processes of running instances, by instance id, and the runners waiting for their
/// instance to run. Killing an instance's runner kills its process group.
///
/// Lock order: nothing here holds this lock while asking the host for a phase, so hosts may
/// call [`kill`](Self::kill) and [`schedule`](Self::schedule) while holding their own locks.
#[derive(Debug, Default)]
pub(crate) struct Runners {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Started runners; dropping a sender kills its process group.
    live: HashMap<String, oneshot::Sender<()>>,
    /// The generation of each instance's pending start; a newer schedule supersedes it.
    scheduled: HashMap<String, u64>,
    generations: u64,
    /// How many kills so far: a start that races one looks at the instance again.
    kills: u64,
    /// After [`Runners::shutdown`], nothing starts.
    closed: bool,
}

impl Runners {
    /// Kills the runner of `id`, if any. Idempotent. A pending start is left to find the
    /// instance gone (or booting again) when it looks.
    pub fn kill(&self, id: &str) {
        let mut inner = self.inner.lock();
        inner.kills += 1;
        inner.live.remove(id);
    }

    /// Kills every runner and starts no more (the simulator is going away).
    pub fn shutdown(&self) {
        let mut inner = self.inner.lock();
        inner.closed = true;
        inner.scheduled.clear();
        inner.live.clear();
    }

    /// After `boot`, starts `spec` for `id` once the instance is running (polling while it
    /// boots), unless it is gone first or a newer schedule for `id` supersedes this one.
    pub fn schedule<H: RunnerHost>(
        &self,
        host: Weak<H>,
        id: String,
        spec: RunnerSpec,
        boot: Duration,
    ) {
        let generation = {
            let mut inner = self.inner.lock();
            if inner.closed {
                return;
            }
            inner.generations += 1;
            let generation = inner.generations;
            inner.scheduled.insert(id.clone(), generation);
            generation
        };
        tokio::spawn(async move {
            let mut wait = boot;
            loop {
                tokio::time::sleep(wait).await;
                let Some(host) = host.upgrade() else {
                    return;
                };
                let runners = host.runners();
                let Some(kills) = runners.pending(&id, generation) else {
                    return;
                };
                match host.phase(&id) {
                    Phase::Running => {}
                    // The sleep can end a hair before the simulator's own clock says running.
                    Phase::Booting => {
                        wait = RECHECK;
                        continue;
                    }
                    Phase::Gone => {
                        runners.unschedule(&id, generation);
                        return;
                    }
                }
                let mut inner = runners.inner.lock();
                if inner.scheduled.get(&id) != Some(&generation) {
                    return;
                }
                if inner.kills != kills {
                    // A kill came between the look and now: its state change may be missed.
                    wait = Duration::ZERO;
                    continue;
                }
                inner.scheduled.remove(&id);
                match spawn(&id, &spec) {
                    Ok(kill) => {
                        inner.live.insert(id, kill);
                    }
                    Err(e) => tracing::warn!(instance = %id, binary = %spec.binary.display(),
                        error = %e, "{} sim: failed to start the runner from {}",
                        spec.provider, spec.source),
                }
                return;
            }
        });
    }

    /// The kill count, if `generation` is still the pending start of `id`.
    fn pending(&self, id: &str, generation: u64) -> Option<u64> {
        let inner = self.inner.lock();
        (inner.scheduled.get(id) == Some(&generation)).then_some(inner.kills)
    }

    fn unschedule(&self, id: &str, generation: u64) {
        let mut inner = self.inner.lock();
        if inner.scheduled.get(id) == Some(&generation) {
            inner.scheduled.remove(id);
        }
    }
}

fn spawn(id: &str, spec: &RunnerSpec) -> std::io::Result<oneshot::Sender<()>> {
    let (args, env) = &spec.command;
    let (provider, source) = (spec.provider, spec.source);
    // The runner leads a process group standing in for the VM: killing the instance kills the
    // group, so the workload dies with its VM even when the runner died first.
    let mut child = Command::new(&spec.binary)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    tracing::info!(instance = %id, pid = ?child.id(), "{provider} sim: started the runner from {source}");
    let id = id.to_string();
    if let Some(stderr) = child.stderr.take() {
        let id = id.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(instance = %id, "runner: {line}");
            }
        });
    }
    let (kill, mut killed) = oneshot::channel::<()>();
    tokio::spawn(async move {
        // Also dropped with the task when the simulator's runtime stops (a test ending): the
        // group goes then too, not only the runner that `kill_on_drop` kills.
        let group_guard = KillGroupOnDrop(group);
        tokio::select! {
            status = child.wait() => {
                tracing::info!(instance = %id, ?status, "{provider} sim: runner exited");
                // What the runner started may outlive it until the VM goes.
                let _ = (&mut killed).await;
            }
            _ = &mut killed => {
                // SIGTERM first, to the runner alone (a container's main process; it passes
                // the signal on to the workload), then the group after the grace.
                if let Some(pid) = group {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                let _ = tokio::time::timeout(STOP_GRACE, child.wait()).await;
            }
        }
        drop(group_guard);
        let _ = child.kill().await;
        tracing::info!(instance = %id, "{provider} sim: the instance's processes killed with it");
    });
    Ok(kill)
}

/// Kills a runner's process group (the VM or container it stands for) when dropped.
struct KillGroupOnDrop(Option<i32>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| (*w).to_owned()).collect()
    }

    /// A start command as the node writes it: `sh -c SCRIPT`, quoted with shlex.
    fn command_line(script: &str) -> String {
        shlex::try_join(["sh", "-c", script]).unwrap()
    }

    const DOWNLOAD: &str = "set -eu\ncurl -fsSL -o /usr/local/bin/neocloud-runner https://n:1/runner\n\
                            echo 'abc  /usr/local/bin/neocloud-runner' | sha256sum -c -\n\
                            chmod 0755 /usr/local/bin/neocloud-runner\n";

    #[test]
    fn debug_of_a_runner_spec_and_a_sim_config_hides_tokens_and_keys() {
        let spec = RunnerSpec {
            provider: "runpod",
            source: "the start command",
            binary: "/bin/neocloud-runner".into(),
            command: (
                words(&["--callback-url", "https://n:1"]),
                vec![("NEOCLOUD_BOOTSTRAP_TOKEN".into(), "bt-secret".into())],
            ),
        };
        let shown = format!("{spec:?}");
        assert!(
            shown.contains("NEOCLOUD_BOOTSTRAP_TOKEN=<redacted>"),
            "{shown}"
        );
        assert!(!shown.contains("bt-secret"), "{shown}");
        let config = SimConfig {
            api_key: "sk-secret".into(),
            ..SimConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(shown.contains("api_key: \"<redacted>\"") && !shown.contains("sk-secret"));
    }

    #[test]
    fn a_runpod_command_line_yields_the_words_after_the_runner_of_its_last_line() {
        let script = format!(
            "{DOWNLOAD}exec /usr/local/bin/neocloud-runner --callback-url 'https://node:8443' \
             --name 'a b'\n\n"
        );
        assert_eq!(
            command_line_runner_args(&command_line(&script)),
            Some(words(&[
                "--callback-url",
                "https://node:8443",
                "--name",
                "a b"
            ]))
        );
    }

    #[test]
    fn quoted_runner_paths_and_arguments_with_spaces_are_shell_words() {
        let script = "exec '/opt/my dir/neocloud-runner' --label \"x y\" 'it'\"'\"'s'";
        assert_eq!(
            command_line_runner_args(&command_line(script)),
            Some(words(&["--label", "x y", "it's"]))
        );
        assert_eq!(
            container_runner_args(&words(&["/bin/sh", "-c", "neocloud-runner"])),
            Some(vec![])
        );
    }

    #[test]
    fn a_vast_args_list_yields_the_words_after_the_runner_of_its_last_line() {
        let script = format!("{DOWNLOAD}exec /usr/local/bin/neocloud-runner --executor process");
        assert_eq!(
            container_runner_args(&words(&["sh", "-c", &script])),
            Some(words(&["--executor", "process"]))
        );
    }

    #[test]
    fn the_secrets_file_the_script_would_write_is_left_out_of_the_runner_s_arguments() {
        let script = "(umask 077; printf '%s' x > /tmp/s)\nunset T\n\
                      exec neocloud-runner --executor process --secrets-file /tmp/s";
        assert_eq!(
            container_runner_args(&words(&["sh", "-c", script])),
            Some(words(&["--executor", "process"]))
        );
        let mut args = words(&["--secrets-file=/p", "--x"]);
        assert_eq!(take_secrets_file(&mut args).as_deref(), Some("/p"));
        assert_eq!(args, words(&["--x"]));
    }

    #[test]
    fn other_commands_yield_nothing() {
        let none = |argv: &[&str]| container_runner_args(&words(argv));
        assert_eq!(none(&["python", "train.py"]), None);
        assert_eq!(none(&["sh", "-c", "exec sleep infinity"]), None);
        assert_eq!(none(&["sh", "-c", ""]), None);
        assert_eq!(none(&["sh", "-x", "exec neocloud-runner"]), None);
        assert_eq!(none(&["neocloud-runner", "--executor", "process"]), None);
        // The runner must be the last line's command, not something mentioned before it.
        assert_eq!(
            none(&["sh", "-c", "exec neocloud-runner\nexec sleep 1"]),
            None
        );
        assert_eq!(
            none(&["sh", "-c", "cp /tmp/neocloud-runner /usr/local/bin"]),
            None
        );
        assert_eq!(none(&["sh", "-c", "exec /opt/not-neocloud-runner"]), None);
        assert_eq!(command_line_runner_args("python -m http.server"), None);
        assert_eq!(command_line_runner_args("sh -c 'unterminated"), None);
        assert_eq!(command_line_runner_args(""), None);
    }
}
