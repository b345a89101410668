//! The two tasks of a connection: the reader, which owns the inbound zlib context and answers
//! control frames; and the writer, which owns the outbound zlib context and serialises every
//! frame onto the wire in queue order. Both share the map of open streams ([`Shared`]), which is
//! where the stream cap is kept, and both watch the connection's idle deadline. Not the public
//! handles: those are in the module root and talk to these tasks through channels.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use super::frame::{self, Deflater, Frame, FrameError, Headers, Inflater, status};
use super::{Limits, MAX_PIECE, MAX_UNREAD, Piece, STREAM_QUEUE};
use super::{Stream, StreamReader, StreamState, StreamWriter};

/// Bytes the writer gathers from its queue before one write to the socket.
const WRITE_BATCH: usize = 64 * 1024;

/// What the writer task is asked to do.
#[derive(Debug)]
pub(super) enum Outgoing {
    /// A frame of no open stream (a ping, a refusal).
    Frame(Frame),
    /// A frame of an open stream: dropped once the stream is reset or our FIN is written.
    Stream(Arc<StreamState>, Frame),
    /// Answer a new stream with an empty SYN_REPLY.
    Opened(Arc<StreamState>),
    /// GOAWAY with this status, FIN on every open stream, then flush and shut down.
    Close { status: u32 },
}

/// A stream not closed by both sides nor reset.
#[derive(Debug)]
struct Open {
    state: Arc<StreamState>,
    /// Where the client's data goes; `None` once the client finished or the reader is gone.
    data: Option<mpsc::Sender<Piece>>,
}

/// What both tasks and the stream writers know about the connection.
#[derive(Debug)]
pub(super) struct Shared {
    limits: Limits,
    /// The last stream handed to `accept`, for GOAWAY.
    last_good: AtomicU32,
    /// Every open stream; at most `limits.max_streams`.
    open: Mutex<HashMap<u32, Open>>,
    /// Bytes received and not read yet, all streams together ([`MAX_UNREAD`]).
    unread: Arc<Semaphore>,
    /// When the connection started, and the last frame read or written, in ms after it.
    origin: Instant,
    last_activity: AtomicU64,
}

impl Shared {
    pub(super) fn new(limits: Limits) -> Self {
        Shared {
            limits,
            last_good: AtomicU32::new(0),
            open: Mutex::new(HashMap::new()),
            unread: Arc::new(Semaphore::new(MAX_UNREAD)),
            origin: Instant::now(),
            last_activity: AtomicU64::new(0),
        }
    }

    /// Drops `state` from the open streams (when it is still the one under its id).
    pub(super) fn forget(&self, state: &StreamState) {
        let mut open = self.open.lock();
        if open
            .get(&state.id)
            .is_some_and(|o| std::ptr::eq(Arc::as_ptr(&o.state), state))
        {
            open.remove(&state.id);
        }
    }

    /// Forgets `state` once nothing more can happen on it.
    fn settle(&self, state: &StreamState) {
        if state.is_over() {
            self.forget(state);
        }
    }

    fn touch(&self) {
        let now = self.origin.elapsed().as_millis() as u64;
        self.last_activity.fetch_max(now, Ordering::SeqCst);
    }

    /// Returns once the connection has seen no frame for the idle timeout and `extra`.
    async fn idle(&self, extra: std::time::Duration) {
        let timeout = self.limits.idle_timeout + extra;
        loop {
            let last = self.last_activity.load(Ordering::SeqCst);
            let deadline = self.origin + std::time::Duration::from_millis(last) + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }

    /// Ends every stream's inbound side: their readers return `None`.
    fn end_inbound(&self) {
        for open in self.open.lock().values_mut() {
            open.data = None;
        }
    }
}

/// Writes queued frames until told to close, the socket fails, every sender is gone, or the
/// connection is idle.
pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    mut io: W,
    mut queue: mpsc::Receiver<Outgoing>,
    shared: Arc<Shared>,
) {
    // The reader sees the idle timeout first and asks for a GOAWAY; this one is for a writer
    // stuck on a client that reads nothing.
    let stuck = shared.limits.close_timeout;
    tokio::select! {
        () = write_frames(&mut io, &mut queue, &shared) => {}
        () = shared.idle(stuck) => tracing::debug!("spdy connection idle; the writer stops"),
    }
    queue.close();
    shared.end_inbound();
    let _ = tokio::time::timeout(shared.limits.close_timeout, io.shutdown()).await;
}

async fn write_frames<W: AsyncWrite + Unpin>(
    io: &mut W,
    queue: &mut mpsc::Receiver<Outgoing>,
    shared: &Shared,
) {
    let mut writer = Writer::default();
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        let mut closing = Ok(false);
        while let Some(msg) = next.take() {
            closing = writer.push(msg, shared);
            if matches!(closing, Ok(false)) && writer.buf.len() < WRITE_BATCH {
                next = queue.try_recv().ok();
            }
        }
        let written = async { io.write_all(&writer.buf).await.and(io.flush().await) };
        if let Err(error) = written.await {
            tracing::debug!(%error, "spdy connection write failed");
            return;
        }
        shared.touch();
        writer.buf.clear();
        match closing {
            Ok(false) => {}
            Ok(true) => return,
            Err(error) => {
                tracing::warn!(%error, "failed to encode a spdy frame; closing the connection");
                return;
            }
        }
    }
}

#[derive(Default)]
struct Writer {
    deflater: Deflater,
    buf: Vec<u8>,
}

impl Writer {
    /// Encodes `msg` onto the buffer; true when the connection is to close after it.
    fn push(&mut self, msg: Outgoing, shared: &Shared) -> Result<bool, FrameError> {
        match msg {
            Outgoing::Opened(state) => {
                let reply = Frame::SynReply(state.id, false, Vec::new());
                reply.encode(&mut self.buf, &mut self.deflater)?;
            }
            Outgoing::Frame(frame) => frame.encode(&mut self.buf, &mut self.deflater)?,
            Outgoing::Stream(state, frame) => {
                let fin = matches!(frame, Frame::Data(_, true, _));
                if matches!(frame, Frame::Data(..))
                    && (state.is_reset() || state.fin_sent.load(Ordering::SeqCst))
                {
                    // Late writes on a stream already finished or reset are dropped.
                    return Ok(false);
                }
                frame.encode(&mut self.buf, &mut self.deflater)?;
                if fin {
                    state.fin_sent.store(true, Ordering::SeqCst);
                }
                shared.settle(&state);
            }
            Outgoing::Close { status } => {
                let last_good = shared.last_good.load(Ordering::SeqCst);
                Frame::GoAway(last_good, status).encode(&mut self.buf, &mut self.deflater)?;
                let open: Vec<Open> = shared.open.lock().drain().map(|(_, o)| o).collect();
                for Open { state, .. } in open {
                    if !state.is_reset() && !state.fin_sent.swap(true, Ordering::SeqCst) {
                        state.finished.store(true, Ordering::SeqCst);
                        let fin = Frame::Data(state.id, true, Bytes::new());
                        fin.encode(&mut self.buf, &mut self.deflater)?;
                    }
                }
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Reads frames until EOF, an IO error, a protocol error (answered with GOAWAY) or the idle
/// timeout (answered with GOAWAY OK).
pub(super) async fn read_loop<R: AsyncRead + Unpin>(
    io: R,
    out: mpsc::Sender<Outgoing>,
    accept: mpsc::Sender<Stream>,
    shared: Arc<Shared>,
) {
    let mut reader = Reader {
        out,
        accept: Some(accept),
        shared: Arc::clone(&shared),
        last_id: 0,
        refused: 0,
    };
    let ended = tokio::select! {
        ended = reader.run(io) => ended,
        () = shared.idle(std::time::Duration::ZERO) => Ok(Some(shared.limits.idle_timeout)),
    };
    shared.end_inbound();
    let status = match ended {
        Ok(None) => return,
        Ok(Some(idle)) => {
            tracing::debug!(?idle, "spdy connection idle; closing it");
            frame::GOAWAY_OK
        }
        Err(error) => {
            tracing::warn!(%error, "spdy client broke the protocol; closing the connection");
            frame::GOAWAY_PROTOCOL_ERROR
        }
    };
    let _ = reader.out.try_send(Outgoing::Close { status });
}

struct Reader {
    out: mpsc::Sender<Outgoing>,
    /// `None` once the client sent GOAWAY.
    accept: Option<mpsc::Sender<Stream>>,
    shared: Arc<Shared>,
    last_id: u32,
    /// Streams refused for the cap, to log the first one only.
    refused: u64,
}

impl Reader {
    /// `Ok(None)` at EOF or on a read error.
    async fn run<R: AsyncRead + Unpin>(
        &mut self,
        mut io: R,
    ) -> Result<Option<std::time::Duration>, FrameError> {
        let mut inflater = Inflater::default();
        let mut buf = BytesMut::with_capacity(16 * 1024);
        loop {
            while let Some(frame) = frame::decode(&mut buf, &mut inflater)? {
                self.shared.touch();
                self.handle(frame).await;
            }
            buf.reserve(8 * 1024);
            match io.read_buf(&mut buf).await {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "spdy connection read failed");
                    return Ok(None);
                }
            }
        }
    }

    async fn handle(&mut self, frame: Frame) {
        match frame {
            Frame::SynStream(stream, fin, headers) => self.open(stream, fin, headers).await,
            Frame::Data(stream, fin, data) => self.data(stream, fin, data).await,
            Frame::Headers(stream, true, ..) => self.data(stream, true, Bytes::new()).await,
            Frame::RstStream(stream, ..) => {
                let state = self.shared.open.lock().remove(&stream).map(|o| o.state);
                if let Some(state) = state {
                    state.mark_reset();
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
        state.remote_closed.store(fin, Ordering::SeqCst);
        let (data_tx, data) = mpsc::channel(STREAM_QUEUE);
        if !self.register(&state, (!fin).then_some(data_tx)) {
            return self
                .send(Frame::RstStream(id, status::REFUSED_STREAM))
                .await;
        }
        if self
            .out
            .send(Outgoing::Opened(Arc::clone(&state)))
            .await
            .is_err()
        {
            return;
        }
        let reader = StreamReader {
            state: Arc::clone(&state),
            data,
        };
        let writer = StreamWriter {
            state: Arc::clone(&state),
            out: self.out.clone(),
            shared: Arc::clone(&self.shared),
        };
        let stream = Stream {
            headers,
            reader,
            writer,
        };
        if accept.send(stream).await.is_err() {
            state.mark_reset();
            self.shared.forget(&state);
            return self.send(Frame::RstStream(id, status::CANCEL)).await;
        }
        self.shared.last_good.store(id, Ordering::SeqCst);
    }

    /// Counts `state` as open; false (said once per connection) when the cap is reached.
    fn register(&mut self, state: &Arc<StreamState>, data: Option<mpsc::Sender<Piece>>) -> bool {
        let max = self.shared.limits.max_streams;
        let mut open = self.shared.open.lock();
        if open.len() >= max {
            if self.refused == 0 {
                tracing::warn!(
                    stream = state.id,
                    max_streams = max,
                    "spdy client opened more streams than allowed; refusing them"
                );
            }
            self.refused += 1;
            return false;
        }
        let state = Arc::clone(state);
        open.insert(state.id, Open { state, data });
        true
    }

    async fn data(&mut self, id: u32, fin: bool, data: Bytes) {
        let (state, sender) = match self.shared.open.lock().get_mut(&id) {
            Some(open) if fin => (Some(Arc::clone(&open.state)), open.data.take()),
            Some(open) => (Some(Arc::clone(&open.state)), open.data.clone()),
            None => (None, None),
        };
        if let Some(sender) = sender
            && !data.is_empty()
            && !self.deliver(&sender, data).await
            && let Some(open) = self.shared.open.lock().get_mut(&id)
        {
            // The stream's reader was dropped: later data is discarded.
            open.data = None;
        }
        if fin && let Some(state) = state {
            state.remote_closed.store(true, Ordering::SeqCst);
            self.shared.settle(&state);
        }
    }

    /// Hands `data` to a stream's reader in pieces within [`MAX_UNREAD`]; false when the
    /// reader is gone.
    async fn deliver(&self, sender: &mpsc::Sender<Piece>, mut data: Bytes) -> bool {
        while !data.is_empty() {
            let piece = data.split_to(data.len().min(MAX_PIECE));
            let unread = Arc::clone(&self.shared.unread);
            let Ok(permit) = unread.acquire_many_owned(piece.len() as u32).await else {
                return false;
            };
            if sender.send((piece, permit)).await.is_err() {
                return false;
            }
        }
        true
    }

    async fn send(&self, frame: Frame) {
        let _ = self.out.send(Outgoing::Frame(frame)).await;
    }
}
