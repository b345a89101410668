//! One connection carried as [`Frame`]s: bytes read from a socket go out as `Data` frames,
//! `Data` frames coming in are written to it, and `DataEnd` half-closes either way. What both
//! ends of an egress connection run (the runner with the workload's loopback connection, the
//! node with the connection it dialled in the cluster).
//!
//! Not the dialling, nor deciding what may be dialled.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::session::{Frame, FrameError, split_frames};

/// Bytes read from the socket per `Data` frame, at most.
const CHUNK: usize = 32 * 1024;

/// How a relay ended early.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Nothing moved either way for the idle timeout; the other end was told with an `Error`.
    #[error("the connection was idle for {0:?} (the egress idle timeout) and was closed")]
    Idle(Duration),
    /// The other end sent an `Error` frame.
    #[error("{0}")]
    Refused(String),
    /// The framed connection failed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The socket failed.
    #[error("the relayed socket: {0}")]
    Io(#[from] std::io::Error),
}

/// Copies `socket` to and from the framed connection `framed` until both ways are closed (or
/// the framed connection is), or nothing moves for `idle`. Closes the framed connection at the
/// end; a socket error or the idle timeout is sent as an `Error` frame first.
pub async fn relay<S, F>(socket: S, framed: F, idle: Option<Duration>) -> Result<(), RelayError>
where
    S: AsyncRead + AsyncWrite,
    F: AsyncRead + AsyncWrite,
{
    let (mut socket_in, mut socket_out) = tokio::io::split(socket);
    let (mut from_peer, mut to_peer) = split_frames(framed);
    let mut buf = vec![0u8; CHUNK];
    let (mut peer_ended, mut socket_ended) = (false, false);
    let ended = loop {
        if peer_ended && socket_ended {
            break Ok(());
        }
        let step = async {
            tokio::select! {
                frame = from_peer.next(), if !peer_ended => match frame {
                    Some(Ok(Frame::Data(bytes))) => Ok(socket_out.write_all(&bytes).await?),
                    Some(Ok(Frame::DataEnd)) => {
                        peer_ended = true;
                        Ok(socket_out.shutdown().await?)
                    }
                    Some(Ok(Frame::Error(message))) => Err(RelayError::Refused(message)),
                    Some(Ok(_)) => Ok(()),
                    Some(Err(e)) => Err(RelayError::Frame(e)),
                    None => Err(RelayError::Frame(FrameError::Io(
                        std::io::ErrorKind::UnexpectedEof.into(),
                    ))),
                },
                read = socket_in.read(&mut buf), if !socket_ended => match read? {
                    0 => {
                        socket_ended = true;
                        Ok(to_peer.send(Frame::DataEnd).await?)
                    }
                    n => Ok(to_peer.send(Frame::Data(buf[..n].to_vec())).await?),
                },
            }
        };
        let stepped = match idle {
            Some(idle) => tokio::time::timeout(idle, step)
                .await
                .unwrap_or(Err(RelayError::Idle(idle))),
            None => step.await,
        };
        if let Err(e) = stepped {
            break Err(e);
        }
    };
    if let Err(e @ (RelayError::Idle(_) | RelayError::Io(_))) = &ended {
        let _ = to_peer.send(Frame::Error(e.to_string())).await;
    }
    let _ = to_peer.close().await;
    ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{frame_reader, frame_writer};

    #[tokio::test]
    async fn bytes_cross_both_ways_and_data_end_half_closes() {
        let (socket, mut app) = tokio::io::duplex(1 << 16);
        let (framed, peer) = tokio::io::duplex(1 << 16);
        let relaying = tokio::spawn(relay(socket, framed, None));
        let (peer_in, peer_out) = tokio::io::split(peer);
        let (mut reader, mut writer) = (frame_reader(peer_in), frame_writer(peer_out));
        app.write_all(b"ping").await.unwrap();
        assert_eq!(
            reader.next().await.unwrap().unwrap(),
            Frame::Data(b"ping".to_vec())
        );
        writer.send(Frame::Data(b"pong".to_vec())).await.unwrap();
        writer.send(Frame::DataEnd).await.unwrap();
        let mut got = Vec::new();
        app.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"pong");
        app.shutdown().await.unwrap();
        assert_eq!(reader.next().await.unwrap().unwrap(), Frame::DataEnd);
        relaying.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_with_the_limit_named() {
        let (socket, _app) = tokio::io::duplex(64);
        let (framed, peer) = tokio::io::duplex(1024);
        let idle = Duration::from_millis(50);
        let err = relay(socket, framed, Some(idle)).await.unwrap_err();
        assert!(matches!(err, RelayError::Idle(_)), "{err}");
        let frame = frame_reader(peer).next().await.unwrap().unwrap();
        assert_eq!(
            frame,
            Frame::Error(
                "the connection was idle for 50ms (the egress idle timeout) and was closed".into()
            )
        );
    }

    #[tokio::test]
    async fn an_error_frame_ends_the_relay_with_its_message() {
        let (socket, _app) = tokio::io::duplex(64);
        let (framed, peer) = tokio::io::duplex(1024);
        let mut writer = frame_writer(peer);
        writer
            .send(Frame::Error("connection refused".into()))
            .await
            .unwrap();
        let err = relay(socket, framed, None).await.unwrap_err();
        assert_eq!(err.to_string(), "connection refused");
    }
}
