//! Shared HTTP plumbing for the cloud adapters: one reqwest client per adapter with timeouts,
//! bearer authentication, retries only where they are safe (reads and deletes on network errors,
//! 5xx and 429; creates only on 429, since a 429 is refused before any work is done), Retry-After
//! handling, transport-error classification, and API keys that never reach a log or a message.
//!
//! Not for provider error bodies (each adapter's `errors` module classifies those) and not for
//! lost-response recovery (the `adapter` module looks the instance up by name after an unknown
//! outcome).

use std::fmt;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use neocloud_core::{FailureClass, ProviderId};
use reqwest::header::RETRY_AFTER;
use reqwest::{Client, RequestBuilder, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::provider::{Operation, ProviderError};
use crate::retries::Retry;

/// An API key. Its `Debug` never shows it; adapters pass it to [`ProviderError::redact`].
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// Whether the key is empty.
    pub fn is_empty(&self) -> bool {
        self.0.trim().is_empty()
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

/// Timeouts and retry budget of one adapter's HTTP client.
///
/// A zero timeout means none. That is for a paused tokio clock (the market replay): it moves
/// to the next pending timer whenever the runtime waits, even for a response, so any timer
/// armed during a request would fire at once and move simulated time.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Whole-request timeout in milliseconds; 0: none.
    pub timeout_ms: u64,
    /// Connection timeout in milliseconds; 0: none.
    pub connect_timeout_ms: u64,
    /// How long an idle pooled connection is kept, in milliseconds; 0: until the server
    /// closes it (no idle timer).
    pub idle_timeout_ms: u64,
    /// Attempts per safe call, including the first (at least 1).
    pub max_attempts: u32,
    /// First backoff between attempts when the provider gives no Retry-After; doubles each time.
    pub backoff_ms: u64,
    /// The longest wait between attempts, whatever Retry-After says.
    pub max_retry_wait_ms: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            timeout_ms: 30_000,
            connect_timeout_ms: 10_000,
            idle_timeout_ms: 90_000,
            max_attempts: 3,
            backoff_ms: 250,
            max_retry_wait_ms: 30_000,
        }
    }
}

/// Whether a request may be repeated after an unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Safety {
    /// Reads and deletes: retried on network errors, 5xx and 429.
    Retryable,
    /// Creates: retried only on 429, which the providers answer before doing anything.
    CreateOnce,
}

/// What a provider call is about, for errors and logs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    pub op: Operation,
    pub subject: Option<&'a str>,
}

impl<'a> Call<'a> {
    pub fn new(op: Operation, subject: Option<&'a str>) -> Call<'a> {
        Call { op, subject }
    }
}

/// A complete HTTP answer (any status).
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub retry_after: Option<Duration>,
    pub body: String,
}

/// One adapter's client: base URL, key, retry policy.
#[derive(Clone)]
pub(crate) struct Http {
    client: Client,
    base: String,
    key: ApiKey,
    provider: ProviderId,
    config: HttpConfig,
}

impl fmt::Debug for Http {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http")
            .field("base", &self.base)
            .field("key", &self.key)
            .field("config", &self.config)
            .finish()
    }
}

impl Http {
    /// Builds the client; fails only if TLS cannot be initialised.
    pub fn new(
        provider: ProviderId,
        base: &str,
        key: ApiKey,
        config: HttpConfig,
    ) -> Result<Http, reqwest::Error> {
        let millis = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
        let mut builder = Client::builder()
            .pool_idle_timeout(millis(config.idle_timeout_ms))
            .user_agent(concat!("neocloud-node/", env!("CARGO_PKG_VERSION")));
        if let Some(timeout) = millis(config.timeout_ms) {
            builder = builder.timeout(timeout);
        }
        if let Some(timeout) = millis(config.connect_timeout_ms) {
            builder = builder.connect_timeout(timeout);
        }
        let client = builder.build()?;
        let base = base.trim_end_matches('/').to_owned();
        Ok(Http {
            client,
            base,
            key,
            provider,
            config,
        })
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The API key, for redaction.
    pub fn key(&self) -> &str {
        self.key.expose()
    }

    /// A classified, redacted error about `call` with the provider's own error code (redacted
    /// too: a provider's code is text from its body).
    pub fn coded_error(
        &self,
        call: Call<'_>,
        class: FailureClass,
        message: String,
        code: impl Into<String>,
    ) -> ProviderError {
        self.error(call, class, message)
            .with_code(code)
            .redact(self.key())
    }

    /// A classified, redacted error about `call`.
    pub fn error(&self, call: Call<'_>, class: FailureClass, message: String) -> ProviderError {
        let mut error = ProviderError::new(self.provider, call.op, class, message);
        if let Some(subject) = call.subject {
            error = error.with_subject(subject);
        }
        error.redact(self.key())
    }

    /// Sends the request `build` makes (with the bearer key added), retrying as `safety` allows,
    /// and returns the final answer whatever its status; only transport failures are errors.
    /// Each call runs in a `provider_call` span naming the provider, operation and subject.
    pub async fn send<F>(
        &self,
        call: Call<'_>,
        safety: Safety,
        build: F,
    ) -> Result<Reply, ProviderError>
    where
        F: Fn(&Client) -> RequestBuilder,
    {
        let span = tracing::debug_span!(
            "provider_call",
            provider = %self.provider,
            op = %call.op,
            subject = call.subject.unwrap_or_default(),
        );
        self.attempts(call, safety, build).instrument(span).await
    }

    /// Tries the request until an answer is final, as [`Http::retry_wait`] says, with `backon`'s
    /// exponential backoff (no jitter: the backoff is per call, and the broker's per-provider
    /// back-off spreads Pods out).
    async fn attempts<F>(
        &self,
        call: Call<'_>,
        safety: Safety,
        build: F,
    ) -> Result<Reply, ProviderError>
    where
        F: Fn(&Client) -> RequestBuilder,
    {
        let backoff = ExponentialBuilder::new()
            .with_min_delay(Duration::from_millis(self.config.backoff_ms))
            .with_factor(2.0)
            .with_max_delay(self.max_wait())
            .with_max_times(self.config.max_attempts.max(1) as usize - 1);
        let attempt = || async {
            let outcome = self.fetch(&build).await;
            if retried(&outcome, safety) {
                Err(outcome)
            } else {
                Ok(outcome)
            }
        };
        let outcome = attempt
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .adjust(|outcome, wait| self.retry_wait(outcome, wait))
            .notify(|outcome, wait| self.noted(call, outcome, wait))
            .await
            .unwrap_or_else(|last| last);
        outcome.map_err(|e| self.transport_error(call, &e))
    }

    async fn fetch<F>(&self, build: &F) -> Result<Reply, reqwest::Error>
    where
        F: Fn(&Client) -> RequestBuilder,
    {
        let response = build(&self.client)
            .bearer_auth(self.key.expose())
            .send()
            .await?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let body = response.text().await?;
        Ok(Reply {
            status,
            retry_after,
            body,
        })
    }

    /// The wait before another attempt after `outcome` (which [`retried`] allows), given the
    /// backoff's `wait` (`None`: attempts are spent, stop): a 429's Retry-After replaces the
    /// backoff; no wait is longer than `maxRetryWaitMs`.
    fn retry_wait(
        &self,
        outcome: &Result<Reply, reqwest::Error>,
        wait: Option<Duration>,
    ) -> Option<Duration> {
        let wait = wait?;
        let wait = match outcome {
            Ok(reply) if reply.status == StatusCode::TOO_MANY_REQUESTS => {
                reply.retry_after.unwrap_or(wait)
            }
            _ => wait,
        };
        Some(wait.min(self.max_wait()))
    }

    /// Logs a retry at info (a retried create or read is worth a line) and notes it for the
    /// caller's record ([`crate::retries`]).
    fn noted(&self, call: Call<'_>, outcome: &Result<Reply, reqwest::Error>, wait: Duration) {
        let retry = match outcome {
            Ok(reply) => Retry {
                status: Some(reply.status.as_u16()),
                error: None,
                asked: reply.retry_after,
                waited: wait,
            },
            Err(e) => Retry {
                status: None,
                error: Some(transport_kind(e).1),
                asked: None,
                waited: wait,
            },
        };
        tracing::info!(
            provider = %self.provider,
            op = %call.op,
            subject = call.subject.unwrap_or_default(),
            cause = %retry.cause(),
            asked = ?retry.asked,
            "provider call answered {}; sending it again in {}",
            retry.cause(),
            crate::retries::seconds(wait)
        );
        crate::retries::note(retry);
    }

    fn max_wait(&self) -> Duration {
        Duration::from_millis(self.config.max_retry_wait_ms)
    }

    /// Timeout when the client gave up waiting, transient otherwise; either way the outcome of
    /// the request is unknown.
    fn transport_error(&self, call: Call<'_>, error: &reqwest::Error) -> ProviderError {
        let (class, code, what) = transport_kind(error);
        let message = format!("{what}: {}", chain(error));
        self.error(call, class, message).with_code(code)
    }

    /// Parses a 2xx body as `T`; a body that does not parse is a transient error.
    pub fn decode<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
        reply: &Reply,
    ) -> Result<T, ProviderError> {
        serde_json::from_str(&reply.body).map_err(|e| {
            let message = format!("unexpected response body ({e}): {}", excerpt(&reply.body));
            self.error(call, FailureClass::Transient, message)
                .with_code("decode")
        })
    }
}

/// The class, code and words of a transport failure: timeout, connect or other.
fn transport_kind(error: &reqwest::Error) -> (FailureClass, &'static str, &'static str) {
    if error.is_timeout() {
        (FailureClass::Timeout, "timeout", "request timed out")
    } else if error.is_connect() {
        (FailureClass::Transient, "connect", "could not connect")
    } else {
        (FailureClass::Transient, "transport", "request failed")
    }
}

/// Whether `outcome` may be tried again: a 429 always (refused before any work), a 5xx or a
/// transport failure only for calls that are safe to repeat.
fn retried(outcome: &Result<Reply, reqwest::Error>, safety: Safety) -> bool {
    match outcome {
        Ok(reply) if reply.status == StatusCode::TOO_MANY_REQUESTS => true,
        Ok(reply) => reply.status.is_server_error() && safety == Safety::Retryable,
        Err(_) => safety == Safety::Retryable,
    }
}

/// Every message in an error's source chain, without URLs.
fn chain(error: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(error);
    while let Some(current) = source {
        parts.push(current.to_string());
        source = current.source();
    }
    if parts.is_empty() {
        parts.push("no further detail".to_owned());
    }
    parts.join(": ")
}

/// `Retry-After` in seconds (integer or decimal); HTTP dates are ignored.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let seconds: f64 = value.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

/// At most 300 characters of a body, for messages.
pub(crate) fn excerpt(body: &str) -> String {
    let trimmed = body.trim();
    match trimmed.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &trimmed[..cut]),
        None => trimmed.to_owned(),
    }
}

/// The class of an HTTP status when the body says nothing more specific.
pub(crate) fn class_of_status(status: StatusCode) -> FailureClass {
    match status.as_u16() {
        401 | 403 => FailureClass::Auth,
        402 => FailureClass::Quota,
        408 | 504 => FailureClass::Timeout,
        429 => FailureClass::RateLimited,
        500..=599 => FailureClass::Transient,
        _ => FailureClass::InvalidRequest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, retry_after: Option<u64>) -> Result<Reply, reqwest::Error> {
        Ok(Reply {
            status: StatusCode::from_u16(status).unwrap(),
            retry_after: retry_after.map(Duration::from_secs),
            body: String::new(),
        })
    }

    #[test]
    fn a_429_is_always_retried_and_a_5xx_only_when_the_call_is_safe_to_repeat() {
        use Safety::{CreateOnce, Retryable};
        assert!(retried(&reply(429, None), CreateOnce));
        assert!(retried(&reply(503, None), Retryable));
        assert!(!retried(&reply(503, None), CreateOnce));
        assert!(!retried(&reply(400, None), Retryable));
        assert!(!retried(&reply(200, None), Retryable));
    }

    #[test]
    fn retry_after_replaces_the_backoff_within_the_longest_wait_and_spent_attempts_stop() {
        let config = HttpConfig {
            max_retry_wait_ms: 5_000,
            ..HttpConfig::default()
        };
        let http = Http::new(ProviderId::Runpod, "http://x", ApiKey::new("k"), config).unwrap();
        let backoff = Some(Duration::from_millis(250));
        let wait = |outcome| http.retry_wait(&outcome, backoff);
        assert_eq!(wait(reply(429, Some(2))), Some(Duration::from_secs(2)));
        assert_eq!(wait(reply(429, Some(60))), Some(Duration::from_secs(5)));
        assert_eq!(wait(reply(429, None)), backoff);
        assert_eq!(wait(reply(503, Some(9))), backoff);
        assert_eq!(http.retry_wait(&reply(429, Some(2)), None), None);
    }

    #[test]
    fn an_api_key_never_shows_in_debug_output() {
        let key = ApiKey::new("rpa_SECRET123");
        assert_eq!(format!("{key:?}"), "ApiKey([redacted])");
        assert!(!format!("{:?}", Some(key)).contains("SECRET"));
    }

    #[test]
    fn retry_after_accepts_seconds_and_ignores_dates() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn long_bodies_are_cut_to_an_excerpt() {
        let long = "x".repeat(1000);
        assert_eq!(excerpt(&long).chars().count(), 301);
        assert_eq!(excerpt("  short  "), "short");
    }

    #[test]
    fn statuses_map_to_the_classes_the_fallback_ladder_expects() {
        assert_eq!(
            class_of_status(StatusCode::UNAUTHORIZED),
            FailureClass::Auth
        );
        assert_eq!(
            class_of_status(StatusCode::PAYMENT_REQUIRED),
            FailureClass::Quota
        );
        assert_eq!(
            class_of_status(StatusCode::TOO_MANY_REQUESTS),
            FailureClass::RateLimited
        );
        assert_eq!(
            class_of_status(StatusCode::BAD_GATEWAY),
            FailureClass::Transient
        );
        assert_eq!(
            class_of_status(StatusCode::UNPROCESSABLE_ENTITY),
            FailureClass::InvalidRequest
        );
    }
}
