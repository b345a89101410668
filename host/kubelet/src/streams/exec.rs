//! Exec and attach over SPDY (`remotecommand` v4 and v5): the client opens an `error` stream
//! and one stream per requested channel (`stdin`, `stdout`, `stderr`, and `resize` with a TTY);
//! the node relays them to a runner session (exec) or the workload's output (attach), and ends
//! by writing a `metav1.Status` on the error stream: `Success`, or `Failure` with reason
//! `NonZeroExitCode` and the exit code as the cause, from which `kubectl` takes its own exit code.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use neocloud_protocol::session::{ExitStatus, Frame, FrameWriter, TerminalSize, split_frames};
use neocloud_remote::callback::SessionIo;
use serde_json::json;
use tokio::io::WriteHalf;
use tokio::sync::Mutex;
use tokio::task::JoinSet;

use super::super::spdy::{Connection, StreamReader, StreamWriter};
use super::super::workloads::LogError;
use super::{ExecOptions, STREAM_CREATION_TIMEOUT};

/// The streams of one exec or attach, as the client opened them.
#[derive(Default)]
struct Streams {
    error: Option<StreamWriter>,
    stdin: Option<StreamReader>,
    stdout: Option<StreamWriter>,
    stderr: Option<StreamWriter>,
    resize: Option<StreamReader>,
}

impl Streams {
    fn complete(&self, options: &ExecOptions) -> bool {
        self.error.is_some()
            && (!options.stdin || self.stdin.is_some())
            && (!options.stdout || self.stdout.is_some())
            && (!options.stderr || self.stderr.is_some())
            && (!options.tty || self.resize.is_some())
    }

    /// Finishes the output streams, then writes `status` on the error stream and finishes it.
    async fn end(&self, status: serde_json::Value) {
        for writer in [&self.stdout, &self.stderr].into_iter().flatten() {
            let _ = writer.finish().await;
        }
        if let Some(error) = &self.error {
            let _ = error.write(status.to_string().as_bytes()).await;
            let _ = error.finish().await;
        }
    }
}

/// Accepts the streams `options` asks for, within [`STREAM_CREATION_TIMEOUT`]; `None` when the
/// client went away or did not open them in time (then there is no error stream to tell).
async fn accept_streams(conn: &mut Connection, options: &ExecOptions) -> Option<Streams> {
    let mut streams = Streams::default();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while !streams.complete(options) {
        let stream = tokio::time::timeout_at(deadline, conn.accept())
            .await
            .ok()
            .flatten()?;
        let kind = stream.header("streamtype").unwrap_or_default().to_owned();
        let (reader, writer) = stream.split();
        match kind.as_str() {
            "error" => streams.error = Some(writer),
            "stdin" => streams.stdin = Some(reader),
            "stdout" => streams.stdout = Some(writer),
            "stderr" => streams.stderr = Some(writer),
            "resize" => streams.resize = Some(reader),
            other => {
                tracing::debug!(
                    kind = other,
                    "kubelet: unexpected stream type; resetting it"
                );
                writer.reset().await;
            }
        }
    }
    Some(streams)
}

/// The client's streams and what `open` opens, once both are there; `None` when the client did
/// not open its streams, or (said on the error stream) when opening failed.
async fn start<T>(
    conn: &mut Connection,
    open: Opening<T>,
    options: &ExecOptions,
) -> Option<(Streams, T)> {
    let Some(streams) = accept_streams(conn, options).await else {
        tracing::debug!("kubelet: the client did not open its streams; closing");
        return None;
    };
    match open.await {
        Ok(opened) => Some((streams, opened)),
        Err(e) => {
            streams.end(failure(&e.to_string())).await;
            None
        }
    }
}

/// The status `kubectl` reads at the end of an exec.
pub(crate) fn exit_status(command: &[String], status: &ExitStatus) -> serde_json::Value {
    match (status.exit_code, &status.error) {
        (Some(0), _) => json!({"metadata": {}, "status": "Success"}),
        (Some(code), _) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        (None, error) => failure(error.as_deref().unwrap_or("the command did not run")),
    }
}

/// A `Failure` status with `message`, as the kubelet reports an exec that could not run.
pub(crate) fn failure(message: &str) -> serde_json::Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    })
}

type SessionWriter = Arc<Mutex<FrameWriter<WriteHalf<SessionIo>>>>;

/// What an exec or attach opens once its streams are there.
pub(crate) type Opening<T> = BoxFuture<'static, Result<T, LogError>>;

/// Sends `frame` to the runner; false once the session is gone.
async fn send(writer: &SessionWriter, frame: Frame) -> bool {
    writer.lock().await.send(frame).await.is_ok()
}

/// Copies the caller's stdin into the session, then says it ended.
async fn pump_stdin(mut stdin: StreamReader, writer: SessionWriter) {
    while let Some(bytes) = stdin.read().await {
        for chunk in neocloud_protocol::session::chunks(&bytes) {
            if !send(&writer, Frame::Stdin(chunk.to_vec())).await {
                return;
            }
        }
    }
    send(&writer, Frame::StdinEnd).await;
}

/// The most bytes of an unfinished terminal size kept while waiting for its end; a size is a
/// few dozen bytes.
const MAX_RESIZE_PENDING: usize = 4096;

/// Relays terminal sizes: the stream carries JSON objects `{"Width":..,"Height":..}` back to
/// back.
async fn pump_resize(mut resize: StreamReader, writer: SessionWriter) {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Size {
        width: u16,
        height: u16,
    }
    let mut buffer = Vec::new();
    while let Some(bytes) = resize.read().await {
        buffer.extend_from_slice(&bytes);
        let mut sizes = serde_json::Deserializer::from_slice(&buffer).into_iter::<Size>();
        let mut consumed = 0;
        let mut parsed = Vec::new();
        while let Some(size) = sizes.next() {
            match size {
                Ok(size) => {
                    consumed = sizes.byte_offset();
                    parsed.push(size);
                }
                Err(e) if e.is_eof() => break,
                Err(e) => {
                    tracing::debug!(error = %e, "kubelet: invalid terminal size; ignoring the rest");
                    return;
                }
            }
        }
        buffer.drain(..consumed);
        if buffer.len() > MAX_RESIZE_PENDING {
            tracing::debug!(
                pending = buffer.len(),
                "kubelet: terminal size longer than {MAX_RESIZE_PENDING} bytes; ignoring the rest"
            );
            return;
        }
        for size in parsed {
            let size = TerminalSize {
                width: size.width,
                height: size.height,
            };
            if !send(&writer, Frame::Resize(size)).await {
                return;
            }
        }
    }
}

/// Serves one exec: relays the client's streams to `session` until the command ends, then
/// reports its exit status and closes the connection. A client that goes away ends the session
/// (the runner then kills the command).
pub(crate) async fn serve_exec(
    mut conn: Connection,
    open: Opening<SessionIo>,
    options: ExecOptions,
) {
    let Some((mut streams, session)) = start(&mut conn, open, &options).await else {
        conn.close().await;
        return;
    };
    // Read as frames through one buffer: a read the `select!` below drops loses no byte.
    let (mut from_runner, to_runner) = split_frames(session);
    let to_runner: SessionWriter = Arc::new(Mutex::new(to_runner));
    // Owned here: dropping this future (the server's shutdown) ends them too.
    let mut pumps = JoinSet::new();
    if let Some(stdin) = streams.stdin.take() {
        pumps.spawn(pump_stdin(stdin, to_runner.clone()));
    }
    if let Some(resize) = streams.resize.take() {
        pumps.spawn(pump_resize(resize, to_runner.clone()));
    }
    let status = loop {
        tokio::select! {
            frame = from_runner.next() => match frame {
                Some(Ok(Frame::Stdout(bytes))) => write_to(&streams.stdout, &bytes).await,
                Some(Ok(Frame::Stderr(bytes))) => write_to(&streams.stderr, &bytes).await,
                Some(Ok(Frame::Exit(status))) => break Some(exit_status(&options.command, &status)),
                Some(Ok(Frame::Error(message))) => break Some(failure(&message)),
                Some(Ok(other)) => tracing::debug!(?other, "kubelet: unexpected frame from the runner"),
                None => break Some(failure("the runner closed the session before the command ended")),
                Some(Err(e)) => break Some(failure(&format!("the runner's session failed: {e}"))),
            },
            extra = conn.accept() => match extra {
                Some(stream) => stream.split().1.reset().await,
                None => break None,
            },
        }
    };
    pumps.abort_all();
    if let Some(status) = status {
        streams.end(status).await;
    }
    conn.close().await;
}

async fn write_to(writer: &Option<StreamWriter>, bytes: &[u8]) {
    if let Some(writer) = writer {
        let _ = writer.write(bytes).await;
    }
}

/// Serves one attach: the workload's output from now on (the runner merges stdout and stderr
/// into its log, so all of it goes to stdout), until the workload ends. The workload's stdin is
/// not open, so what the caller sends is dropped, as for a container without `stdin: true`.
pub(crate) async fn serve_attach(
    mut conn: Connection,
    open: Opening<BoxStream<'static, Bytes>>,
    options: ExecOptions,
) {
    let Some((mut streams, mut output)) = start(&mut conn, open, &options).await else {
        conn.close().await;
        return;
    };
    let mut drains = JoinSet::new();
    for mut reader in [streams.stdin.take(), streams.resize.take()]
        .into_iter()
        .flatten()
    {
        drains.spawn(async move { while reader.read().await.is_some() {} });
    }
    let ended = loop {
        tokio::select! {
            line = output.next() => match line {
                Some(line) => {
                    let target = streams.stdout.as_ref().or(streams.stderr.as_ref());
                    if let Some(writer) = target
                        && writer.write(&line).await.is_err()
                    {
                        break false;
                    }
                }
                None => break true,
            },
            extra = conn.accept() => match extra {
                Some(stream) => stream.split().1.reset().await,
                None => break false,
            },
        }
    };
    drains.abort_all();
    if ended {
        streams
            .end(json!({"metadata": {}, "status": "Success"}))
            .await;
    }
    conn.close().await;
}

#[cfg(test)]
#[path = "exec_tests.rs"]
mod session_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_become_the_statuses_kubectl_reads() {
        let command = vec!["sh".to_owned(), "-c".to_owned(), "exit 3".to_owned()];
        let ok = exit_status(
            &command,
            &ExitStatus {
                exit_code: Some(0),
                error: None,
            },
        );
        assert_eq!(ok, json!({"metadata": {}, "status": "Success"}));
        let failed = exit_status(
            &command,
            &ExitStatus {
                exit_code: Some(3),
                error: None,
            },
        );
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(failed["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(failed["details"]["causes"][0]["message"], "3");
        let not_started = exit_status(
            &command,
            &ExitStatus {
                exit_code: None,
                error: Some("failed to start nope: No such file or directory".into()),
            },
        );
        assert_eq!(not_started["status"], "Failure");
        assert_eq!(
            not_started["message"],
            "failed to start nope: No such file or directory"
        );
    }
}
