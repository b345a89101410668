//! Egress: a runner's connection to an in-cluster destinations its Pod named
//! (`cloud.aibrix.ai/egress`), carried back through the node. `GET /v1/egress/{index}` upgraded,
//! with the runner's session: the index must name one of the destinations registered with the
//! binding's workload (else 404, and nothing is dialled: the node is not an open proxy), the
//! binding must have fewer than [`EgressConfig::max_connections_per_binding`] open (else 429).
//! Then 101, and the node's [`EgressDialer`] dials the destination within the connect timeout;
//! a failure is one `Error` frame, success a relay of `Data` frames until both sides close or
//! nothing moves for the idle timeout.
//!
//! Not how a destination is found in the cluster (the node's dialer, which reads the Kubernetes
//! API) nor what the runner does on the machine (`neocloud-runner`'s `egress`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::SinkExt;
use neocloud_protocol::EgressTarget;
use neocloud_protocol::session::{Frame, SESSION_UPGRADE, frame_writer};

use super::CallbackError;
use super::server::{AppState, Authed, refusal};
use super::sessions::{SessionIo, upgrade};

/// Dials an in-cluster destination for a runner's egress connection.
#[async_trait::async_trait]
pub trait EgressDialer: Send + Sync + 'static {
    /// A connection to `target`, or why there is none, in words for the workload's side ("no
    /// Service ml/registry", "connection refused"). Called once per connection, concurrently;
    /// the caller bounds it by the connect timeout.
    async fn dial(&self, target: &EgressTarget) -> Result<SessionIo, String>;
}

/// How egress connections are dialled and bounded.
#[derive(Clone)]
pub struct EgressConfig {
    /// The dialer; without one every egress connection is refused (503).
    pub dialer: Option<Arc<dyn EgressDialer>>,
    /// Egress connections a binding may have open at once (64).
    pub max_connections_per_binding: usize,
    /// How long a dial may take (10 s).
    pub connect_timeout: Duration,
    /// A connection on which nothing moved either way this long is closed (10 min).
    pub idle_timeout: Duration,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            dialer: None,
            max_connections_per_binding: 64,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
        }
    }
}

impl std::fmt::Debug for EgressConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressConfig")
            .field("dialer", &self.dialer.is_some())
            .field(
                "max_connections_per_binding",
                &self.max_connections_per_binding,
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

/// What a binding's workload names at one index.
pub(crate) struct Named {
    /// The destination, if the index names one.
    pub(crate) target: Option<EgressTarget>,
    /// How many destinations it names.
    pub(crate) count: usize,
    /// Its egress connections open.
    pub(crate) open: Arc<AtomicUsize>,
}

/// One open egress connection under the binding's cap; freed when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: Arc<AtomicUsize>, limit: usize) -> Option<Self> {
        let taken = open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < limit).then_some(n + 1)
        });
        taken.is_ok().then_some(Self(open))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `GET /v1/egress/{index}` with `Upgrade`: 101, then the destination's connection.
pub(super) async fn connect(
    State(state): AppState,
    Authed(uid, rental): Authed,
    Path(index): Path<String>,
    mut request: Request,
) -> Response {
    // Refused before anything is admitted, as a session is; then the Pod's list decides.
    let upgrade = match upgrade(&mut request, "egress") {
        Ok(upgrade) => upgrade,
        Err(refused) => return *refused,
    };
    let config = state.config.egress.clone();
    let admitted = admit(&state, &uid, rental, &index, &config);
    let (target, slot, dialer) = match admitted {
        Ok(admitted) => admitted,
        Err(e) => {
            tracing::warn!(binding = %uid, index, error = %e, "callback: egress refused");
            return refusal(&e);
        }
    };
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let io = hyper_util::rt::TokioIo::new(upgraded);
        carry(io, &target, dialer.as_ref(), &config).await;
        tracing::debug!(binding = %uid, %target, "callback: egress connection closed");
        drop(slot);
    });
    let headers = [
        (header::CONNECTION, "upgrade"),
        (header::UPGRADE, SESSION_UPGRADE),
    ];
    (StatusCode::SWITCHING_PROTOCOLS, headers).into_response()
}

/// The destination at `index`, a place under the cap and the dialer, or why not.
fn admit(
    state: &super::state::State,
    uid: &str,
    rental: u64,
    index: &str,
    config: &EgressConfig,
) -> Result<(EgressTarget, Slot, Arc<dyn EgressDialer>), CallbackError> {
    let dialer = config
        .dialer
        .clone()
        .ok_or(CallbackError::EgressUnavailable)?;
    let named = state.egress(uid, rental, index.parse().unwrap_or(usize::MAX))?;
    let target = named.target.ok_or_else(|| CallbackError::EgressNotNamed {
        uid: uid.to_owned(),
        index: index.to_owned(),
        named: named.count,
    })?;
    let limit = config.max_connections_per_binding;
    let slot = Slot::take(named.open, limit).ok_or_else(|| CallbackError::TooManyEgress {
        uid: uid.to_owned(),
        limit,
    })?;
    Ok((target, slot, dialer))
}

/// Dials `target` and relays `io` to it; a failed dial is an `Error` frame on `io`.
async fn carry<S>(io: S, target: &EgressTarget, dialer: &dyn EgressDialer, config: &EgressConfig)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin,
{
    let timeout = config.connect_timeout;
    let dialed = match tokio::time::timeout(timeout, dialer.dial(target)).await {
        Ok(dialed) => dialed,
        Err(_) => Err(format!(
            "no connection within {timeout:?} (the egress connect timeout)"
        )),
    };
    match dialed {
        Ok(socket) => {
            let relayed = neocloud_protocol::relay::relay(socket, io, Some(config.idle_timeout));
            if let Err(e) = relayed.await {
                tracing::debug!(%target, error = %e, "callback: egress relay ended");
            }
        }
        Err(why) => {
            tracing::info!(%target, why, "callback: egress destination unreachable");
            let mut writer = frame_writer(io);
            let message = format!("failed to connect to {target} from the cluster: {why}");
            let _ = writer.send(Frame::Error(message)).await;
            let _ = writer.close().await;
        }
    }
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
