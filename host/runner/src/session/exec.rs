//! An exec session: runs a command beside the workload, its stdin fed from `Stdin` frames, its
//! output sent as `Stdout`/`Stderr` frames (one `Stdout` stream from its terminal with a tty),
//! and `Exit` once it has ended and all of its output is sent. A connection that ends first
//! kills the command.
//!
//! Not where the command runs: [`ExecTarget`] says.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use neocloud_protocol::session::{ExitStatus, Frame, FrameError, FrameWriter, frame_writer};

use super::pty::Pty;
use super::{CHUNK, ExecTarget, frames};

/// How long output is still read after the command ended (a process it left behind may hold
/// its output open).
const DRAIN: Duration = Duration::from_secs(2);
/// The terminal's end-of-file character (`VEOF`, ^D): what closing stdin means on a terminal.
const EOT: u8 = 0x04;

/// Where the command's input goes.
enum Input {
    Pipe(Option<ChildStdin>),
    Pty(Arc<Pty>),
}

/// One of the command's outputs, the frame it is sent as, and its buffer.
struct Output {
    source: Source,
    buf: Vec<u8>,
}

enum Source {
    Pipe(Box<dyn AsyncRead + Send + Unpin>, fn(Vec<u8>) -> Frame),
    Pty(Arc<Pty>),
}

impl Output {
    fn new(source: Source) -> Self {
        Self {
            source,
            buf: vec![0u8; CHUNK],
        }
    }

    async fn read(&mut self) -> std::io::Result<usize> {
        match &mut self.source {
            Source::Pipe(reader, _) => reader.read(&mut self.buf).await,
            Source::Pty(pty) => pty.read(&mut self.buf).await,
        }
    }

    /// The frame of the first `n` bytes read.
    fn frame(&self, n: usize) -> Frame {
        let bytes = self.buf[..n].to_vec();
        match &self.source {
            Source::Pipe(_, frame) => frame(bytes),
            Source::Pty(_) => Frame::Stdout(bytes),
        }
    }
}

/// Runs `argv` at `target` for the session on `io`.
pub(super) async fn exec<S>(io: S, target: &ExecTarget, argv: &[String], tty: bool, stdin: bool)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (reader, writer) = tokio::io::split(io);
    let mut writer = frame_writer(writer);
    let spawned = match target.command(argv, tty, stdin) {
        Ok(command) if tty => spawn_tty(command),
        Ok(command) => spawn_piped(command, stdin),
        Err(message) => Err(message),
    };
    let (child, input, outputs) = match spawned {
        Ok(spawned) => spawned,
        Err(message) => {
            let _ = end(&mut writer, None, Some(message)).await;
            return;
        }
    };
    let (from_node, reading) = frames(reader);
    let feeding = tokio::spawn(feed(from_node, input));
    match pump(child, outputs, &mut writer, feeding).await {
        Ok(Some(status)) => {
            let (code, error) = match status {
                Ok(status) => (Some(crate::exit_code(status).0), None),
                Err(e) => (None, Some(format!("failed to wait for the command: {e}"))),
            };
            let _ = end(&mut writer, code, error).await;
        }
        Ok(None) => tracing::debug!("runner: the session ended before its command; killed it"),
        Err(e) => {
            tracing::debug!(error = %e, "runner: session connection failed; killed the command")
        }
    }
    reading.abort();
}

async fn end<W: AsyncWrite + Unpin>(
    writer: &mut FrameWriter<W>,
    exit_code: Option<i32>,
    error: Option<String>,
) -> Result<(), FrameError> {
    writer
        .send(Frame::Exit(ExitStatus { exit_code, error }))
        .await?;
    writer.close().await
}

type Spawned = (Child, Input, Vec<Output>);

fn spawn_piped(mut command: tokio::process::Command, stdin: bool) -> Result<Spawned, String> {
    command
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| failed_to_start(&command, &e))?;
    let mut outputs = Vec::new();
    if let Some(out) = child.stdout.take() {
        outputs.push(Output::new(Source::Pipe(Box::new(out), Frame::Stdout)));
    }
    if let Some(err) = child.stderr.take() {
        outputs.push(Output::new(Source::Pipe(Box::new(err), Frame::Stderr)));
    }
    let input = Input::Pipe(child.stdin.take());
    Ok((child, input, outputs))
}

fn spawn_tty(mut command: tokio::process::Command) -> Result<Spawned, String> {
    let (pty, terminal) = Pty::open().map_err(|e| format!("failed to allocate a terminal: {e}"))?;
    let clone = |fd: &std::os::fd::OwnedFd| {
        fd.try_clone()
            .map_err(|e| format!("failed to allocate a terminal: {e}"))
    };
    command
        .stdout(clone(&terminal)?)
        .stderr(clone(&terminal)?)
        .stdin(terminal);
    super::pty::make_controlling_terminal(&mut command);
    let child = command.spawn().map_err(|e| failed_to_start(&command, &e))?;
    // Our copies of the terminal's end close with the command, so the pty reports its end.
    drop(command);
    let pty = Arc::new(pty);
    Ok((
        child,
        Input::Pty(pty.clone()),
        vec![Output::new(Source::Pty(pty))],
    ))
}

fn failed_to_start(command: &tokio::process::Command, e: &std::io::Error) -> String {
    let program = command.as_std().get_program().to_string_lossy();
    format!("failed to start {program:?}: {e}")
}

/// Applies the node's frames to the command's input until the connection ends.
async fn feed(mut from_node: mpsc::Receiver<Frame>, input: Input) {
    let mut pipe = match input {
        Input::Pipe(pipe) => pipe,
        Input::Pty(pty) => return feed_terminal(from_node, &pty).await,
    };
    while let Some(frame) = from_node.recv().await {
        match frame {
            Frame::Stdin(bytes) => {
                if let Some(stdin) = pipe.as_mut()
                    && stdin.write_all(&bytes).await.is_err()
                {
                    pipe = None;
                }
            }
            Frame::StdinEnd => pipe = None,
            _ => {}
        }
    }
}

async fn feed_terminal(mut from_node: mpsc::Receiver<Frame>, pty: &Pty) {
    while let Some(frame) = from_node.recv().await {
        let done = match frame {
            Frame::Stdin(bytes) => pty.write_all(&bytes).await,
            Frame::StdinEnd => pty.write_all(&[EOT]).await,
            Frame::Resize(size) => pty.resize(size),
            _ => Ok(()),
        };
        if let Err(e) = done {
            tracing::debug!(error = %e, "runner: failed to write to a session's terminal");
        }
    }
}

type Waited = std::io::Result<std::process::ExitStatus>;

/// Sends the command's output until it has ended and its output is read (or [`DRAIN`] after
/// it ended); `None` when the connection ended first (`feeding` finished).
async fn pump<W: AsyncWrite + Unpin>(
    mut child: Child,
    mut outputs: Vec<Output>,
    writer: &mut FrameWriter<W>,
    mut feeding: tokio::task::JoinHandle<()>,
) -> Result<Option<Waited>, FrameError> {
    let mut status = None;
    let mut deadline = tokio::time::Instant::now();
    let mut feeding_done = false;
    while status.is_none() || !outputs.is_empty() {
        tokio::select! {
            _ = &mut feeding, if !feeding_done => {
                feeding_done = true;
                if status.is_none() {
                    let _ = child.start_kill();
                    return Ok(None);
                }
            }
            (index, read) = read_any(&mut outputs), if !outputs.is_empty() => match read {
                Ok(0) | Err(_) => {
                    outputs.swap_remove(index);
                }
                Ok(n) => {
                    writer.send(outputs[index].frame(n)).await?;
                }
            },
            waited = child.wait(), if status.is_none() => {
                status = Some(waited);
                deadline = tokio::time::Instant::now() + DRAIN;
            }
            () = tokio::time::sleep_until(deadline), if status.is_some() => break,
        }
    }
    feeding.abort();
    Ok(status)
}

/// Reads from whichever output has bytes first: its index and what was read.
async fn read_any(outputs: &mut [Output]) -> (usize, std::io::Result<usize>) {
    match outputs {
        [] => std::future::pending().await,
        [one] => (0, one.read().await),
        [a, b, ..] => tokio::select! {
            read = a.read() => (0, read),
            read = b.read() => (1, read),
        },
    }
}
