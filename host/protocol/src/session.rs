//! Interactive sessions between the node and a runner: `kubectl exec` and `kubectl
//! port-forward` tunnelled over the runner's own TLS connection to the callback (the runner
//! dials out; nothing listens on the VM).
//!
//! The exchange:
//! 1. The runner keeps one `GET /v1/sessions` (Bearer) open. The node answers it with a
//!    [`SessionOffer`] when someone asks for a session on the runner's Pod, or with 204 after
//!    [`SESSION_POLL`] so that the runner asks again.
//! 2. For each offer the runner opens `GET /v1/sessions/{id}` (Bearer) with
//!    `Connection: Upgrade` and `Upgrade:` [`SESSION_UPGRADE`]. The node answers 101 and both
//!    ends then speak [`Frame`]s on the upgraded connection until one of them closes it.
//!
//! A frame is one byte of kind, four bytes of big-endian payload length, then the payload (at
//! most [`MAX_FRAME`] bytes). Exec uses `Stdin`, `StdinEnd` and `Resize` from the node and
//! `Stdout`, `Stderr` and finally `Exit` from the runner; port-forward uses `Data` and `DataEnd`
//! both ways, and `Error` from the runner when the port cannot be reached.
//!
//! Not HTTP: the callback server and the runner's client do that.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The `Upgrade` token of a session connection.
pub const SESSION_UPGRADE: &str = "neocloud-session/1";
/// How long the node holds a `GET /v1/sessions` before answering 204.
pub const SESSION_POLL: std::time::Duration = std::time::Duration::from_secs(25);
/// The largest frame payload, in bytes.
pub const MAX_FRAME: usize = 1024 * 1024;

/// What the node asks a runner to open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum SessionRequest {
    /// Run `command` beside the workload, as `kubectl exec` does.
    #[serde(rename_all = "camelCase")]
    Exec {
        /// The program and its arguments, exactly as given.
        command: Vec<String>,
        /// Whether to run it on a pseudo-terminal (stdout and stderr are then one stream).
        tty: bool,
        /// Whether the caller sends stdin.
        stdin: bool,
    },
    /// Connect to `port` on the workload's loopback, as `kubectl port-forward` does.
    #[serde(rename_all = "camelCase")]
    PortForward {
        /// The TCP port.
        port: u16,
    },
}

/// `GET /v1/sessions` answer: a session to open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionOffer {
    /// The session's id, for `GET /v1/sessions/{id}`: random, single use.
    pub id: String,
    /// What to open.
    pub request: SessionRequest,
}

/// The end of an exec'd command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExitStatus {
    /// Its exit code (128 + the signal when killed); `None` when it could not be started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it could not be started or waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TerminalSize {
    /// Columns.
    pub width: u16,
    /// Rows.
    pub height: u16,
}

/// One message on a session connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Bytes for the command's stdin.
    Stdin(Vec<u8>),
    /// The caller closed stdin.
    StdinEnd,
    /// The terminal was resized.
    Resize(TerminalSize),
    /// Bytes the command wrote to stdout (or to its terminal).
    Stdout(Vec<u8>),
    /// Bytes the command wrote to stderr.
    Stderr(Vec<u8>),
    /// The command ended; the last frame of an exec.
    Exit(ExitStatus),
    /// Bytes of a forwarded connection.
    Data(Vec<u8>),
    /// This side of a forwarded connection is closed for writing.
    DataEnd,
    /// The session failed (for example the port refused the connection); the last frame.
    Error(String),
}

/// A frame that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The connection failed.
    #[error("session connection: {0}")]
    Io(#[from] std::io::Error),
    /// A kind byte that is no frame's.
    #[error("unknown session frame kind {0}")]
    UnknownKind(u8),
    /// A payload longer than [`MAX_FRAME`].
    #[error("session frame of {0} bytes is longer than the limit of {MAX_FRAME}")]
    TooLong(usize),
    /// A JSON payload that does not parse.
    #[error("invalid {kind} frame: {message}")]
    Invalid {
        /// The frame's kind.
        kind: &'static str,
        /// What is wrong.
        message: String,
    },
}

const STDIN: u8 = 1;
const STDIN_END: u8 = 2;
const RESIZE: u8 = 3;
const STDOUT: u8 = 4;
const STDERR: u8 = 5;
const EXIT: u8 = 6;
const DATA: u8 = 7;
const DATA_END: u8 = 8;
const ERROR: u8 = 9;

impl Frame {
    /// The frame's kind byte and payload.
    fn parts(&self) -> (u8, std::borrow::Cow<'_, [u8]>) {
        use std::borrow::Cow::{Borrowed, Owned};
        // Plain structs of numbers and strings: serializing them cannot fail.
        let json = |value: serde_json::Result<Vec<u8>>| Owned(value.unwrap_or_default());
        match self {
            Self::Stdin(b) => (STDIN, Borrowed(b.as_slice())),
            Self::StdinEnd => (STDIN_END, Borrowed(&[][..])),
            Self::Resize(size) => (RESIZE, json(serde_json::to_vec(size))),
            Self::Stdout(b) => (STDOUT, Borrowed(b.as_slice())),
            Self::Stderr(b) => (STDERR, Borrowed(b.as_slice())),
            Self::Exit(status) => (EXIT, json(serde_json::to_vec(status))),
            Self::Data(b) => (DATA, Borrowed(b.as_slice())),
            Self::DataEnd => (DATA_END, Borrowed(&[][..])),
            Self::Error(message) => (ERROR, Borrowed(message.as_bytes())),
        }
    }

    /// The frame on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload) = self.parts();
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(kind);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// The frame of `kind` with `payload`.
    pub fn decode(kind: u8, payload: Vec<u8>) -> Result<Self, FrameError> {
        fn parse<T: serde::de::DeserializeOwned>(
            kind: &'static str,
            payload: &[u8],
        ) -> Result<T, FrameError> {
            serde_json::from_slice(payload).map_err(|e| FrameError::Invalid {
                kind,
                message: e.to_string(),
            })
        }
        Ok(match kind {
            STDIN => Self::Stdin(payload),
            STDIN_END => Self::StdinEnd,
            RESIZE => Self::Resize(parse("resize", &payload)?),
            STDOUT => Self::Stdout(payload),
            STDERR => Self::Stderr(payload),
            EXIT => Self::Exit(parse("exit", &payload)?),
            DATA => Self::Data(payload),
            DATA_END => Self::DataEnd,
            ERROR => Self::Error(String::from_utf8_lossy(&payload).into_owned()),
            other => return Err(FrameError::UnknownKind(other)),
        })
    }

    /// Reads the next frame; `None` when the connection ends cleanly between frames.
    pub async fn read<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Self>, FrameError> {
        let mut head = [0u8; 5];
        match reader.read_exact(&mut head[..1]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        reader.read_exact(&mut head[1..]).await?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLong(len));
        }
        let mut payload = vec![0u8; len];
        reader.read_exact(&mut payload).await?;
        Self::decode(head[0], payload).map(Some)
    }

    /// Writes the frame and flushes it.
    pub async fn write<W: AsyncWrite + Unpin>(&self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(&self.encode()).await?;
        writer.flush().await
    }
}

/// Splits `bytes` into payloads of at most [`MAX_FRAME`] bytes.
pub fn chunks(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes.chunks(MAX_FRAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_frame_round_trips_through_a_pipe() {
        let frames = vec![
            Frame::Stdin(b"ls\n".to_vec()),
            Frame::StdinEnd,
            Frame::Resize(TerminalSize {
                width: 120,
                height: 40,
            }),
            Frame::Stdout(vec![0, 1, 2, 255]),
            Frame::Stderr(Vec::new()),
            Frame::Exit(ExitStatus {
                exit_code: Some(3),
                error: None,
            }),
            Frame::Data(vec![7; 70_000]),
            Frame::DataEnd,
            Frame::Error("connection refused".into()),
        ];
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        for frame in &frames {
            frame.write(&mut a).await.expect("write");
        }
        drop(a);
        let mut read = Vec::new();
        while let Some(frame) = Frame::read(&mut b).await.expect("read") {
            read.push(frame);
        }
        assert_eq!(read, frames);
    }

    #[tokio::test]
    async fn bad_frames_are_refused_by_what_is_wrong() {
        let mut unknown: &[u8] = &[42, 0, 0, 0, 0];
        let err = Frame::read(&mut unknown).await.expect_err("kind 42");
        assert_eq!(err.to_string(), "unknown session frame kind 42");

        let mut long: &[u8] = &[STDOUT, 0xff, 0xff, 0xff, 0xff];
        let err = Frame::read(&mut long).await.expect_err("too long");
        assert!(err.to_string().contains("4294967295 bytes"), "{err}");

        let mut resize: &[u8] = &[RESIZE, 0, 0, 0, 2, b'{', b'x'];
        let err = Frame::read(&mut resize).await.expect_err("bad resize");
        assert!(
            err.to_string().starts_with("invalid resize frame:"),
            "{err}"
        );

        let mut cut: &[u8] = &[STDOUT, 0, 0, 0, 9, b'a'];
        assert!(matches!(
            Frame::read(&mut cut).await,
            Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof
        ));
    }

    #[test]
    fn offers_are_camel_case_json_with_a_kind() {
        let offer = SessionOffer {
            id: "s1".into(),
            request: SessionRequest::Exec {
                command: vec!["sh".into(), "-c".into(), "echo 'a b'".into()],
                tty: true,
                stdin: false,
            },
        };
        let json = serde_json::to_value(&offer).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"id": "s1", "request": {"kind": "exec",
                "command": ["sh", "-c", "echo 'a b'"], "tty": true, "stdin": false}})
        );
        let forward: SessionOffer = serde_json::from_value(serde_json::json!(
            {"id": "s2", "request": {"kind": "portForward", "port": 8080}}
        ))
        .expect("parse");
        assert_eq!(forward.request, SessionRequest::PortForward { port: 8080 });
    }
}
