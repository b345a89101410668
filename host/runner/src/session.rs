//! Sessions the node opens through the runner (`kubectl exec`, `kubectl port-forward`): a loop
//! that long-polls the callback for offers ([`serve_sessions`]) and, for each, dials back and
//! serves the session on that connection of its own ([`serve_session`]): a command beside the
//! workload ([`exec`]) or a TCP connection to the workload's loopback ([`forward`]).
//!
//! Not the frames' encoding (`neocloud_protocol::session`) nor the node's side of them.

mod exec;
mod pty;

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use neocloud_protocol::session::{
    Frame, FrameError, FrameWriter, SessionOffer, SessionRequest, frame_reader, frame_writer,
};
use neocloud_protocol::{BOOTSTRAP_TOKEN_ENV, CREDENTIAL_ENV, ExecutorKind, Workload};

use crate::CallbackClient;

/// The longest pause between failed polls.
const MAX_POLL_BACKOFF: Duration = Duration::from_secs(10);
/// Bytes read from a command or socket at a time (one frame at most).
const CHUNK: usize = 32 * 1024;

/// Where exec'd commands run: beside the workload process, or inside its container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecTarget {
    /// As a process with the workload's environment and working directory.
    Process {
        /// The workload's environment (on top of the runner's, less its secrets).
        env: Vec<(String, String)>,
        /// The workload's working directory.
        working_dir: Option<String>,
    },
    /// `docker exec` in the workload's container.
    Docker {
        /// The container's name.
        container: String,
    },
}

impl ExecTarget {
    /// The target for `workload` run by `kind` (in the container named `container`, for
    /// docker).
    pub fn for_workload(kind: ExecutorKind, workload: &Workload, container: &str) -> Self {
        match kind {
            ExecutorKind::Process => Self::Process {
                env: (workload.env.iter())
                    .map(|v| (v.name.clone(), v.value.clone()))
                    .collect(),
                working_dir: workload.working_dir.clone(),
            },
            ExecutorKind::Docker => Self::Docker {
                container: container.to_owned(),
            },
        }
    }

    /// The command running `argv` (exactly those words, no shell) here; stdio is the caller's.
    pub(crate) fn command(
        &self,
        argv: &[String],
        tty: bool,
        stdin: bool,
    ) -> Result<Command, String> {
        let Some((program, args)) = argv.split_first() else {
            return Err("failed to start the command: it is empty".to_owned());
        };
        let mut command = match self {
            Self::Process { env, working_dir } => {
                let mut command = Command::new(program);
                command.args(args);
                if tty && !env.iter().any(|(name, _)| name == "TERM") {
                    command.env("TERM", "xterm");
                }
                command.envs(env.iter().map(|(name, value)| (name, value)));
                if let Some(dir) = working_dir {
                    command.current_dir(dir);
                }
                command
            }
            Self::Docker { container } => {
                let mut command = Command::new("docker");
                command.arg("exec");
                if stdin {
                    command.arg("--interactive");
                }
                if tty {
                    command.arg("--tty");
                }
                // `docker exec` reads no option after the container's name.
                command.arg(container).args(argv);
                command
            }
        };
        command
            .env_remove(BOOTSTRAP_TOKEN_ENV)
            .env_remove(CREDENTIAL_ENV)
            .kill_on_drop(true);
        Ok(command)
    }
}

/// Polls the callback for session offers and serves each on its own connection, forever;
/// dropping (aborting) the future ends every session it serves, killing their commands. A 204
/// polls again at once; a failed poll is tried again after a pause growing to 10 s.
pub async fn serve_sessions(client: Arc<CallbackClient>, target: Arc<ExecTarget>) {
    let mut sessions = JoinSet::new();
    let mut backoff = Duration::from_millis(250);
    loop {
        while sessions.try_join_next().is_some() {}
        match client.next_session().await {
            Ok(Some(offer)) => {
                backoff = Duration::from_millis(250);
                sessions.spawn(open(client.clone(), target.clone(), offer));
            }
            Ok(None) => backoff = Duration::from_millis(250),
            Err(e) => {
                tracing::warn!(error = %e, "runner: polling for sessions failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_POLL_BACKOFF);
            }
        }
    }
}

async fn open(client: Arc<CallbackClient>, target: Arc<ExecTarget>, offer: SessionOffer) {
    let io = match client.open_session(&offer.id).await {
        Ok(io) => io,
        Err(e) => {
            tracing::warn!(session = %offer.id, error = %e, "runner: failed to open a session");
            return;
        }
    };
    tracing::info!(session = %offer.id, request = ?offer.request, "runner: session opened");
    serve_session(io, offer.request, &target).await;
    tracing::info!(session = %offer.id, "runner: session ended");
}

/// Serves one session on `io` until it ends: runs the command, or forwards the port.
pub async fn serve_session<S>(io: S, request: SessionRequest, target: &ExecTarget)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    match request {
        SessionRequest::Exec {
            command,
            tty,
            stdin,
        } => exec::exec(io, target, &command, tty, stdin).await,
        SessionRequest::PortForward { port } => forward(io, port).await,
    }
}

/// Reads `io`'s frames into a channel, in a task, until the connection ends (the channel then
/// closes).
fn frames<R>(reader: R) -> (mpsc::Receiver<Frame>, tokio::task::JoinHandle<()>)
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    let mut reader = frame_reader(reader);
    let task = tokio::spawn(async move {
        while let Some(frame) = reader.next().await {
            match frame {
                Ok(frame) => {
                    if tx.send(frame).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "runner: session connection ended");
                    return;
                }
            }
        }
    });
    (rx, task)
}

/// Connects to `127.0.0.1:{port}` and copies bytes both ways: `Data` frames to the socket,
/// the socket's bytes to `Data` frames; `DataEnd` half-closes either way. Ends when both ways
/// are closed, or the session's connection is. A port that cannot be reached is an `Error`.
pub async fn forward<S>(io: S, port: u16)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (reader, writer) = tokio::io::split(io);
    let mut writer = frame_writer(writer);
    let socket = match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(socket) => socket,
        Err(e) => {
            let message = format!("dial tcp 127.0.0.1:{port}: {}", dial_error(&e));
            let _ = writer.send(Frame::Error(message)).await;
            let _ = writer.close().await;
            return;
        }
    };
    let (mut from_node, reading) = frames(reader);
    if let Err(e) = copy_both_ways(socket, &mut from_node, &mut writer).await {
        tracing::debug!(port, error = %e, "runner: port-forward ended");
    }
    reading.abort();
    let _ = writer.close().await;
}

async fn copy_both_ways<W: AsyncWrite + Unpin>(
    socket: TcpStream,
    from_node: &mut mpsc::Receiver<Frame>,
    writer: &mut FrameWriter<W>,
) -> Result<(), FrameError> {
    let (mut socket_in, mut socket_out) = socket.into_split();
    let mut buf = vec![0u8; CHUNK];
    let (mut node_ended, mut socket_ended) = (false, false);
    while !(node_ended && socket_ended) {
        tokio::select! {
            frame = from_node.recv() => match frame {
                Some(Frame::Data(bytes)) => socket_out.write_all(&bytes).await?,
                Some(Frame::DataEnd) => {
                    node_ended = true;
                    socket_out.shutdown().await?;
                }
                Some(_) => {}
                None => return Ok(()),
            },
            read = socket_in.read(&mut buf), if !socket_ended => match read {
                Ok(0) => {
                    socket_ended = true;
                    writer.send(Frame::DataEnd).await?;
                }
                Ok(n) => writer.send(Frame::Data(buf[..n].to_vec())).await?,
                Err(e) => {
                    writer.send(Frame::Error(format!("read from the forwarded port: {e}"))).await?;
                    return Ok(());
                }
            },
        }
    }
    Ok(())
}

/// The reason of a failed connect, in the words `kubectl` users know from Go.
fn dial_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
