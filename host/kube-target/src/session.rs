//! `kubectl exec` and `kubectl port-forward` of a remote Pod: the remote API server's exec and
//! portforward subresources (WebSocket, through the remote node's kubelet), relayed as the
//! runner session's frames, so the node's kubelet API serves them as it serves a runner's.
//!
//! Exec: `Stdin`, `StdinEnd` and `Resize` frames go to the remote process; its stdout and stderr
//! come back as `Stdout` and `Stderr` frames, then one `Exit` frame with the code the remote
//! kubelet reported. Port-forward: `Data` and `DataEnd` both ways, and an `Error` frame when the
//! remote kubelet could not reach the port.

use std::sync::Arc;

use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Api;
use kube::api::{AttachParams, AttachedProcess, TerminalSize};
use neocloud_protocol::session::{
    self, ExitStatus, Frame, SessionRequest, chunks, frame_reader, frame_writer,
};
use neocloud_providers::FrameStream;
use tokio::io::{
    AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, DuplexStream, WriteHalf,
};
use tokio::sync::Mutex;

use crate::pod::CONTAINER;

/// How much either side may have in flight before the other reads.
const BUFFER: usize = 256 * 1024;

/// Opens `request` on remote Pod `pod`; the session runs until either side closes it.
pub(crate) async fn open(
    pods: &Api<Pod>,
    pod: &str,
    request: &SessionRequest,
) -> Result<FrameStream, kube::Error> {
    let (ours, theirs) = tokio::io::duplex(BUFFER);
    match request {
        SessionRequest::Exec {
            command,
            tty,
            stdin,
        } => {
            let params = AttachParams {
                container: Some(CONTAINER.to_owned()),
                stdin: *stdin,
                stdout: true,
                stderr: !*tty,
                tty: *tty,
                ..AttachParams::default()
            };
            let process = pods.exec(pod, command.clone(), &params).await?;
            tokio::spawn(relay_exec(process, theirs));
        }
        SessionRequest::PortForward { port } => {
            let mut forwarder = pods.portforward(pod, &[*port]).await?;
            let stream = forwarder.take_stream(*port);
            let error = forwarder.take_error(*port);
            tokio::spawn(async move {
                let (Some(stream), Some(error)) = (stream, error) else {
                    return;
                };
                relay_forward(stream, error, theirs).await;
                forwarder.abort();
            });
        }
    }
    Ok(Box::new(ours))
}

type FrameWriter = Arc<Mutex<session::FrameWriter<WriteHalf<DuplexStream>>>>;

async fn send(writer: &FrameWriter, frame: Frame) -> bool {
    writer.lock().await.send(frame).await.is_ok()
}

/// Copies `output` into frames made by `frame` until it ends or the session closes.
async fn frames_of(
    output: Option<impl AsyncRead + Unpin>,
    frame: fn(Vec<u8>) -> Frame,
    writer: FrameWriter,
) {
    let Some(mut output) = output else { return };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match output.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                for chunk in chunks(&buf[..n]) {
                    if !send(&writer, frame(chunk.to_vec())).await {
                        return;
                    }
                }
            }
        }
    }
}

async fn relay_exec(mut process: AttachedProcess, io: DuplexStream) {
    let (from_node, to_node) = tokio::io::split(io);
    let mut from_node = frame_reader(from_node);
    let writer: FrameWriter = Arc::new(Mutex::new(frame_writer(to_node)));
    let mut stdin = process.stdin();
    let mut resize = process.terminal_size();
    let status = process.take_status();
    let stdout = frames_of(process.stdout(), Frame::Stdout, Arc::clone(&writer));
    let stderr = frames_of(process.stderr(), Frame::Stderr, Arc::clone(&writer));
    let inbound = async {
        while let Some(Ok(frame)) = from_node.next().await {
            match frame {
                Frame::Stdin(bytes) => {
                    if let Some(w) = stdin.as_mut()
                        && w.write_all(&bytes).await.is_err()
                    {
                        stdin = None;
                    }
                }
                Frame::StdinEnd => {
                    if let Some(mut w) = stdin.take() {
                        let _ = w.shutdown().await;
                    }
                }
                Frame::Resize(size) => {
                    if let Some(r) = resize.as_mut() {
                        let size = TerminalSize {
                            width: size.width,
                            height: size.height,
                        };
                        let _ = r.send(size).await;
                    }
                }
                _ => {}
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(stdout, stderr) } => {}
        () = inbound => {
            // The caller went away: so does the remote process's session.
            process.abort();
            return;
        }
    }
    let status = match status {
        Some(status) => status.await,
        None => None,
    };
    send(&writer, Frame::Exit(exit_status(status))).await;
    let _ = writer.lock().await.close().await;
}

/// The exit the remote kubelet reported: `Success` is 0, `NonZeroExitCode` carries the code in
/// its `ExitCode` cause, anything else (a command that could not start) is an error.
fn exit_status(status: Option<Status>) -> ExitStatus {
    let Some(status) = status else {
        return ExitStatus {
            exit_code: None,
            error: Some("the remote kubelet closed the session without an exit status".into()),
        };
    };
    if status.status.as_deref() == Some("Success") {
        return ExitStatus {
            exit_code: Some(0),
            error: None,
        };
    }
    let code = status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref())
        .and_then(|m| m.trim().parse().ok());
    match code {
        Some(code) => ExitStatus {
            exit_code: Some(code),
            error: None,
        },
        None => ExitStatus {
            exit_code: None,
            error: Some(status.message.unwrap_or_else(|| {
                status
                    .reason
                    .unwrap_or_else(|| "the remote exec failed".into())
            })),
        },
    }
}

async fn relay_forward(
    stream: impl AsyncRead + AsyncWrite + Unpin,
    error: impl Future<Output = Option<String>>,
    io: DuplexStream,
) {
    let (from_node, to_node) = tokio::io::split(io);
    let mut from_node = frame_reader(from_node);
    let writer: FrameWriter = Arc::new(Mutex::new(frame_writer(to_node)));
    let (mut from_port, mut to_port) = tokio::io::split(stream);
    let outbound = async {
        frames_of(Some(&mut from_port), Frame::Data, Arc::clone(&writer)).await;
        send(&writer, Frame::DataEnd).await;
    };
    let inbound = async {
        while let Some(Ok(frame)) = from_node.next().await {
            match frame {
                Frame::Data(bytes) if to_port.write_all(&bytes).await.is_err() => return,
                Frame::DataEnd => {
                    let _ = to_port.shutdown().await;
                }
                _ => {}
            }
        }
    };
    let failed = async {
        match error.await {
            Some(message) => {
                send(&writer, Frame::Error(message)).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = async { tokio::join!(outbound, inbound); } => {}
        () = failed => {}
    }
    let _ = writer.lock().await.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(value: serde_json::Value) -> Option<Status> {
        Some(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn the_remote_kubelet_s_status_gives_the_exit_code_or_the_reason() {
        assert_eq!(
            exit_status(status(json!({"status": "Success"}))).exit_code,
            Some(0)
        );
        let failed = status(json!({"status": "Failure", "reason": "NonZeroExitCode",
            "message": "command terminated with non-zero exit code: exit status 7",
            "details": {"causes": [{"reason": "ExitCode", "message": "7"}]}}));
        assert_eq!(exit_status(failed).exit_code, Some(7));
        let not_started = status(json!({"status": "Failure", "reason": "InternalError",
            "message": "exec: \"nope\": executable file not found in $PATH"}));
        let e = exit_status(not_started);
        assert_eq!(e.exit_code, None);
        assert!(e.error.unwrap().contains("executable file not found"));
        assert!(exit_status(None).error.is_some());
    }
}
