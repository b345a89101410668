//! The runner's HTTPS client of the node's callback API: trusts only the CA it was given,
//! refuses plain HTTP, exchanges the bootstrap token, refreshes the session before it expires,
//! and turns refusals into errors that say what the node answered.
//!
//! Not the runner's control flow: see [`super::run`].

use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use reqwest::{Certificate, Client, Method, RequestBuilder, StatusCode, Url};
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use super::RunnerError;
use crate::callback::tokens::unix_now;
use crate::callback::{
    ErrorBody, Secret, SessionToken, StatusReport, TokenRequest, TokenResponse, Workload,
};

/// Timeout of one request, except the log stream's.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
            .connect_timeout(Duration::from_secs(10));
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
        })
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
        let request = self.http.post(self.url("v1/token")?).json(&body);
        let response: TokenResponse =
            json(send_retrying("exchange the bootstrap token", request).await?)
                .await
                .map_err(|e| e.during("exchange the bootstrap token"))?;
        let spiffe_id = response.spiffe_id.clone();
        self.keep(response).await;
        Ok(spiffe_id)
    }

    async fn keep(&self, response: TokenResponse) {
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
            .timeout(REQUEST_TIMEOUT);
        let response: TokenResponse = json(send("refresh the session", request).await?)
            .await
            .map_err(|e| e.during("refresh the session"))?;
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

    /// `GET /v1/workload`.
    pub async fn workload(&self) -> Result<Workload, RunnerError> {
        let request = self.authed(Method::GET, "v1/workload").await?;
        json(send_retrying("fetch the workload", request.timeout(REQUEST_TIMEOUT)).await?)
            .await
            .map_err(|e| e.during("fetch the workload"))
    }

    /// `POST /v1/status`.
    pub async fn status(&self, report: &StatusReport) -> Result<(), RunnerError> {
        let request = self.authed(Method::POST, "v1/status").await?.json(report);
        send_retrying("report the state", request.timeout(REQUEST_TIMEOUT)).await?;
        Ok(())
    }

    /// `POST /v1/heartbeat`.
    pub async fn heartbeat(&self) -> Result<(), RunnerError> {
        let request = self.authed(Method::POST, "v1/heartbeat").await?;
        send("send a heartbeat", request.timeout(REQUEST_TIMEOUT)).await?;
        Ok(())
    }

    /// `POST /v1/logs` with a streamed NDJSON body.
    pub async fn logs<S>(&self, body: S) -> Result<(), RunnerError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let request = self.authed(Method::POST, "v1/logs").await?;
        let request = request
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(reqwest::Body::wrap_stream(body));
        send("stream logs", request).await?;
        Ok(())
    }
}

/// How many times a call that failed in transit or with 429 or 5xx is tried.
const SEND_ATTEMPTS: u32 = 6;

/// [`send`], tried again with backoff (0.5 s doubling to 8 s, about 20 s in all) while the failure
/// is transient: a VM may boot before the node's callback is reachable, and a network blip must
/// not end a runner whose workload runs. Refusals (401, 403, 4xx) are final.
async fn send_retrying(
    what: &'static str,
    request: RequestBuilder,
) -> Result<reqwest::Response, RunnerError> {
    let mut delay = Duration::from_millis(500);
    let mut attempt = 1;
    loop {
        let Some(this) = request.try_clone() else {
            return send(what, request).await;
        };
        match send(what, this).await {
            Err(e) if e.is_transient() && attempt < SEND_ATTEMPTS => {
                tracing::warn!(error = %e, attempt, "runner: retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(8));
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn send(
    what: &'static str,
    request: RequestBuilder,
) -> Result<reqwest::Response, RunnerError> {
    let response = request.send().await.map_err(|e| RunnerError::Http {
        what,
        message: error_chain(&e),
    })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let message = match response.json::<ErrorBody>().await {
        Ok(body) => body.error,
        Err(_) => status.canonical_reason().unwrap_or("error").to_string(),
    };
    Err(RunnerError::Refused {
        what,
        status: status.as_u16(),
        message,
    })
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

    /// Whether the node refused because the binding is gone or its runner was declared lost.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Self::Refused { status, .. } if *status == StatusCode::FORBIDDEN.as_u16())
    }
}
