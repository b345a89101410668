//! A small SPDY/3 client for tests, built from the same frame codec as the server: it drives a
//! [`Connection`] (or a kubelet handler serving one) over an in-memory pipe.
//!
//! Not a client for anything else: it unwraps every error and gives up after 5 s of silence.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

pub(crate) use super::frame::Frame;
use super::frame::{self, Deflater, Inflater};
use super::{Connection, Limits};

/// The client's end of a connection.
pub(crate) struct Client {
    pub(super) io: DuplexStream,
    deflater: Deflater,
    inflater: Inflater,
    buf: BytesMut,
}

impl Client {
    /// Sends `frame`.
    pub(crate) async fn send(&mut self, frame: Frame) {
        let mut out = Vec::new();
        frame.encode(&mut out, &mut self.deflater).unwrap();
        self.io.write_all(&out).await.unwrap();
    }

    /// The next frame from the server; `None` at EOF.
    pub(crate) async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = frame::decode(&mut self.buf, &mut self.inflater).unwrap() {
                return Some(frame);
            }
            let read =
                tokio::time::timeout(Duration::from_secs(5), self.io.read_buf(&mut self.buf));
            if read.await.expect("server went quiet").unwrap() == 0 {
                return None;
            }
        }
    }

    /// The next frame from the server however long it takes; `None` at EOF.
    pub(crate) async fn next_unbounded(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = frame::decode(&mut self.buf, &mut self.inflater).unwrap() {
                return Some(frame);
            }
            if self.io.read_buf(&mut self.buf).await.unwrap() == 0 {
                return None;
            }
        }
    }

    /// Opens `stream` with `headers` and checks the empty SYN_REPLY.
    pub(crate) async fn open(&mut self, stream: u32, headers: &[(&str, &str)]) {
        self.send(syn_stream(stream, headers)).await;
        assert_eq!(
            self.next().await,
            Some(Frame::SynReply(stream, false, vec![]))
        );
    }

    /// Sends `data` on `stream`, with FIN if `fin`.
    pub(crate) async fn data(&mut self, stream: u32, fin: bool, data: &'static [u8]) {
        self.send(Frame::Data(stream, fin, Bytes::from_static(data)))
            .await;
    }
}

/// The SYN_STREAM opening `stream` with `headers`.
pub(crate) fn syn_stream(stream: u32, headers: &[(&str, &str)]) -> Frame {
    let headers = headers
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    Frame::SynStream(stream, false, headers)
}

/// A client and the server's connection, over a pipe.
pub(crate) fn connect() -> (Client, Connection) {
    connect_with(Limits::default(), 1 << 20)
}

/// A client and a connection with `limits` over a pipe that buffers `pipe` bytes.
pub(crate) fn connect_with(limits: Limits, pipe: usize) -> (Client, Connection) {
    let (client, server) = tokio::io::duplex(pipe);
    let client = Client {
        io: client,
        deflater: Deflater::default(),
        inflater: Inflater::default(),
        buf: BytesMut::new(),
    };
    (client, Connection::with_limits(server, limits))
}
