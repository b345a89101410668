//! How the runner runs a workload: as a local process (tests and simulators), or as a Docker
//! container with the VM's GPUs (`docker run --rm --gpus=all --network=<mode>`, host by
//! default) whose environment is passed through an env file of mode 0600, never on the command
//! line. Either way stdout and stderr are read line
//! by line into [`LogRecord`]s.
//!
//! Not log shipping or state reports: see [`crate::run`].

use std::path::{Path, PathBuf};
use std::process::Stdio;

use chrono::Utc;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use neocloud_protocol::{
    BOOTSTRAP_TOKEN_ENV, CREDENTIAL_ENV, ExecutorKind, LogRecord, LogStream, Workload,
};

use crate::RunnerError;

/// A log line longer than this is split into several records.
const MAX_LINE: usize = 16 * 1024;

/// A started workload.
#[derive(Debug)]
pub struct Started {
    /// The process (the workload itself, or the `docker run` client).
    pub child: Child,
    /// Deleted when dropped.
    pub env_file: Option<EnvFile>,
}

/// How the docker executor runs the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerOptions {
    /// The network mode (`docker run --network`).
    pub network: String,
    /// The GPUs (`docker run --gpus`: `all`, a count, `device=0,1`); `None` gives none, for a
    /// machine without NVIDIA's container toolkit.
    pub gpus: Option<String>,
    /// The workload's file directories the runner wrote, bind-mounted read-only at their mount
    /// paths: `(directory, mount path)` (see `crate::files`).
    pub mounts: Vec<(PathBuf, String)>,
    /// Names that resolve to the machine's loopback in the container (`--add-host`): the
    /// egress destinations' cluster names (see `crate::egress`).
    pub loopback_hosts: Vec<String>,
}

/// Starts run `run` of `workload` (0, then one more per restart in place); its output lines go
/// to `logs` marked with the run (dropped, and counted, when it is full).
/// `docker` says how a container runs and `container` is its name (sessions `docker exec` into
/// it); both unused by processes.
pub fn start(
    kind: ExecutorKind,
    workload: &Workload,
    docker: &DockerOptions,
    container: &str,
    logs: &mpsc::Sender<LogRecord>,
    run: u32,
) -> Result<Started, RunnerError> {
    let (mut command, env_file) = match kind {
        ExecutorKind::Process => (process_command(workload)?, None),
        ExecutorKind::Docker => {
            let env_file = EnvFile::write(workload)?;
            let mut command = Command::new("docker");
            command.args(docker_args(workload, env_file.path(), docker, container));
            (command, Some(env_file))
        }
    };
    command
        .env_remove(BOOTSTRAP_TOKEN_ENV)
        .env_remove(CREDENTIAL_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let program = format!("{:?}", command.as_std().get_program());
    let mut child = command.spawn().map_err(|e| RunnerError::Spawn {
        program: program.clone(),
        message: e.to_string(),
    })?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(pump(out, LogStream::Stdout, logs.clone(), run));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(pump(err, LogStream::Stderr, logs.clone(), run));
    }
    Ok(Started { child, env_file })
}

fn process_command(workload: &Workload) -> Result<Command, RunnerError> {
    let mut argv = workload.command.iter().chain(&workload.args);
    let program = argv.next().ok_or(RunnerError::NoCommand)?;
    let mut command = Command::new(program);
    command.args(argv);
    command.envs(workload.env.iter().map(|v| (&v.name, &v.value)));
    if let Some(dir) = &workload.working_dir {
        command.current_dir(dir);
    }
    Ok(command)
}

/// The name of the workload's container for the binding a session's SPIFFE ID names
/// (`.../binding/{uid}`): `neocloud-{uid}`, with characters Docker refuses in names left out.
pub fn container_name(spiffe_id: &str) -> String {
    let uid = spiffe_id.rsplit('/').next().unwrap_or_default();
    let uid: String = uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    if uid.is_empty() {
        "neocloud-workload".to_owned()
    } else {
        format!("neocloud-{uid}")
    }
}

/// The arguments of `docker` for a workload named `container`; env values are in `env_file`,
/// not here. Like
/// Kubernetes, `command` replaces the image's entrypoint and `args` its cmd. Every option takes
/// its value in the same word (`--workdir=/w`), and `--` ends the options before the image: no
/// value from the Pod can be read by `docker` as an option of its own (an image `--privileged`
/// is an image name docker refuses, not a privileged container).
pub fn docker_args(
    workload: &Workload,
    env_file: &Path,
    docker: &DockerOptions,
    container: &str,
) -> Vec<String> {
    let mut out: Vec<String> = ["run", "--rm"].map(String::from).into();
    if let Some(gpus) = &docker.gpus {
        out.push(format!("--gpus={gpus}"));
    }
    out.push(format!("--name={container}"));
    out.push(format!("--network={}", docker.network));
    for name in &docker.loopback_hosts {
        out.push(format!("--add-host={name}:127.0.0.1"));
    }
    out.push(format!("--env-file={}", env_file.display()));
    if let Some(dir) = &workload.working_dir {
        out.push(format!("--workdir={dir}"));
    }
    for (dir, target) in &docker.mounts {
        out.push(format!(
            "--mount=type=bind,source={},target={target},readonly",
            dir.display()
        ));
    }
    let mut command = workload.command.iter();
    if let Some(entrypoint) = command.next() {
        out.push(format!("--entrypoint={entrypoint}"));
    }
    out.push("--".into());
    out.push(workload.image.clone());
    out.extend(command.cloned());
    out.extend(workload.args.iter().cloned());
    out
}

/// A private (0600) Docker env file, removed when dropped.
#[derive(Debug)]
pub struct EnvFile {
    path: PathBuf,
}

impl EnvFile {
    /// Writes `workload`'s env in Docker's `NAME=value` format to a new 0600 file.
    pub fn write(workload: &Workload) -> Result<Self, RunnerError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut text = String::new();
        for var in &workload.env {
            if var.name.is_empty() || var.name.contains(['=', '\n']) || var.value.contains('\n') {
                return Err(RunnerError::EnvFile(format!(
                    "variable {:?} cannot be written to a Docker env file (no '=' in names, no \
                     newlines)",
                    var.name
                )));
            }
            text.push_str(&format!("{}={}\n", var.name, var.value));
        }
        let name = format!("neocloud-runner-{}.env", uuid::Uuid::new_v4().simple());
        let path = std::env::temp_dir().join(name);
        let fail = |e: std::io::Error| {
            RunnerError::EnvFile(format!("failed to write {}: {e}", path.display()))
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(fail)?;
        let file_guard = Self { path: path.clone() };
        file.write_all(text.as_bytes()).map_err(fail)?;
        Ok(file_guard)
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for EnvFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads `from` line by line (lossy UTF-8, long lines split) into records.
async fn pump(
    from: impl AsyncRead + Unpin,
    stream: LogStream,
    to: mpsc::Sender<LogRecord>,
    run: u32,
) {
    let mut reader = BufReader::new(from);
    let mut dropped = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_line(&mut reader, &mut line).await {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(?stream, error = %e, "runner: failed to read workload output");
                break;
            }
        }
        let record = LogRecord {
            ts: Utc::now(),
            stream,
            line: String::from_utf8_lossy(&line).into_owned(),
            run,
        };
        if to.try_send(record).is_err() {
            dropped += 1;
        }
    }
    if dropped > 0 {
        tracing::warn!(
            ?stream,
            dropped,
            "runner: log lines dropped (callback too slow)"
        );
    }
}

/// Reads one line of at most [`MAX_LINE`] bytes without its newline; false at the end.
async fn read_line(
    reader: &mut BufReader<impl AsyncRead + Unpin>,
    line: &mut Vec<u8>,
) -> std::io::Result<bool> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(!line.is_empty());
        }
        let room = MAX_LINE - line.len();
        let window = &available[..available.len().min(room)];
        if let Some(end) = window.iter().position(|b| *b == b'\n') {
            line.extend_from_slice(&window[..end]);
            reader.consume(end + 1);
            return Ok(true);
        }
        let taken = window.len();
        line.extend_from_slice(window);
        reader.consume(taken);
        if line.len() >= MAX_LINE {
            return Ok(true);
        }
    }
}

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;
