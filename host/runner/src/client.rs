//! The runner's HTTPS client of the node's callback API: trusts only the CA it was given,
//! refuses plain HTTP, exchanges the bootstrap token, refreshes the session before it expires,
//! gets a new session with its re-authentication credential when the node refuses the one it
//! has (401: the session expired while the node was away), and turns refusals into errors that
//! say what the node answered. The credential it starts with is the boot credential of its
//! `user_data`; each session the node issues comes with a renewal credential, which replaces
//! it (in memory only). A refusal saying the runner's rental is no longer current
//! ([`RENTAL_NOT_CURRENT`]) is also signalled on [`CallbackClient::revoked`], for the runner to
//! stop its workload.
//!
//! Not the runner's control flow: see [`crate::run`].

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use futures::Stream;
use reqwest::{Certificate, Client, Method, RequestBuilder, StatusCode, Url};
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use neocloud_protocol::session::{SESSION_UPGRADE, SessionOffer};
use neocloud_protocol::{
    ErrorBody, HELD_FOR_A_POD, Heartbeat, RENTAL_NOT_CURRENT, ReauthRequest, RunnerState, Secret,
    SessionToken, StatusReport, TokenRequest, TokenResponse, Workload, WorkloadStats, unix_now,
};

use crate::RunnerError;

/// Timeout of one request (the default of [`CallbackClient::with_request_timeout`]); the log
/// stream is watched by [`crate::watchdog`] instead.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of connecting to the node (TCP and TLS).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Session {
    token: SessionToken,
    issued_at: i64,
    expires_at: i64,
}

/// A client of one callback server for one binding.
#[derive(Debug)]
pub struct CallbackClient {
    http: Client,
    base: Url,
    session: Mutex<Option<Session>>,
    credential: parking_lot::Mutex<Option<Secret>>,
    revoked: tokio::sync::watch::Sender<bool>,
    request_timeout: Duration,
}

impl CallbackClient {
    /// A client of `url` (which must be `https://`) trusting only the certificates in `ca_pem`.
    pub fn new(url: &str, ca_pem: &[u8]) -> Result<Self, RunnerError> {
        let base = Url::parse(url).map_err(|e| RunnerError::Url(format!("{url:?}: {e}")))?;
        if base.scheme() != "https" {
            return Err(RunnerError::Url(format!(
                "{url:?}: the callback URL must use https (the node sends secrets to the runner)"
            )));
        }
        let roots = Certificate::from_pem_bundle(ca_pem)
            .map_err(|e| RunnerError::Ca(format!("failed to parse the CA certificate: {e}")))?;
        if roots.is_empty() {
            return Err(RunnerError::Ca("no certificate found in the CA PEM".into()));
        }
        let mut builder = Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .https_only(true)
            .connect_timeout(CONNECT_TIMEOUT);
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
        let http = builder
            .build()
            .map_err(|e| RunnerError::Ca(format!("failed to build the HTTPS client: {e}")))?;
        Ok(Self {
            http,
            base,
            session: Mutex::new(None),
            credential: parking_lot::Mutex::new(None),
            revoked: tokio::sync::watch::Sender::new(false),
            request_timeout: REQUEST_TIMEOUT,
        })
    }

    /// The same client, giving up on a request the node has not answered within `timeout`
    /// (30 s by default); a log stream fails when the node takes none of it for that long.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The same client, re-authenticating with `credential` when its session is refused.
    pub fn with_credential(self, credential: Option<Secret>) -> Self {
        *self.credential.lock() = credential;
        self
    }

    /// Whether this client has a re-authentication credential.
    pub fn can_reauthenticate(&self) -> bool {
        self.credential.lock().is_some()
    }

    /// Becomes true once the node has said this runner's rental is no longer current.
    pub fn revoked(&self) -> tokio::sync::watch::Receiver<bool> {
        self.revoked.subscribe()
    }

    /// Notes a refusal of the runner's rental on [`revoked`](Self::revoked).
    fn note(&self, e: &RunnerError) {
        if e.is_rental_not_current() {
            self.revoked.send_replace(true);
        }
    }

    /// `result`, after noting a refusal of the runner's rental.
    fn noted<T>(&self, result: Result<T, RunnerError>) -> Result<T, RunnerError> {
        if let Err(e) = &result {
            self.note(e);
        }
        result
    }

    fn url(&self, path: &str) -> Result<Url, RunnerError> {
        self.base
            .join(path)
            .map_err(|e| RunnerError::Url(format!("{path}: {e}")))
    }

    /// Exchanges the one-time bootstrap token for a session; returns the SPIFFE ID.
    pub async fn exchange(&self, bootstrap: &Secret) -> Result<String, RunnerError> {
        let body = TokenRequest {
            bootstrap_token: bootstrap.expose().to_string(),
        };
        let request = (self.http.post(self.url("v1/token")?))
            .json(&body)
            .timeout(self.request_timeout);
        let sent = send_retrying("exchange the bootstrap token", request).await;
        let response: TokenResponse = json(self.noted(sent)?)
            .await
            .map_err(|e| e.during("exchange the bootstrap token"))?;
        let spiffe_id = response.spiffe_id.clone();
        self.keep(response).await;
        Ok(spiffe_id)
    }

    /// Gets a new session with the re-authentication credential; returns the SPIFFE ID.
    pub async fn reauthenticate(&self) -> Result<String, RunnerError> {
        const WHAT: &str = "re-authenticate";
        let credential = self.credential.lock().clone();
        let credential = credential.ok_or(RunnerError::NoSession)?;
        let body = ReauthRequest {
            credential: credential.expose().to_string(),
        };
        let request = self.http.post(self.url("v1/token/reauth")?).json(&body);
        let sent = send_retrying(WHAT, request.timeout(self.request_timeout)).await;
        let response: TokenResponse = json(self.noted(sent)?).await.map_err(|e| e.during(WHAT))?;
        let spiffe_id = response.spiffe_id.clone();
        self.keep(response).await;
        tracing::info!(%spiffe_id, "runner: re-authenticated");
        Ok(spiffe_id)
    }

    /// After a 401, re-authenticates if it can; true if the call is worth trying again.
    async fn recover(&self, e: &RunnerError) -> bool {
        if !e.is_unauthorized() || !self.can_reauthenticate() {
            return false;
        }
        match self.reauthenticate().await {
            Ok(_) => true,
            Err(again) => {
                tracing::warn!(error = %again, "runner: re-authentication failed");
                false
            }
        }
    }

    async fn keep(&self, response: TokenResponse) {
        if let Some(renewal) = response.credential {
            *self.credential.lock() = Some(Secret::new(renewal));
        }
        *self.session.lock().await = Some(Session {
            token: Secret::new(response.session_token),
            issued_at: unix_now(),
            expires_at: response.expires_at,
        });
    }

    /// The current session token, refreshed first when less than a third of its life is left.
    async fn bearer(&self) -> Result<SessionToken, RunnerError> {
        let mut session = self.session.lock().await;
        let Some(current) = session.as_ref() else {
            return Err(RunnerError::NoSession);
        };
        let left = current.expires_at - unix_now();
        if left * 3 > current.expires_at - current.issued_at {
            return Ok(current.token.clone());
        }
        let request = self
            .http
            .post(self.url("v1/token/refresh")?)
            .bearer_auth(current.token.expose())
            .timeout(self.request_timeout);
        let response = match self.noted(send("refresh the session", request).await) {
            Ok(response) => response,
            Err(e) => {
                drop(session);
                if self.recover(&e).await {
                    return Box::pin(self.bearer()).await;
                }
                return Err(e);
            }
        };
        let response: TokenResponse = json(response)
            .await
            .map_err(|e| e.during("refresh the session"))?;
        if let Some(renewal) = response.credential {
            *self.credential.lock() = Some(Secret::new(renewal));
        }
        let token = Secret::new(response.session_token);
        *session = Some(Session {
            token: token.clone(),
            issued_at: unix_now(),
            expires_at: response.expires_at,
        });
        tracing::debug!("runner: session refreshed");
        Ok(token)
    }

    async fn authed(&self, method: Method, path: &str) -> Result<RequestBuilder, RunnerError> {
        let token = self.bearer().await?;
        Ok(self
            .http
            .request(method, self.url(path)?)
            .bearer_auth(token.expose()))
    }

    /// Sends an authenticated request made by `build` (retrying transient failures with
    /// `retrying`); a refused session is replaced through the credential and the call tried
    /// once more.
    async fn call(
        &self,
        what: &'static str,
        method: Method,
        path: &str,
        retrying: bool,
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<reqwest::Response, RunnerError> {
        let mut again = true;
        loop {
            let request =
                build(self.authed(method.clone(), path).await?).timeout(self.request_timeout);
            let result = if retrying {
                send_retrying(what, request).await
            } else {
                send(what, request).await
            };
            match self.noted(result) {
                Err(e) if again && self.recover(&e).await => again = false,
                other => return other,
            }
        }
    }

    /// `GET /v1/workload`, saying that this runner restarts workloads in place, runs probes and
    /// serves egress (so the node includes the Pod's restart policy, probes and destinations).
    pub async fn workload(&self) -> Result<Workload, RunnerError> {
        let what = "fetch the workload";
        let (key, value) = neocloud_protocol::WORKLOAD_RESTARTS_QUERY
            .split_once('=')
            .unwrap_or_default();
        let (probes, run) = neocloud_protocol::WORKLOAD_PROBES_QUERY
            .split_once('=')
            .unwrap_or_default();
        let (egress, serve) = neocloud_protocol::WORKLOAD_EGRESS_QUERY
            .split_once('=')
            .unwrap_or_default();
        let response = self
            .call(what, Method::GET, "v1/workload", true, |r| {
                r.query(&[(key, value), (probes, run), (egress, serve)])
            })
            .await?;
        json(response).await.map_err(|e| e.during(what))
    }

    /// `GET /v1/handover`: for the runner of a machine held for a Pod, the Pod's secrets once
    /// a Pod took the machine (empty until then). A sign of life.
    pub async fn handover(&self) -> Result<neocloud_protocol::Handover, RunnerError> {
        let what = "wait for a Pod";
        let response = self
            .call(what, Method::GET, "v1/handover", true, |r| r)
            .await?;
        json(response).await.map_err(|e| e.during(what))
    }

    /// `POST /v1/status`.
    pub async fn status(&self, report: &StatusReport) -> Result<(), RunnerError> {
        self.call("report the state", Method::POST, "v1/status", true, |r| {
            r.json(report)
        })
        .await?;
        Ok(())
    }

    /// `POST /v1/stats`, once (best effort: no retry).
    pub async fn stats(&self, stats: &WorkloadStats) -> Result<(), RunnerError> {
        self.call("send stats", Method::POST, "v1/stats", false, |r| {
            r.json(stats)
        })
        .await?;
        Ok(())
    }

    /// `POST /v1/heartbeat`, saying the state the runner is in.
    pub async fn heartbeat(&self, state: Option<RunnerState>) -> Result<(), RunnerError> {
        let beat = Heartbeat { state };
        self.call(
            "send a heartbeat",
            Method::POST,
            "v1/heartbeat",
            false,
            |r| r.json(&beat),
        )
        .await?;
        Ok(())
    }

    /// `POST /v1/logs` with a streamed NDJSON body. The body cannot be sent twice: after a
    /// refused session this re-authenticates and returns the error, for the caller to send the
    /// records again. No total timeout (the body lasts as long as its records take to send):
    /// it fails when the node takes none of the body, or does not answer once it has all of
    /// it, for the request timeout.
    pub async fn logs<S>(&self, body: S) -> Result<(), RunnerError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        const WHAT: &str = "stream logs";
        let request = self.authed(Method::POST, "v1/logs").await?;
        let (body, watchdog) = crate::watchdog::watch(body, self.request_timeout);
        let request = request
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(reqwest::Body::wrap_stream(body));
        if let Err(e) = self.noted(watchdog.guard(WHAT, send(WHAT, request)).await) {
            self.recover(&e).await;
            return Err(e);
        }
        Ok(())
    }
}

impl CallbackClient {
    /// `GET /v1/sessions`: the next session the node asks for, or `None` when none came within
    /// the node's poll time (ask again). One poll at a time is enough: offers queue.
    pub async fn next_session(&self) -> Result<Option<SessionOffer>, RunnerError> {
        const WHAT: &str = "poll for sessions";
        let response = self
            .call(WHAT, Method::GET, "v1/sessions", false, |r| r)
            .await?;
        if response.status() == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        json(response).await.map(Some).map_err(|e| e.during(WHAT))
    }

    /// `GET /v1/sessions/{id}` upgraded: the connection of the session the node offered as
    /// `id`, on which [`Frame`](neocloud_protocol::session::Frame)s are spoken. Not retried
    /// (an offer is single use) except once after a refused session.
    pub async fn open_session(&self, id: &str) -> Result<reqwest::Upgraded, RunnerError> {
        const WHAT: &str = "open a session";
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(RunnerError::Http {
                what: WHAT,
                message: format!("the node offered a session with an invalid id {id:?}"),
            });
        }
        self.upgraded(WHAT, &format!("v1/sessions/{id}")).await
    }

    /// `GET /v1/egress/{index}` upgraded: a connection to the egress destination at `index` of
    /// the workload's list, on which `Data` frames are spoken (the node dials it; an `Error`
    /// frame says it could not). Not retried except once after a refused session.
    pub async fn open_egress(&self, index: usize) -> Result<reqwest::Upgraded, RunnerError> {
        let path = neocloud_protocol::EgressTarget::path(index);
        self.upgraded("open an egress connection", &path).await
    }

    /// `GET path` with `Upgrade:` [`SESSION_UPGRADE`], and the upgraded connection.
    async fn upgraded(
        &self,
        what: &'static str,
        path: &str,
    ) -> Result<reqwest::Upgraded, RunnerError> {
        let mut again = true;
        loop {
            let request = self
                .authed(Method::GET, path)
                .await?
                .header(reqwest::header::CONNECTION, "upgrade")
                .header(reqwest::header::UPGRADE, SESSION_UPGRADE)
                .timeout(self.request_timeout);
            let response = request.send().await.map_err(|e| RunnerError::Http {
                what,
                message: error_chain(&e),
            })?;
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                return response.upgrade().await.map_err(|e| RunnerError::Http {
                    what,
                    message: error_chain(&e),
                });
            }
            let e = refusal(what, response).await;
            self.note(&e);
            if !(again && self.recover(&e).await) {
                return Err(e);
            }
            again = false;
        }
    }
}

/// How many times a call that failed in transit or with 429 or 5xx is tried.
const SEND_ATTEMPTS: usize = 6;

/// [`send`], tried again with `backon`'s backoff (0.5 s doubling to 8 s, about 20 s in all) while
/// the failure is transient: a VM may boot before the node's callback is reachable, and a network
/// blip must not end a runner whose workload runs. Refusals (401, 403, 4xx) are final. A request
/// whose body cannot be copied (a stream) is sent once.
async fn send_retrying(
    what: &'static str,
    request: RequestBuilder,
) -> Result<reqwest::Response, RunnerError> {
    if request.try_clone().is_none() {
        return send(what, request).await;
    }
    let backoff = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(500))
        .with_factor(2.0)
        .with_max_delay(Duration::from_secs(8))
        .with_max_times(SEND_ATTEMPTS - 1);
    let attempt = || async {
        let this = request.try_clone().ok_or_else(|| RunnerError::Http {
            what,
            message: "the request cannot be repeated".into(),
        })?;
        send(what, this).await
    };
    attempt
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(RunnerError::is_transient)
        .notify(|e, delay| tracing::warn!(error = %e, "runner: retrying in {delay:?}"))
        .await
}

async fn send(
    what: &'static str,
    request: RequestBuilder,
) -> Result<reqwest::Response, RunnerError> {
    let response = request.send().await.map_err(|e| RunnerError::Http {
        what,
        message: error_chain(&e),
    })?;
    if response.status().is_success() {
        return Ok(response);
    }
    Err(refusal(what, response).await)
}

/// The error a node's non-success answer says.
async fn refusal(what: &'static str, response: reqwest::Response) -> RunnerError {
    let status = response.status();
    let (message, code) = match response.json::<ErrorBody>().await {
        Ok(body) => (body.error, body.code),
        Err(_) => (
            status.canonical_reason().unwrap_or("error").to_string(),
            None,
        ),
    };
    if status == StatusCode::FORBIDDEN && code.as_deref() == Some(RENTAL_NOT_CURRENT) {
        return RunnerError::RentalNotCurrent { what, message };
    }
    if status == StatusCode::CONFLICT && code.as_deref() == Some(HELD_FOR_A_POD) {
        return RunnerError::HeldForAPod { message };
    }
    RunnerError::Refused {
        what,
        status: status.as_u16(),
        message,
    }
}

async fn json<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, RunnerError> {
    response.json().await.map_err(|e| RunnerError::Http {
        what: "",
        message: format!("invalid response: {}", error_chain(&e)),
    })
}

/// An error and its sources on one line (reqwest's own message hides the TLS reason).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        out.push_str(": ");
        out.push_str(&inner.to_string());
        source = inner.source();
    }
    out
}

impl RunnerError {
    fn during(self, what: &'static str) -> Self {
        match self {
            Self::Http { message, .. } => Self::Http { what, message },
            other => other,
        }
    }

    /// Whether trying again may help: the request did not complete (but not for want of a
    /// certificate the runner trusts: that does not change by retrying), or the node was busy
    /// or failing (429, 5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Http { message, .. } => !message.contains("certificate"),
            Self::Refused { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }

    /// Whether the node refused the session or credential (401).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, Self::Refused { status, .. } if *status == StatusCode::UNAUTHORIZED.as_u16())
    }

    /// The HTTP status the node answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Refused { status, .. } => Some(*status),
            Self::RentalNotCurrent { .. } => Some(StatusCode::FORBIDDEN.as_u16()),
            _ => None,
        }
    }

    /// Whether the node refused because the binding is gone, its runner was declared lost, or
    /// its rental was replaced.
    pub fn is_forbidden(&self) -> bool {
        self.status() == Some(StatusCode::FORBIDDEN.as_u16())
    }

    /// Whether the node said this machine is held for a Pod that has not come: the runner
    /// waits for its [`handover`](CallbackClient::handover).
    pub fn is_held_for_a_pod(&self) -> bool {
        matches!(self, Self::HeldForAPod { .. })
    }

    /// Whether the node said this runner's rental is no longer current: the runner must stop.
    pub fn is_rental_not_current(&self) -> bool {
        matches!(self, Self::RentalNotCurrent { .. })
    }
}
