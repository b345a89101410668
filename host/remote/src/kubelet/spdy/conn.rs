//! The two tasks of a connection: the reader, which owns the inbound zlib context and the map
//! of open streams and answers control frames; and the writer, which owns the outbound zlib
//! context and serialises every frame onto the wire in queue order. Not the public handles:
//! those are in the module root and talk to these tasks through channels.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::frame::{self, Deflater, Frame, FrameError, Headers, Inflater, status};
use super::{STREAM_QUEUE, Stream, StreamReader, StreamState, StreamWriter};

/// Bytes the writer gathers from its queue before one write to the socket.
const WRITE_BATCH: usize = 64 * 1024;

/// What the writer task is asked to do.
#[derive(Debug)]
pub(super) enum Outgoing {
    Frame(Frame),
    /// Answer a new stream with an empty SYN_REPLY and track it until our FIN or a reset.
    Opened(Arc<StreamState>),
    /// GOAWAY with this status, FIN on every open stream, then flush and shut down.
    Close {
        status: u32,
    },
}

/// What both tasks know about the connection.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// The last stream handed to `accept`, for GOAWAY.
    last_good: AtomicU32,
}

/// Writes queued frames until told to close, the socket fails or every sender is gone.
pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    mut io: W,
    mut queue: mpsc::Receiver<Outgoing>,
    shared: Arc<Shared>,
) {
    let mut writer = Writer::default();
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        let mut closing = Ok(false);
        while let Some(msg) = next.take() {
            closing = writer.push(msg, &shared);
            if matches!(closing, Ok(false)) && writer.buf.len() < WRITE_BATCH {
                next = queue.try_recv().ok();
            }
        }
        let written = async { io.write_all(&writer.buf).await.and(io.flush().await) };
        if let Err(error) = written.await {
            tracing::debug!(%error, "spdy connection write failed");
            break;
        }
        writer.buf.clear();
        match closing {
            Ok(false) => {}
            Ok(true) => break,
            Err(error) => {
                tracing::warn!(%error, "failed to encode a spdy frame; closing the connection");
                break;
            }
        }
    }
    queue.close();
    let _ = io.shutdown().await;
}

#[derive(Default)]
struct Writer {
    deflater: Deflater,
    /// Streams we answered and have not finished or reset.
    open: HashMap<u32, Arc<StreamState>>,
    buf: Vec<u8>,
}

impl Writer {
    /// Encodes `msg` onto the buffer; true when the connection is to close after it.
    fn push(&mut self, msg: Outgoing, shared: &Shared) -> Result<bool, FrameError> {
        match msg {
            Outgoing::Opened(state) => {
                let stream = state.id;
                self.open.insert(stream, state);
                let reply = Frame::SynReply(stream, false, Vec::new());
                reply.encode(&mut self.buf, &mut self.deflater)?;
            }
            Outgoing::Frame(frame) => {
                match &frame {
                    // Late writes on a stream already finished or reset are dropped.
                    Frame::Data(stream, ..) if !self.is_writable(*stream) => return Ok(false),
                    Frame::Data(stream, true, ..) | Frame::RstStream(stream, ..) => {
                        self.open.remove(stream);
                    }
                    _ => {}
                }
                frame.encode(&mut self.buf, &mut self.deflater)?;
            }
            Outgoing::Close { status } => {
                let last_good = shared.last_good.load(Ordering::SeqCst);
                Frame::GoAway(last_good, status).encode(&mut self.buf, &mut self.deflater)?;
                for (stream, state) in std::mem::take(&mut self.open) {
                    if !state.is_reset() && !state.finished.swap(true, Ordering::SeqCst) {
                        let fin = Frame::Data(stream, true, Bytes::new());
                        fin.encode(&mut self.buf, &mut self.deflater)?;
                    }
                }
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn is_writable(&self, stream: u32) -> bool {
        self.open
            .get(&stream)
            .is_some_and(|state| !state.is_reset())
    }
}

/// Reads frames until EOF, an IO error or a protocol error (answered with GOAWAY).
pub(super) async fn read_loop<R: AsyncRead + Unpin>(
    io: R,
    out: mpsc::Sender<Outgoing>,
    accept: mpsc::Sender<Stream>,
    shared: Arc<Shared>,
) {
    let mut reader = Reader {
        out,
        accept: Some(accept),
        streams: HashMap::new(),
        shared,
        last_id: 0,
    };
    if let Err(error) = reader.run(io).await {
        tracing::warn!(%error, "spdy client broke the protocol; closing the connection");
        let status = frame::GOAWAY_PROTOCOL_ERROR;
        let _ = reader.out.send(Outgoing::Close { status }).await;
    }
}

/// A stream the client may still send on.
struct Inbound {
    state: Arc<StreamState>,
    data: mpsc::Sender<Bytes>,
}

struct Reader {
    out: mpsc::Sender<Outgoing>,
    /// `None` once the client sent GOAWAY.
    accept: Option<mpsc::Sender<Stream>>,
    streams: HashMap<u32, Inbound>,
    shared: Arc<Shared>,
    last_id: u32,
}

impl Reader {
    async fn run<R: AsyncRead + Unpin>(&mut self, mut io: R) -> Result<(), FrameError> {
        let mut inflater = Inflater::default();
        let mut buf = BytesMut::with_capacity(16 * 1024);
        loop {
            while let Some(frame) = frame::decode(&mut buf, &mut inflater)? {
                self.handle(frame).await;
            }
            buf.reserve(8 * 1024);
            match io.read_buf(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "spdy connection read failed");
                    return Ok(());
                }
            }
        }
    }

    async fn handle(&mut self, frame: Frame) {
        match frame {
            Frame::SynStream(stream, fin, headers) => self.open(stream, fin, headers).await,
            Frame::Data(stream, fin, data) => self.data(stream, fin, data).await,
            Frame::Headers(stream, true, ..) => {
                self.streams.remove(&stream);
            }
            Frame::RstStream(stream, ..) => {
                if let Some(inbound) = self.streams.remove(&stream) {
                    inbound.state.mark_reset();
                }
            }
            // Odd ids are the client's pings; even ones would answer ours, and we send none.
            Frame::Ping(id) if !id.is_multiple_of(2) => self.send(Frame::Ping(id)).await,
            Frame::GoAway(..) => self.accept = None,
            // SYN_REPLY (we open nothing), SETTINGS, WINDOW_UPDATE (spdystream does no flow
            // control either), HEADERS without FIN, unknown types: ignored.
            _ => {}
        }
    }

    async fn open(&mut self, id: u32, fin: bool, headers: Headers) {
        if id.is_multiple_of(2) || id <= self.last_id {
            return self
                .send(Frame::RstStream(id, status::PROTOCOL_ERROR))
                .await;
        }
        self.last_id = id;
        let Some(accept) = self.accept.clone().filter(|a| !a.is_closed()) else {
            return self
                .send(Frame::RstStream(id, status::REFUSED_STREAM))
                .await;
        };
        let state = Arc::new(StreamState::new(id));
        let (data_tx, data) = mpsc::channel(STREAM_QUEUE);
        if self
            .out
            .send(Outgoing::Opened(Arc::clone(&state)))
            .await
            .is_err()
        {
            return;
        }
        if !fin {
            self.streams.insert(
                id,
                Inbound {
                    state: Arc::clone(&state),
                    data: data_tx,
                },
            );
        }
        let reader = StreamReader {
            state: Arc::clone(&state),
            data,
        };
        let writer = StreamWriter {
            state,
            out: self.out.clone(),
        };
        if accept
            .send(Stream {
                headers,
                reader,
                writer,
            })
            .await
            .is_err()
        {
            self.streams.remove(&id);
            return self.send(Frame::RstStream(id, status::CANCEL)).await;
        }
        self.shared.last_good.store(id, Ordering::SeqCst);
    }

    async fn data(&mut self, id: u32, fin: bool, data: Bytes) {
        if let Some(inbound) = self.streams.get(&id)
            && !data.is_empty()
            && !inbound.state.is_reset()
        {
            // An error means the reader was dropped: the data is discarded.
            let _ = inbound.data.send(data).await;
        }
        if fin {
            self.streams.remove(&id);
        }
    }

    async fn send(&self, frame: Frame) {
        let _ = self.out.send(Outgoing::Frame(frame)).await;
    }
}
