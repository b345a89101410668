//! The callback's HTTPS API (JSON; TLS only, there is no plain-HTTP listener):
//!
//! - `POST /v1/token` `{"bootstrapToken"}` → `{"sessionToken", "expiresAt", "spiffeId"}`;
//!   rate limited per client IP.
//! - `POST /v1/token/reauth` `{"credential"}` → a session for the binding the credential names,
//!   when the node no longer accepts the runner's session; rate limited per client IP.
//! - `POST /v1/token/refresh` (Bearer) → a fresh session for the same binding.
//! - `GET /v1/workload` (Bearer) → the [`Workload`](super::Workload), env values included; for
//!   the runner of a machine rented ahead of its Pod (held for a ProvisioningRequest), 409 with
//!   the code [`HELD_FOR_A_POD`](neocloud_protocol::HELD_FOR_A_POD) until a Pod takes it.
//! - `GET /v1/handover` (Bearer) → the [`Handover`](super::Handover) of a held machine: empty
//!   while it waits (each poll is a sign of life), then the bootstrap token and boot credential
//!   of the Pod that took it, with which its runner authenticates again as that Pod's.
//! - `POST /v1/status` (Bearer) [`StatusReport`](super::StatusReport).
//! - `POST /v1/heartbeat` (Bearer) with an optional [`Heartbeat`](super::Heartbeat) → 204.
//! - `POST /v1/stats` (Bearer) with a `WorkloadStats` → 204: the workload's latest usage.
//! - `POST /v1/logs` (Bearer) newline-delimited [`LogRecord`](super::LogRecord)s, streamed.
//! - `GET /v1/sessions` (Bearer) → the next [`SessionOffer`](neocloud_protocol::session::SessionOffer)
//!   of the binding (a long poll, 204 when none came), and `GET /v1/sessions/{id}` (Bearer,
//!   `Upgrade`) → 101 and the session's frames ([`super::sessions`]).
//!
//! A session names exactly one binding and one rental of it, and no route takes a binding from
//! the request, so a runner can only ever read or write its own binding, and only while its
//! rental is current: every authenticated route (refresh, workload, status, heartbeat, stats,
//! logs, sessions) refuses a runner of a replaced or lost rental with 403 and the code
//! [`RENTAL_NOT_CURRENT`](neocloud_protocol::RENTAL_NOT_CURRENT), before it changes anything. Authenticated routes are rate limited per
//! binding. Errors are `{"error": "..."}` and never echo a token or an env value. A binding the
//! node has not found again yet after a restart is 503 with `Retry-After` (try again), one that
//! is gone or whose runner was declared lost is 403.
//!
//! Not the kubelet API that serves logs to `kubectl logs`: that reads through
//! [`CallbackHandle::read_logs`](super::CallbackHandle::read_logs).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, FromRequestParts, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::logs::{IngestError, MAX_LOG_RECORD, ingest};
use super::state::{CallbackHandle, State as Shared, monitor_heartbeats};
use super::tokens::{IssuedSession, TokenError};
use super::{CallbackConfig, CallbackError, RunnerEvent};
use super::{ErrorBody, Heartbeat, ReauthRequest, StatusReport, TokenRequest, TokenResponse};
use crate::serving::{ServerStopped, Tasks, first_to_end};
use crate::tls::{ClientAddr, TlsListener, TlsMaterial};

/// How long [`CallbackServer::shutdown`] lets requests in flight finish before cutting them.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) type AppState = State<Arc<Shared>>;

/// A running callback server.
#[derive(Debug)]
pub struct CallbackServer {
    handle: CallbackHandle,
    local_addr: SocketAddr,
    cert_pem: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    accepting: JoinHandle<()>,
    monitor: JoinHandle<()>,
    connections: Tasks,
}

impl CallbackServer {
    /// Binds `config.listen`, serves HTTPS with `tls`, and returns the server with the channel
    /// of runner events (which the node must drain; a full channel slows runners' reports).
    pub async fn start(
        config: CallbackConfig,
        tls: &TlsMaterial,
    ) -> Result<(Self, mpsc::Receiver<RunnerEvent>), CallbackError> {
        let tcp = TcpListener::bind(config.listen).await.map_err(|e| {
            CallbackError::Bind(format!("failed to listen on {}: {e}", config.listen))
        })?;
        let (listener, accepting) = TlsListener::new(tcp, tls.server_config(None)?, "callback")?;
        let local_addr = axum::serve::Listener::local_addr(&listener)
            .map_err(|e| CallbackError::Bind(e.to_string()))?;
        let (events_tx, events) = mpsc::channel(1024);
        let timeout = config.heartbeat_timeout;
        let limits = config.serve;
        let state = Arc::new(Shared::new(config, events_tx)?);
        let monitor = tokio::spawn(monitor_heartbeats(Arc::downgrade(&state), timeout));
        let (stop, stopped) = watch::channel(false);
        let connections = Tasks::default();
        let serve = crate::serving::serve(
            listener,
            routes(state.clone()),
            limits,
            |_, addr| ClientAddr(addr),
            stopped,
            connections.clone(),
        );
        let task = tokio::spawn(serve);
        tracing::info!(addr = %local_addr, "callback: serving runners over TLS");
        let server = Self {
            handle: CallbackHandle(state),
            local_addr,
            cert_pem: tls.cert_pem().to_string(),
            stop,
            task,
            accepting,
            monitor,
            connections,
        };
        Ok((server, events))
    }

    /// The handle to register workloads and read logs.
    pub fn handle(&self) -> CallbackHandle {
        self.handle.clone()
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The certificate runners must trust, in PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Serves until one of the server's tasks ends by itself (a panic), which it says; never
    /// returns while the server works. Dropping the future stops the server.
    pub async fn serve(mut self) -> ServerStopped {
        let tasks = vec![
            ("HTTP service", &mut self.task),
            ("TLS accept loop", &mut self.accepting),
            ("heartbeat monitor", &mut self.monitor),
        ];
        first_to_end("callback", tasks).await
    }

    /// Stops accepting, lets requests in flight finish (for up to 10 s, then cuts them), and
    /// waits. An open log stream is not waited for (it may stay open for seconds): it is
    /// answered 503 at once, so the runner sends its records again to whichever node serves
    /// next.
    pub async fn shutdown(self) {
        self.handle.0.closing.send_replace(true);
        self.stop.send_replace(true);
        self.connections.shut_down(SHUTDOWN_GRACE).await;
    }
}

impl Drop for CallbackServer {
    fn drop(&mut self) {
        self.task.abort();
        self.accepting.abort();
        self.monitor.abort();
        self.connections.stop();
    }
}

fn routes(state: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/token", post(token))
        .route("/v1/token/reauth", post(reauth))
        .route("/v1/token/refresh", post(refresh))
        .route("/v1/workload", get(workload))
        .route("/v1/handover", get(handover))
        .route("/v1/status", post(status))
        .route("/v1/heartbeat", post(heartbeat))
        .route("/v1/stats", post(stats))
        .route("/v1/logs", post(logs))
        .route("/v1/sessions", get(super::sessions::poll))
        .route("/v1/sessions/{id}", get(super::sessions::dial))
        .route("/v1/egress/{index}", get(super::egress::connect))
        .with_state(state)
}

pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        error: message.into(),
        code: None,
    };
    (status, Json(body)).into_response()
}

pub(super) fn refusal(e: &CallbackError) -> Response {
    let (status, code) = match e {
        CallbackError::RentalNotCurrent { .. } => (
            StatusCode::FORBIDDEN,
            Some(neocloud_protocol::RENTAL_NOT_CURRENT),
        ),
        CallbackError::HeldForAPod(_) => (
            StatusCode::CONFLICT,
            Some(neocloud_protocol::HELD_FOR_A_POD),
        ),
        CallbackError::Token(TokenError::InvalidName { .. }) => (StatusCode::BAD_REQUEST, None),
        CallbackError::Token(_) | CallbackError::CredentialSpent { .. } => {
            (StatusCode::UNAUTHORIZED, None)
        }
        CallbackError::NotRegistered(_) | CallbackError::RunnerGone { .. } => {
            (StatusCode::FORBIDDEN, None)
        }
        CallbackError::NoPreviousRun(_) | CallbackError::EgressNotNamed { .. } => {
            (StatusCode::NOT_FOUND, None)
        }
        CallbackError::NotHeld { .. } => (StatusCode::CONFLICT, None),
        CallbackError::NotAdoptedYet(_) | CallbackError::EgressUnavailable => {
            return unavailable(e.to_string());
        }
        CallbackError::TooManySessions { .. } | CallbackError::TooManyEgress { .. } => {
            (StatusCode::TOO_MANY_REQUESTS, None)
        }
        CallbackError::SessionTimeout { .. } => (StatusCode::GATEWAY_TIMEOUT, None),
        CallbackError::Tls(_) | CallbackError::Bind(_) | CallbackError::SessionFailed { .. } => {
            (StatusCode::INTERNAL_SERVER_ERROR, None)
        }
    };
    let body = ErrorBody {
        error: e.to_string(),
        code: code.map(str::to_owned),
    };
    (status, Json(body)).into_response()
}

/// 503 with `Retry-After`: the runner tries again shortly.
fn unavailable(message: impl Into<String>) -> Response {
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, message);
    let again = HeaderValue::from_static("2");
    response.headers_mut().insert(header::RETRY_AFTER, again);
    response
}

pub(super) fn no_store(mut response: Response) -> Response {
    let value = HeaderValue::from_static("no-store");
    response.headers_mut().insert(header::CACHE_CONTROL, value);
    response
}

/// A session, with the renewal credential of its rental.
fn session_response(state: &Shared, session: IssuedSession) -> Response {
    let uid = session.spiffe_id.rsplit('/').next().unwrap_or_default();
    let credential = state.renewal(uid, session.rental);
    no_store(
        Json(TokenResponse {
            session_token: session.token.expose().to_string(),
            expires_at: session.expires_at,
            spiffe_id: session.spiffe_id,
            credential: credential.map(|c| c.expose().to_owned()),
        })
        .into_response(),
    )
}

async fn token(
    State(state): AppState,
    ConnectInfo(ClientAddr(peer)): ConnectInfo<ClientAddr>,
    body: Bytes,
) -> Response {
    if !state.token_limiter.allow(&peer.ip()) {
        tracing::warn!(%peer, "callback: token exchange rate limited");
        return error(StatusCode::TOO_MANY_REQUESTS, "too many token requests");
    }
    let Ok(request) = serde_json::from_slice::<TokenRequest>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "request body must be {\"bootstrapToken\": string}",
        );
    };
    match state.exchange(&request.bootstrap_token) {
        Ok(session) => {
            tracing::info!(%peer, spiffe_id = %session.spiffe_id, rental = session.rental, "callback: runner authenticated");
            session_response(&state, session)
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "callback: token exchange refused");
            refusal(&e)
        }
    }
}

async fn reauth(
    State(state): AppState,
    ConnectInfo(ClientAddr(peer)): ConnectInfo<ClientAddr>,
    body: Bytes,
) -> Response {
    if !state.token_limiter.allow(&peer.ip()) {
        tracing::warn!(%peer, "callback: re-authentication rate limited");
        return error(StatusCode::TOO_MANY_REQUESTS, "too many token requests");
    }
    let Ok(request) = serde_json::from_slice::<ReauthRequest>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "request body must be {\"credential\": string}",
        );
    };
    match state.reauthenticate(&request.credential) {
        Ok(session) => {
            tracing::info!(%peer, spiffe_id = %session.spiffe_id, rental = session.rental, "callback: runner re-authenticated");
            session_response(&state, session)
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "callback: re-authentication refused");
            refusal(&e)
        }
    }
}

/// The binding and rental a request's session token proves (the rental current); rate limited
/// per binding.
pub(super) struct Authed(pub(super) String, pub(super) u64);

impl FromRequestParts<Arc<Shared>> for Authed {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<Shared>,
    ) -> Result<Self, Self::Rejection> {
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| error(StatusCode::UNAUTHORIZED, "missing bearer session token"))?;
        let (uid, rental) = state.authenticate(bearer.trim()).map_err(|e| {
            tracing::warn!(path = %parts.uri.path(), error = %e, "callback: request refused");
            refusal(&e)
        })?;
        if !state.request_limiter.allow(&uid) {
            tracing::warn!(binding = %uid, "callback: requests rate limited");
            return Err(error(StatusCode::TOO_MANY_REQUESTS, "too many requests"));
        }
        Ok(Self(uid, rental))
    }
}

async fn refresh(State(state): AppState, Authed(uid, rental): Authed) -> Response {
    session_response(&state, state.refresh(&uid, rental))
}

/// The workload; its restart policy only for a runner that says it restarts in place, its
/// probes only for one that says it runs them, and its egress destinations only for one that
/// says it serves them (an older runner refuses a field it does not know, and leaves restarts
/// to the node).
async fn workload(
    State(state): AppState,
    Authed(uid, rental): Authed,
    RawQuery(query): RawQuery,
) -> Response {
    let asked = |what: &str| {
        query
            .as_deref()
            .is_some_and(|q| q.split('&').any(|pair| pair == what))
    };
    match state.workload(&uid, rental) {
        Ok(mut workload) => {
            if !asked(neocloud_protocol::WORKLOAD_RESTARTS_QUERY) {
                workload.restart_policy = None;
            }
            if !asked(neocloud_protocol::WORKLOAD_PROBES_QUERY) {
                if workload.probes.is_some() {
                    tracing::warn!(binding = %uid, "callback: the runner does not run probes; the Pod's probes are not run");
                }
                workload.probes = None;
            }
            if !asked(neocloud_protocol::WORKLOAD_EGRESS_QUERY) {
                if !workload.egress.is_empty() {
                    tracing::warn!(binding = %uid, "callback: the runner does not serve egress; the Pod's egress destinations are not reachable");
                }
                workload.egress.clear();
            }
            no_store(Json(workload).into_response())
        }
        Err(e) => refusal(&e),
    }
}

/// The handover of a held machine: the Pod's secrets once a Pod took it, `{}` until then.
async fn handover(State(state): AppState, Authed(uid, rental): Authed) -> Response {
    match state.handover(&uid, rental) {
        Ok(handover) => no_store(Json(handover).into_response()),
        Err(e) => refusal(&e),
    }
}

async fn status(State(state): AppState, Authed(uid, rental): Authed, body: Bytes) -> Response {
    let report: StatusReport = match serde_json::from_slice(&body) {
        Ok(report) => report,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid status: {e}")),
    };
    tracing::info!(binding = %uid, state = ?report.state, exit_code = ?report.exit_code, restarts = report.restart_count, "callback: runner state");
    match state.report(&uid, rental, report).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(&e),
    }
}

async fn heartbeat(State(state): AppState, Authed(uid, rental): Authed, body: Bytes) -> Response {
    let beat = if body.iter().all(u8::is_ascii_whitespace) {
        Heartbeat::default()
    } else {
        match serde_json::from_slice::<Heartbeat>(&body) {
            Ok(beat) => beat,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid heartbeat: {e}")),
        }
    };
    match state.heartbeat(&uid, rental, beat.state).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(&e),
    }
}

async fn stats(State(state): AppState, Authed(uid, rental): Authed, body: Bytes) -> Response {
    let stats = match serde_json::from_slice::<neocloud_protocol::WorkloadStats>(&body) {
        Ok(stats) => stats,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid stats: {e}")),
    };
    match state.record_stats(&uid, rental, stats) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(&e),
    }
}

async fn logs(State(state): AppState, Authed(uid, rental): Authed, body: Body) -> Response {
    // The refusal of a rental that is no longer current keeps its code for the runner.
    let mut refused = None;
    let append = |record| {
        state.append_log(&uid, rental, record).map_err(|e| {
            let message = e.to_string();
            refused = Some(e);
            message
        })
    };
    let ingesting = ingest(body.into_data_stream(), MAX_LOG_RECORD, append);
    let mut closing = state.closing.subscribe();
    let ingested = tokio::select! {
        ingested = ingesting => ingested,
        _ = closing.wait_for(|closing| *closing) => {
            let message = "the node is shutting down: send the records again";
            return unavailable(message);
        }
    };
    let status = match &ingested {
        Ok(accepted) => return Json(serde_json::json!({ "accepted": accepted })).into_response(),
        Err(IngestError::TooLong { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
        Err(IngestError::Refused(_)) => {
            if let Some(e) = refused {
                return refusal(&e);
            }
            StatusCode::FORBIDDEN
        }
        Err(IngestError::Invalid { .. } | IngestError::Read(_)) => StatusCode::BAD_REQUEST,
    };
    let message = ingested.err().map(|e| e.to_string()).unwrap_or_default();
    error(status, message)
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "failover_tests.rs"]
mod failover_tests;

#[cfg(test)]
#[path = "rental_tests.rs"]
mod rental_tests;
