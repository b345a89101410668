//! `GET /relay/{uid}/{port}` upgraded to [`RELAY_UPGRADE`]: a relay Pod carrying one connection
//! to a burst Pod's port (see [`super`]). The relay authenticates with its own bearer
//! token, not the cluster's: the [`RelayTable`] admits it for its own Pod's declared ports only.
//! The node opens a port-forward session to the workload (through its runner or its remote
//! cluster) before it answers 101, so a relay learns at once why a connection cannot be carried;
//! then the upgraded connection's raw bytes and the session's frames are spliced, each side's
//! end passed on. The connection keeps its place under the listener's connection cap until it
//! ends, and is a tracked task that shutdown ends.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use neocloud_protocol::session::{Frame, chunks, split_frames};
use neocloud_remote::callback::SessionIo;
use neocloud_remote::serving::ConnectionSlot;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::relay::{RELAY_UPGRADE, RelayTable};
use crate::server::App;

/// Bytes read from the relay at a time.
const CHUNK: usize = 64 * 1024;

fn refused(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

/// The relay route.
pub(crate) async fn relay(
    State(app): State<Arc<App>>,
    Path((uid, port)): Path<(String, String)>,
    mut request: Request,
) -> Response {
    let Some(table) = app.relays.clone() else {
        return refused(StatusCode::NOT_FOUND, "this node serves no relays".into());
    };
    let Some(token) = bearer(request.headers()) else {
        return refused(
            StatusCode::UNAUTHORIZED,
            "a relay authenticates with Authorization: Bearer <its token>".into(),
        );
    };
    let port = match port.parse::<u16>() {
        Ok(port) if port > 0 => port,
        _ => {
            let message = format!("port {port:?} is not a number from 1 to 65535");
            return refused(StatusCode::BAD_REQUEST, message);
        }
    };
    if !asks_for_relay(request.headers()) {
        let message = format!("a relay needs Connection: upgrade and Upgrade: {RELAY_UPGRADE}");
        return refused(StatusCode::UPGRADE_REQUIRED, message);
    }
    let pod = match admit(&table, &uid, &token, port) {
        Ok(pod) => pod,
        Err(response) => return response,
    };
    let Some(upgrade) = request
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
    else {
        return refused(
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded".into(),
        );
    };
    if let Err(e) = app.source.check_session(&pod, None, "port-forward") {
        return refused(e.stream_status(), e.to_string());
    }
    let session = match app.source.open_relayed(&pod, port).await {
        Ok(session) => session,
        Err(e) => return refused(e.stream_status(), e.to_string()),
    };
    let slot = request.extensions().get::<ConnectionSlot>().cloned();
    app.tasks.spawn(async move {
        let _slot = slot;
        match upgrade.await {
            Ok(upgraded) => {
                let io = hyper_util::rt::TokioIo::new(upgraded);
                if let Err(message) = splice(io, session).await {
                    tracing::debug!(%pod, port, %message, "kubelet: relayed connection failed");
                }
            }
            Err(e) => tracing::debug!(%pod, port, error = %e, "kubelet: relay upgrade failed"),
        }
    });
    let headers = [
        (header::CONNECTION, "upgrade"),
        (header::UPGRADE, RELAY_UPGRADE),
    ];
    (StatusCode::SWITCHING_PROTOCOLS, headers).into_response()
}

#[allow(clippy::result_large_err)]
fn admit(table: &RelayTable, uid: &str, token: &str, port: u16) -> Result<super::PodRef, Response> {
    table.admit(uid, token, port).map_err(|refusal| {
        tracing::debug!(uid, port, %refusal, "kubelet: relay refused");
        refused(refusal.status(), refusal.to_string())
    })
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

fn asks_for_relay(headers: &HeaderMap) -> bool {
    let has = |name, token: &str| {
        headers.get_all(name).iter().any(|value| {
            value
                .to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, RELAY_UPGRADE)
}

/// Copies `io`'s bytes into `session` as `Data` frames (its end as `DataEnd`) and the session's
/// `Data` back, shutting `io` for writing at the session's `DataEnd`, until the session ends.
pub(crate) async fn splice<S>(io: S, session: SessionIo) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut from_relay, mut to_relay) = tokio::io::split(io);
    let (mut from_runner, mut to_runner) = split_frames(session);
    let mut upstream = tokio::task::JoinSet::new();
    upstream.spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from_relay.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    for chunk in chunks(&buf[..n]) {
                        if to_runner.send(Frame::Data(chunk.to_vec())).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        let _ = to_runner.send(Frame::DataEnd).await;
    });
    let outcome = loop {
        match from_runner.next().await {
            Some(Ok(Frame::Data(bytes))) => {
                if to_relay.write_all(&bytes).await.is_err() {
                    break Ok(());
                }
            }
            Some(Ok(Frame::DataEnd)) => {
                let _ = to_relay.shutdown().await;
            }
            Some(Ok(Frame::Error(message))) => break Err(message),
            Some(Ok(other)) => tracing::debug!(?other, "kubelet: unexpected frame on a relay"),
            None => break Ok(()),
            Some(Err(e)) => break Err(format!("the session failed: {e}")),
        }
    };
    let _ = to_relay.shutdown().await;
    upstream.abort_all();
    outcome
}
