//! Port-forward over SPDY (`portforward.k8s.io`): for each connection the client forwards it
//! opens two streams with the same `requestID` header and the Pod's `port`: `error` and `data`.
//! Each pair becomes one runner session that connects to the port on the workload's side, so
//! concurrent connections never share a byte. A failure is written on the pair's error stream,
//! worded as the kubelet words it.
//!
//! At most [`MAX_WAITING`] request ids wait for their other half (each for at most
//! [`STREAM_CREATION_TIMEOUT`]); a stream that would start one more is reset. The forwarded
//! connections are tasks owned by the connection's handler, so they end with it.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use neocloud_protocol::session::{Frame, SessionRequest, chunks, split_frames};
use tokio::task::JoinSet;

use super::super::spdy::{Connection, Stream, StreamReader, StreamWriter};
use super::super::workloads::{PodRef, Workloads};
use super::STREAM_CREATION_TIMEOUT;

/// Request ids waiting for the other stream of their pair, on one connection.
pub(crate) const MAX_WAITING: usize = 32;

/// The half of a pair that arrived first, waiting for the other.
struct Waiting {
    error: Option<Stream>,
    data: Option<Stream>,
    since: tokio::time::Instant,
}

/// The request id of `stream`: its `requestid` header, or for clients too old to send one, the
/// id the kubelet derives from the stream's own (a pair's data stream follows its error stream).
fn request_id(stream: &Stream, kind: &str) -> String {
    match stream.header("requestid") {
        Some(id) => id.to_owned(),
        None if kind == "data" => stream.id().saturating_sub(2).to_string(),
        None => stream.id().to_string(),
    }
}

/// Serves port-forwards for `pod` until the client closes the connection.
pub(crate) async fn serve_port_forward(
    mut conn: Connection,
    source: Arc<dyn Workloads>,
    pod: PodRef,
) {
    let mut waiting: HashMap<String, Waiting> = HashMap::new();
    let mut forwards = JoinSet::new();
    let mut sweep = tokio::time::interval(STREAM_CREATION_TIMEOUT / 4);
    loop {
        let stream = tokio::select! {
            stream = conn.accept() => match stream {
                Some(stream) => stream,
                None => break,
            },
            _ = sweep.tick() => {
                expire(&mut waiting).await;
                continue;
            }
            Some(_) = forwards.join_next() => continue,
        };
        let kind = stream.header("streamtype").unwrap_or_default().to_owned();
        let id = request_id(&stream, &kind);
        if !waiting.contains_key(&id) && waiting.len() >= MAX_WAITING {
            tracing::debug!(
                request = id,
                max = MAX_WAITING,
                "kubelet: too many port-forward requests waiting for their other stream; resetting"
            );
            stream.split().1.reset().await;
            continue;
        }
        let entry = waiting.entry(id.clone()).or_insert_with(|| Waiting {
            error: None,
            data: None,
            since: tokio::time::Instant::now(),
        });
        match kind.as_str() {
            "error" => entry.error = Some(stream),
            "data" => entry.data = Some(stream),
            other => {
                tracing::debug!(
                    kind = other,
                    "kubelet: unexpected port-forward stream; resetting it"
                );
                stream.split().1.reset().await;
                continue;
            }
        }
        if entry.error.is_some()
            && entry.data.is_some()
            && let Some(Waiting {
                error: Some(error),
                data: Some(data),
                ..
            }) = waiting.remove(&id)
        {
            forwards.spawn(forward(source.clone(), pod.clone(), error, data));
        }
    }
    conn.close().await;
}

/// Ends the pairs whose other half did not come in time, saying so on the error stream.
async fn expire(waiting: &mut HashMap<String, Waiting>) {
    let now = tokio::time::Instant::now();
    let late: Vec<String> = waiting
        .iter()
        .filter(|(_, w)| now.duration_since(w.since) >= STREAM_CREATION_TIMEOUT)
        .map(|(id, _)| id.clone())
        .collect();
    for id in late {
        let Some(pair) = waiting.remove(&id) else {
            continue;
        };
        if let Some(error) = pair.error {
            let (_, writer) = error.split();
            let _ = writer
                .write(format!("timed out waiting for the data stream of request {id}").as_bytes())
                .await;
            let _ = writer.finish().await;
        }
        if let Some(data) = pair.data {
            data.split().1.reset().await;
        }
    }
}

/// Forwards one connection: opens a session on the runner for the pair's port and copies bytes
/// both ways until both sides have finished.
async fn forward(source: Arc<dyn Workloads>, pod: PodRef, error: Stream, data: Stream) {
    let port_header = data.header("port").unwrap_or_default().to_owned();
    let (_, error) = error.split();
    let (data_in, data_out) = data.split();
    let result = match port_header.parse::<u16>() {
        Ok(port) if port > 0 => run(&source, &pod, port, data_in, &data_out).await,
        _ => Err(format!(
            "invalid port {port_header:?}: expected a number from 1 to 65535"
        )),
    };
    if let Err(message) = result {
        let message = format!("error forwarding port {port_header} to pod {pod}: {message}");
        tracing::debug!(%message, "kubelet: port-forward failed");
        let _ = error.write(message.as_bytes()).await;
    }
    let _ = error.finish().await;
    let _ = data_out.finish().await;
}

async fn run(
    source: &Arc<dyn Workloads>,
    pod: &PodRef,
    port: u16,
    mut data_in: StreamReader,
    data_out: &StreamWriter,
) -> Result<(), String> {
    let session = source
        .open_session(pod, None, SessionRequest::PortForward { port })
        .await
        .map_err(|e| e.to_string())?;
    let (mut from_runner, mut to_runner) = split_frames(session);
    // The only writer towards the runner: the caller's bytes, then their end. Owned here, so
    // it ends with this forward however that ends.
    let mut upstream = JoinSet::new();
    upstream.spawn(async move {
        while let Some(bytes) = data_in.read().await {
            for chunk in chunks(&bytes) {
                if to_runner.send(Frame::Data(chunk.to_vec())).await.is_err() {
                    return;
                }
            }
        }
        let _ = to_runner.send(Frame::DataEnd).await;
    });
    let outcome = loop {
        match from_runner.next().await {
            Some(Ok(Frame::Data(bytes))) => {
                if data_out.write(&bytes).await.is_err() {
                    break Ok(());
                }
            }
            Some(Ok(Frame::DataEnd)) => {
                let _ = data_out.finish().await;
            }
            Some(Ok(Frame::Error(message))) => break Err(message),
            Some(Ok(other)) => tracing::debug!(?other, "kubelet: unexpected frame from the runner"),
            None => break Ok(()),
            Some(Err(e)) => break Err(format!("the runner's session failed: {e}")),
        }
    };
    upstream.abort_all();
    outcome
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use futures::stream::BoxStream;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::super::spdy::frame::{self, Deflater, Frame, Inflater, status};
    use super::super::super::workloads::LogError;
    use super::*;
    use neocloud_remote::callback::LogOptions;

    /// A Pod nothing is ever forwarded to: no pair here completes.
    struct Nowhere;

    #[async_trait::async_trait]
    impl Workloads for Nowhere {
        async fn logs(
            &self,
            pod: &PodRef,
            _: &str,
            _: LogOptions,
        ) -> Result<BoxStream<'static, Bytes>, LogError> {
            Err(LogError::PodNotFound { pod: pod.clone() })
        }
    }

    #[tokio::test]
    async fn requests_waiting_for_their_other_stream_are_bounded() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let pod = PodRef {
            namespace: "ns".into(),
            name: "job".into(),
        };
        let serving = tokio::spawn(serve_port_forward(
            Connection::new(server),
            Arc::new(Nowhere),
            pod,
        ));
        let (mut read, mut write) = tokio::io::split(client);
        let (mut out, mut deflater) = (Vec::new(), Deflater::default());
        // One error stream per request id, and never its data stream.
        for n in 0..=MAX_WAITING as u32 {
            let headers = [
                ("streamtype", "error".to_owned()),
                ("requestid", n.to_string()),
            ]
            .map(|(name, value)| (name.to_owned(), value))
            .to_vec();
            let syn = Frame::SynStream(2 * n + 1, false, headers);
            syn.encode(&mut out, &mut deflater).unwrap();
        }
        write.write_all(&out).await.unwrap();
        let (mut buf, mut inflater) = (BytesMut::new(), Inflater::default());
        let reset = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                while let Some(f) = frame::decode(&mut buf, &mut inflater).unwrap() {
                    if let Frame::RstStream(stream, status::CANCEL) = f {
                        return stream;
                    }
                }
                assert!(read.read_buf(&mut buf).await.unwrap() > 0, "the end");
            }
        });
        let reset = reset.await.expect("one request too many was reset");
        assert_eq!(
            reset,
            2 * MAX_WAITING as u32 + 1,
            "the first past the bound"
        );
        serving.abort();
    }
}
