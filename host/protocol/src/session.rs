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
//! most [`MAX_FRAME`] bytes), read and written with [`FrameCodec`] (tokio-util's
//! `LengthDelimitedCodec`) so that a read raced in a `select!` never loses part of a frame. Exec
//! uses `Stdin`, `StdinEnd` and `Resize` from the node and `Stdout`, `Stderr` and finally `Exit`
//! from the runner; port-forward uses `Data` and `DataEnd` both ways, and `Error` from the runner
//! when the port cannot be reached.
//!
//! Not HTTP: the callback server and the runner's client do that.

use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio_util::codec::{Decoder, Encoder, FramedRead, FramedWrite, LengthDelimitedCodec};

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
}

/// The bytes of a frame before its payload: the kind and the payload's length.
const HEAD: usize = 5;

/// [`Frame`]s on a byte stream, for tokio-util's [`FramedRead`] and [`FramedWrite`]: the
/// framing is tokio-util's [`LengthDelimitedCodec`] (the length after the kind byte, at most
/// [`MAX_FRAME`]). Reading through a [`FramedRead`] is cancel-safe: a read dropped in a
/// `select!` loses nothing, the partial frame stays in the reader's buffer.
#[derive(Debug)]
pub struct FrameCodec {
    framing: LengthDelimitedCodec,
}

impl Default for FrameCodec {
    fn default() -> Self {
        let framing = LengthDelimitedCodec::builder()
            .length_field_offset(1)
            .length_field_type::<u32>()
            .length_adjustment(HEAD as isize)
            .num_skip(0)
            .max_frame_length(MAX_FRAME)
            .new_codec();
        Self { framing }
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if let Some(head) = src.get(..HEAD) {
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if len > MAX_FRAME {
                return Err(FrameError::TooLong(len));
            }
        }
        let Some(mut frame) = self.framing.decode(src)? else {
            return Ok(None);
        };
        let kind = frame[0];
        Frame::decode(kind, frame.split_off(HEAD).to_vec()).map(Some)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(FrameError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the connection ended inside a frame ({} bytes)", src.len()),
            ))),
        }
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let (kind, payload) = frame.parts();
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|len| *len as usize <= MAX_FRAME)
            .ok_or(FrameError::TooLong(payload.len()))?;
        dst.reserve(HEAD + payload.len());
        dst.put_u8(kind);
        dst.put_u32(len);
        dst.put_slice(&payload);
        Ok(())
    }
}

/// The frames read from a session connection (a [`futures::Stream`] of them; `None` once the
/// connection ended between frames).
pub type FrameReader<R> = FramedRead<R, FrameCodec>;
/// The frames written to a session connection (a [`futures::Sink`]: `send` writes and flushes).
pub type FrameWriter<W> = FramedWrite<W, FrameCodec>;

/// Reads frames from `reader`.
pub fn frame_reader<R: AsyncRead>(reader: R) -> FrameReader<R> {
    FramedRead::new(reader, FrameCodec::default())
}

/// Writes frames to `writer`.
pub fn frame_writer<W: AsyncWrite>(writer: W) -> FrameWriter<W> {
    FramedWrite::new(writer, FrameCodec::default())
}

/// The two halves of a session connection, as frames.
pub fn split_frames<S: AsyncRead + AsyncWrite>(
    io: S,
) -> (FrameReader<ReadHalf<S>>, FrameWriter<WriteHalf<S>>) {
    let (reader, writer) = tokio::io::split(io);
    (frame_reader(reader), frame_writer(writer))
}

/// Splits `bytes` into payloads of at most [`MAX_FRAME`] bytes.
pub fn chunks(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes.chunks(MAX_FRAME)
}

#[cfg(test)]
mod tests {
    use futures::{SinkExt, StreamExt};

    use super::*;

    /// Every frame `bytes` holds, or the first error.
    async fn read_all(bytes: &[u8]) -> Result<Vec<Frame>, FrameError> {
        let mut reader = frame_reader(bytes);
        let mut frames = Vec::new();
        while let Some(frame) = reader.next().await {
            frames.push(frame?);
        }
        Ok(frames)
    }

    fn every_kind() -> Vec<Frame> {
        vec![
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
        ]
    }

    #[tokio::test]
    async fn every_frame_round_trips_through_a_pipe() {
        let frames = every_kind();
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut writer = frame_writer(a);
        for frame in &frames {
            writer.send(frame.clone()).await.expect("write");
        }
        drop(writer);
        let read: Vec<Frame> = frame_reader(b).map(|f| f.expect("read")).collect().await;
        assert_eq!(read, frames);
    }

    #[tokio::test]
    async fn the_wire_format_is_kind_then_big_endian_length_then_payload() {
        let mut wire = BytesMut::new();
        let frame = Frame::Stdout(b"hi".to_vec());
        FrameCodec::default()
            .encode(frame.clone(), &mut wire)
            .expect("encode");
        assert_eq!(&wire[..], &[STDOUT, 0, 0, 0, 2, b'h', b'i']);
        assert_eq!(read_all(&wire).await.expect("read"), [frame]);
    }

    #[tokio::test]
    async fn bad_frames_are_refused_by_what_is_wrong() {
        let err = read_all(&[42, 0, 0, 0, 0]).await.expect_err("kind 42");
        assert_eq!(err.to_string(), "unknown session frame kind 42");

        let err = (read_all(&[STDOUT, 0xff, 0xff, 0xff, 0xff]).await).expect_err("too long");
        assert!(err.to_string().contains("4294967295 bytes"), "{err}");
        let just_over = (MAX_FRAME as u32 + 1).to_be_bytes();
        let err = read_all(&[&[STDOUT][..], &just_over].concat()).await;
        assert!(
            matches!(err, Err(FrameError::TooLong(n)) if n == MAX_FRAME + 1),
            "{err:?}"
        );

        let err = (read_all(&[RESIZE, 0, 0, 0, 2, b'{', b'x']).await).expect_err("bad resize");
        assert!(
            err.to_string().starts_with("invalid resize frame:"),
            "{err}"
        );

        let cut = read_all(&[STDOUT, 0, 0, 0, 9, b'a']).await;
        assert!(matches!(
            cut,
            Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof
        ));
        let head_only = read_all(&[STDOUT, 0, 0]).await;
        assert!(matches!(head_only, Err(FrameError::Io(_))), "{head_only:?}");
    }

    #[test]
    fn a_payload_over_the_limit_is_not_written() {
        let mut wire = BytesMut::new();
        let err = FrameCodec::default()
            .encode(Frame::Data(vec![0; MAX_FRAME + 1]), &mut wire)
            .expect_err("too long");
        assert!(matches!(err, FrameError::TooLong(n) if n == MAX_FRAME + 1));
        assert!(wire.is_empty());
    }

    /// A reader raced against a timer that fires between every byte (as a `select!` loop racing
    /// the frames against other events does) still gets every frame whole.
    #[tokio::test]
    async fn a_read_cancelled_between_bytes_loses_nothing() {
        let frames = every_kind();
        let mut wire = BytesMut::new();
        for frame in &frames {
            FrameCodec::default()
                .encode(frame.clone(), &mut wire)
                .expect("encode");
        }
        let (mut a, b) = tokio::io::duplex(64);
        let writing = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for byte in wire.iter().take(2_000) {
                a.write_all(&[*byte]).await.expect("write");
                tokio::task::yield_now().await;
            }
            a.write_all(&wire[2_000usize.min(wire.len())..])
                .await
                .expect("write");
        });
        let mut reader = frame_reader(b);
        let (mut read, mut cancelled) = (Vec::new(), 0);
        while read.len() < frames.len() {
            tokio::select! {
                biased;
                frame = reader.next() => read.push(frame.expect("a frame").expect("valid")),
                () = tokio::task::yield_now() => cancelled += 1,
            }
        }
        writing.await.expect("writer");
        assert_eq!(read, frames);
        assert!(cancelled > 0);
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
