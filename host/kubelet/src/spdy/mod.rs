//! The server side of SPDY/3.1, the multiplexing that `kubectl exec`, `attach` and `port-forward`
//! speak to a kubelet after the API server upgrades an HTTP/1.1 request with
//! `Upgrade: SPDY/3.1`. It behaves like Go's `moby/spdystream` as used by
//! `k8s.io/apimachinery/pkg/util/httpstream/spdy` on the server side: every stream the client
//! opens is answered at once with an empty SYN_REPLY, pings from the client are echoed, and no
//! flow control is done (spdystream neither sends nor honours WINDOW_UPDATE; back-pressure is
//! the TCP connection's, through bounded queues here).
//!
//! ```no_run
//! # async fn demo(io: tokio::io::DuplexStream) -> std::io::Result<()> {
//! use neocloud_kubelet::spdy::Connection;
//!
//! let mut conn = Connection::new(io);
//! while let Some(stream) = conn.accept().await {
//!     let kind = stream.header("streamtype").unwrap_or_default().to_owned();
//!     let (mut reader, writer) = stream.split();
//!     tokio::spawn(async move {
//!         while let Some(data) = reader.read().await {
//!             if writer.write(&data).await.is_err() {
//!                 break;
//!             }
//!         }
//!         let _ = writer.finish().await;
//!     });
//! #   let _ = kind;
//! }
//! conn.close().await;
//! # Ok(())
//! # }
//! ```
//!
//! Not the HTTP upgrade, nor what the streams mean (exec's stdin/stdout/error/resize, a
//! port-forward's data/error pairs): the kubelet handlers do that on top of [`Stream`](crate::spdy::Stream)s.
//!
//! A client reaches this through the API server with nothing more than `pods/exec` (or
//! `pods/portforward`), so everything a connection holds is bounded, whatever the client sends:
//!
//! | what | bound |
//! | --- | --- |
//! | read buffer | one frame: a control frame of at most 64 KiB, a DATA frame of at most 1 MiB ([`frame::MAX_DATA_FRAME`]) |
//! | one header block | 64 KiB inflated, 64 KiB of names and values as stored, 256 pairs after splitting NUL-separated values |
//! | open streams | [`Limits::max_streams`] (128); a SYN_STREAM past it is refused with RST_STREAM `REFUSED_STREAM` |
//! | data received and not read yet | 2 MiB per connection, whatever the number of streams ([`MAX_UNREAD`]); the client waits past it |
//! | streams waiting for `accept` | 16, with their headers |
//! | frames waiting to be written | 64 frames of at most 16 KiB, plus a 64 KiB write batch |
//! | silence | [`Limits::idle_timeout`] (4 h, the kubelet's `streamingConnectionIdleTimeout`) without a frame either way ends the connection with GOAWAY |
//! | [`Connection::close`] | [`Limits::close_timeout`] (10 s) for a client that reads nothing, then the socket is dropped |

mod conn;
#[doc(hidden)]
pub mod frame;
#[cfg(test)]
pub(crate) mod test_client;
#[cfg(test)]
mod tests;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc};
use tokio::task::JoinHandle;

use conn::{Outgoing, Shared};
use frame::{Frame, status};

/// The largest DATA payload sent in one frame.
const MAX_DATA_CHUNK: usize = 16 * 1024;
/// Frames queued for the writer task; a slow client slows every writer past this.
const OUT_QUEUE: usize = 64;
/// Opened streams waiting for [`Connection::accept`].
const ACCEPT_QUEUE: usize = 16;
/// DATA payloads queued for one [`StreamReader`] before the connection's reader waits.
const STREAM_QUEUE: usize = 16;
/// Bytes received on a connection's streams and not read yet, all streams together; past it the
/// connection's reader waits (and so does the client, through TCP).
pub const MAX_UNREAD: usize = 2 * 1024 * 1024;
/// The largest piece a received DATA payload is handed on in, so that one piece always fits in
/// [`MAX_UNREAD`].
const MAX_PIECE: usize = 64 * 1024;

/// The bounds of one connection (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Streams open at once (not yet closed by both sides nor reset); more are refused.
    pub max_streams: usize,
    /// A connection without a frame read or written for this long is closed.
    pub idle_timeout: Duration,
    /// How long [`Connection::close`] waits for its last frames to be written.
    pub close_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams: 128,
            idle_timeout: Duration::from_secs(4 * 60 * 60),
            close_timeout: Duration::from_secs(10),
        }
    }
}

/// A server-side SPDY/3.1 connection over an upgraded HTTP connection.
///
/// Dropping it without [`Connection::close`] ends its tasks: the socket is dropped and the
/// streams already accepted end as if the client had gone.
#[derive(Debug)]
pub struct Connection {
    accepted: mpsc::Receiver<Stream>,
    out: mpsc::Sender<Outgoing>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
    close_timeout: Duration,
}

impl Connection {
    /// Starts the connection's reader/writer tasks on `io`, with the default [`Limits`].
    pub fn new<IO>(io: IO) -> Connection
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        Connection::with_limits(io, Limits::default())
    }

    /// Starts the connection's reader/writer tasks on `io` within `limits`.
    pub fn with_limits<IO>(io: IO, limits: Limits) -> Connection
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (read, write) = tokio::io::split(io);
        let (out, out_rx) = mpsc::channel(OUT_QUEUE);
        let (accept, accepted) = mpsc::channel(ACCEPT_QUEUE);
        let shared = Arc::new(Shared::new(limits));
        let writer = tokio::spawn(conn::write_loop(write, out_rx, Arc::clone(&shared)));
        let reader = tokio::spawn(conn::read_loop(read, out.clone(), accept, shared));
        Connection {
            accepted,
            out,
            reader,
            writer,
            close_timeout: limits.close_timeout,
        }
    }

    /// The next stream the client opened (SYN_STREAM), already answered with an empty
    /// SYN_REPLY; `None` once the client has gone (GOAWAY, EOF, error, idle). Cancel-safe.
    pub async fn accept(&mut self) -> Option<Stream> {
        self.accepted.recv().await
    }

    /// Sends GOAWAY, finishes every open stream, flushes and closes the connection. Frames
    /// queued before the call are sent first; writes after it fail. Waits for the writes at
    /// most [`Limits::close_timeout`]: a client that reads nothing is then cut off.
    pub async fn close(mut self) {
        let status = frame::GOAWAY_OK;
        let closed = tokio::time::timeout(self.close_timeout, async {
            let _ = self.out.send(Outgoing::Close { status }).await;
            (&mut self.writer).await
        });
        match closed.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "spdy writer task failed"),
            Err(_) => tracing::debug!(
                timeout = ?self.close_timeout,
                "spdy client did not take the connection's last frames in time; cutting it"
            ),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

/// What a stream's reader, writer and the connection tasks share.
#[derive(Debug)]
struct StreamState {
    id: u32,
    /// Our FIN was asked for (by [`StreamWriter::finish`]).
    finished: AtomicBool,
    /// Our FIN is written (set by the writer task).
    fin_sent: AtomicBool,
    /// The client's FIN came.
    remote_closed: AtomicBool,
    /// Reset by either side.
    reset: AtomicBool,
    /// Wakes a [`StreamReader::read`] when the stream is reset.
    reset_signal: Notify,
}

impl StreamState {
    fn new(id: u32) -> Self {
        StreamState {
            id,
            finished: AtomicBool::new(false),
            fin_sent: AtomicBool::new(false),
            remote_closed: AtomicBool::new(false),
            reset: AtomicBool::new(false),
            reset_signal: Notify::new(),
        }
    }

    fn is_reset(&self) -> bool {
        self.reset.load(Ordering::SeqCst)
    }

    /// Closed by both sides, or reset: nothing more can happen on it.
    fn is_over(&self) -> bool {
        self.is_reset()
            || (self.fin_sent.load(Ordering::SeqCst) && self.remote_closed.load(Ordering::SeqCst))
    }

    /// Marks the stream reset; true when it already was.
    fn mark_reset(&self) -> bool {
        let was = self.reset.swap(true, Ordering::SeqCst);
        self.reset_signal.notify_waiters();
        was
    }
}

/// A stream the client opened, with the headers of its SYN_STREAM.
#[derive(Debug)]
pub struct Stream {
    headers: Vec<(String, String)>,
    reader: StreamReader,
    writer: StreamWriter,
}

impl Stream {
    /// The stream id the client chose (odd).
    pub fn id(&self) -> u32 {
        self.writer.state.id
    }

    /// A header of the SYN_STREAM, names compared lowercase (e.g. "streamtype", "port",
    /// "requestid"); the first value when the client sent several.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The two halves, to read and write from different tasks.
    pub fn split(self) -> (StreamReader, StreamWriter) {
        (self.reader, self.writer)
    }
}

/// What the client sends on one stream.
#[derive(Debug)]
pub struct StreamReader {
    state: Arc<StreamState>,
    data: mpsc::Receiver<Piece>,
}

/// Received bytes and their share of the connection's [`MAX_UNREAD`], given back when read.
type Piece = (Bytes, OwnedSemaphorePermit);

impl StreamReader {
    /// The next DATA payload; `None` after the client's FIN or RST_STREAM, our own reset, or
    /// the connection's end. Cancel-safe. Dropping the reader discards the stream's later data.
    pub async fn read(&mut self) -> Option<Bytes> {
        let reset = self.state.reset_signal.notified();
        tokio::pin!(reset);
        reset.as_mut().enable();
        if self.state.is_reset() {
            return None;
        }
        tokio::select! {
            piece = self.data.recv() => piece.map(|(data, _unread)| data),
            () = reset => None,
        }
    }
}

/// Our side of one stream; clones write to the same stream, serialised with every other
/// stream's frames by the connection's writer task.
#[derive(Debug, Clone)]
pub struct StreamWriter {
    state: Arc<StreamState>,
    out: mpsc::Sender<Outgoing>,
    shared: Arc<Shared>,
}

impl StreamWriter {
    /// Sends `data` as DATA frames of at most 16 KiB; waits while the connection's queue is
    /// full. Fails when the stream was reset or finished, or the connection is closed.
    pub async fn write(&self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(MAX_DATA_CHUNK) {
            let id = self.state.id;
            if self.state.is_reset() {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("spdy stream {id} was reset"),
                ));
            }
            if self.state.finished.load(Ordering::SeqCst) {
                let message = format!("spdy stream {id} is already finished");
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, message));
            }
            let data = Bytes::copy_from_slice(chunk);
            self.send(Frame::Data(id, false, data)).await?;
        }
        Ok(())
    }

    /// Half-closes our side (an empty DATA frame with FLAG_FIN). Idempotent, and a no-op on a
    /// reset stream; fails only when the connection is closed.
    pub async fn finish(&self) -> io::Result<()> {
        if self.state.is_reset() || self.state.finished.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let stream = self.state.id;
        self.send(Frame::Data(stream, true, Bytes::new())).await
    }

    /// Resets the stream (RST_STREAM, status CANCEL); idempotent. The stream's reader then
    /// returns `None`, later writes fail, and the stream no longer counts as open.
    pub async fn reset(&self) {
        if self.state.mark_reset() {
            return;
        }
        self.shared.forget(&self.state);
        let frame = Frame::RstStream(self.state.id, status::CANCEL);
        let _ = self.send(frame).await;
    }

    async fn send(&self, frame: Frame) -> io::Result<()> {
        self.out
            .send(Outgoing::Stream(Arc::clone(&self.state), frame))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "spdy connection is closed"))
    }
}
