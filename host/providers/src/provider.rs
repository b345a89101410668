//! The `Provider` trait: the small, provider-neutral contract every cloud adapter implements,
//! and the error type every adapter returns.
//!
//! Not for choosing offers or retrying (the broker does that) and not for HTTP details (each
//! adapter owns its wire types).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use neocloud_core::{
    FailureClass, InstanceState, Offer, OfferQuery, ProviderId, RegistryCredential, WorkloadSpec,
};
use neocloud_protocol::session::SessionRequest;

/// What a provider call was doing when it failed, for messages and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `list_offers`.
    ListOffers,
    /// `create`.
    Create,
    /// `get`.
    Get,
    /// `find_by_name`.
    FindByName,
    /// `list_ours`.
    ListOurs,
    /// `delete`.
    Delete,
    /// `health`.
    Health,
    /// `logs`.
    Logs,
    /// `open_session`.
    Session,
    /// Creating, listing or deleting a registry credential (RunPod's `/v2/registries`).
    Credential,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::ListOffers => "list offers",
            Operation::Create => "create instance",
            Operation::Get => "get instance",
            Operation::FindByName => "find instance",
            Operation::ListOurs => "list instances",
            Operation::Delete => "delete instance",
            Operation::Health => "check health",
            Operation::Logs => "read logs",
            Operation::Session => "open a session",
            Operation::Credential => "manage registry credential",
        })
    }
}

/// A classified provider failure. It never carries an API key: adapters build messages from
/// response bodies and must pass them through [`ProviderError::redact`] with their key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("failed to {operation}{} on {provider}: {message}{}", fmt_subject(.subject), fmt_code(.code))]
pub struct ProviderError {
    /// The provider that failed.
    pub provider: ProviderId,
    /// What we asked it to do.
    pub operation: Operation,
    /// What the instance or offer was (external name, instance id or offer id), if any.
    pub subject: Option<String>,
    /// The class that drives the fallback ladder.
    pub class: FailureClass,
    /// The provider's own error code ("instance-operations/launch/insufficient-capacity", "3907").
    pub code: Option<String>,
    /// A short, lower-case message.
    pub message: String,
    /// How long the provider asked us to wait (Retry-After), if it did.
    pub retry_after: Option<Duration>,
}

fn fmt_subject(s: &Option<String>) -> String {
    s.as_ref().map(|s| format!(" {s}")).unwrap_or_default()
}

fn fmt_code(c: &Option<String>) -> String {
    c.as_ref()
        .map(|c| format!(" (code {c})"))
        .unwrap_or_default()
}

/// Longest provider message kept: it goes into Pod events, binding status and logs.
pub const MAX_MESSAGE_CHARS: usize = 512;

/// Credentials a provider's message may echo back, whatever the key: bearer tokens and
/// `Authorization` values, secret-named query parameters and JSON fields.
static SECRETS: std::sync::LazyLock<[(regex::Regex, &'static str); 4]> = std::sync::LazyLock::new(
    || {
        let re = |p: &str| regex::Regex::new(p).expect("a valid pattern");
        [
            (
                re(r"(?i)(authorization:\s*)((?:bearer|basic)\s+)?[^\s,;\x22']+"),
                "$1$2[redacted]",
            ),
            (
                re(r"(?i)\b(bearer|basic)(\s+)[^\s,;\x22']+"),
                "$1$2[redacted]",
            ),
            (
                re(
                    r"(?i)([?&;](?:api[_-]?key|access[_-]?token|token|key|secret|password|signature|sig|auth)=)[^&\s\x22'#]*",
                ),
                "$1[redacted]",
            ),
            (
                re(
                    r#"(?i)("(?:api[_-]?key|access[_-]?token|token|secret|password|authorization)"\s*:\s*")[^"]*""#,
                ),
                "$1[redacted]\"",
            ),
        ]
    },
);

/// A provider's message made safe to show: credentials redacted, control characters (newlines
/// included) turned into spaces, and at most [`MAX_MESSAGE_CHARS`] characters kept.
pub fn scrub(message: &str) -> String {
    let mut out = message.to_owned();
    for (pattern, with) in SECRETS.iter() {
        // Borrowed when nothing matched: the message is copied only when something changed.
        if let std::borrow::Cow::Owned(redacted) = pattern.replace_all(&out, *with) {
            out = redacted;
        }
    }
    let mut out: String = out
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if let Some((at, _)) = out.char_indices().nth(MAX_MESSAGE_CHARS) {
        out.truncate(at);
        out.push_str("...");
    }
    out
}

impl ProviderError {
    /// A new error with no subject, code or Retry-After.
    pub fn new(
        provider: ProviderId,
        operation: Operation,
        class: FailureClass,
        message: impl Into<String>,
    ) -> ProviderError {
        let message = scrub(&message.into());
        ProviderError {
            provider,
            operation,
            subject: None,
            class,
            code: None,
            message,
            retry_after: None,
        }
    }

    /// Names the instance or offer the call was about.
    pub fn with_subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// Records the provider's own error code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(scrub(&code.into()));
        self
    }

    /// Records the provider's Retry-After.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Removes every occurrence of `secret` (an API key) from the message and code. An empty
    /// secret changes nothing.
    pub fn redact(mut self, secret: &str) -> Self {
        if !secret.is_empty() {
            self.message = without(&self.message, secret);
            self.code = self.code.map(|c| without(&c, secret));
        }
        self
    }

    /// The short metric label of the failure class.
    pub fn metric_label(&self) -> &'static str {
        self.class.label()
    }
}

/// `text` with every occurrence of `secret` replaced, whatever its ASCII case (adapters lower-case
/// provider messages, and a body may echo the key in any case).
fn without(text: &str, secret: &str) -> String {
    let (haystack, needle) = (text.to_ascii_lowercase(), secret.to_ascii_lowercase());
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    // ASCII lower-casing keeps every byte offset, so matches in `haystack` are matches in `text`.
    for (at, _) in haystack.match_indices(&needle) {
        if at < rest {
            continue;
        }
        out.push_str(&text[rest..at]);
        out.push_str("[redacted]");
        rest = at + needle.len();
    }
    out.push_str(&text[rest..]);
    out
}

/// What a log read asks for, as `kubectl logs` does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRequest {
    /// Keep the stream open for new output until the workload ends.
    pub follow: bool,
    /// Only the last N lines.
    pub tail_lines: Option<i64>,
    /// Stop after this many bytes.
    pub limit_bytes: Option<i64>,
    /// Only output from the last N seconds.
    pub since_seconds: Option<i64>,
    /// Prefix each line with its RFC 3339 time.
    pub timestamps: bool,
}

/// A session speaking the runner session's frames (see [`Provider::open_session`]).
pub type FrameStream = Box<dyn FrameIo>;

/// What a [`FrameStream`] is: a byte stream both ways.
pub trait FrameIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> FrameIo for T {}

/// A workload's output as it arrives, in chunks; an error ends it.
pub type LogStream = futures::stream::BoxStream<'static, Result<bytes::Bytes, ProviderError>>;

/// What to create: the workload, the chosen offer, the environment already resolved by the node,
/// and our deterministic external name.
#[derive(Clone)]
pub struct CreateRequest {
    /// The deterministic name derived from the Pod UID: the idempotency key.
    pub external_name: String,
    /// The offer to rent.
    pub offer: Offer,
    /// The workload (its env references are resolved into `env`).
    pub workload: WorkloadSpec,
    /// Environment variables with every Secret/ConfigMap reference resolved, in Pod order.
    pub env: Vec<(String, String)>,
    /// For spot offers, the bid per hour for the whole instance.
    pub bid_per_hour: Option<f64>,
    /// How the node's runner starts on the instance, when the Pod is run by it. Never logged.
    pub boot: Option<Boot>,
    /// The login for the image's registry, from the Pod's `imagePullSecrets`. Never logged.
    pub registry_login: Option<RegistryCredential>,
}

/// How the node's runner starts on a rented instance, with its one-time bootstrap credential.
#[derive(Clone, PartialEq, Eq)]
pub struct Boot {
    /// Cloud-init `user_data` for providers that rent bare VMs (Lambda).
    pub user_data: String,
    /// For container providers (RunPod, Vast.ai): the container's command, run in place of the
    /// Pod's (the runner then runs the Pod's command as its child), and the environment it needs.
    /// `None` when the Pod runs its command itself there.
    pub container: Option<ContainerBoot>,
}

/// A container's start command that fetches, verifies and starts the runner.
#[derive(Clone, PartialEq, Eq)]
pub struct ContainerBoot {
    /// The argv (`sh -c '<fetch, verify, exec the runner>'`).
    pub command: Vec<String>,
    /// Variables added to the container's environment (the bootstrap token and credential).
    pub env: Vec<(String, String)>,
}

impl CreateRequest {
    /// The container's argv: the runner's start command when the Pod is run by the runner,
    /// else the Pod's command and args (empty: the image's own).
    pub fn container_argv(&self) -> Vec<String> {
        match self.boot.as_ref().and_then(|b| b.container.as_ref()) {
            Some(c) => c.command.clone(),
            None => self
                .workload
                .command
                .iter()
                .chain(&self.workload.args)
                .cloned()
                .collect(),
        }
    }

    /// The container's environment: the Pod's, and the runner's variables when it runs it.
    pub fn container_env(&self) -> impl Iterator<Item = (String, String)> + '_ {
        let runner = self
            .boot
            .as_ref()
            .and_then(|b| b.container.as_ref())
            .map(|c| c.env.as_slice())
            .unwrap_or_default();
        self.env.iter().chain(runner).cloned()
    }
}

impl fmt::Debug for ContainerBoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("ContainerBoot")
            .field("program", &self.command.first())
            .field("env_names (values redacted)", &names)
            .finish()
    }
}

impl fmt::Debug for Boot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Boot")
            .field("user_data (redacted)", &self.user_data.len())
            .field("container", &self.container.is_some())
            .finish()
    }
}

impl fmt::Debug for CreateRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env_names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("CreateRequest")
            .field("external_name", &self.external_name)
            .field("offer", &self.offer.id)
            .field("provider", &self.offer.provider)
            .field("image", &self.workload.image)
            .field("env_names (values redacted)", &env_names)
            .field("bid_per_hour", &self.bid_per_hour)
            .field("boot (redacted)", &self.boot.is_some())
            .field(
                "registry_login (redacted)",
                &self.registry_login.as_ref().map(|l| &l.server),
            )
            .finish()
    }
}

/// A GPU cloud. Implementations must be cheap to share (`Arc<dyn Provider>`) and safe to call
/// concurrently; each method states its idempotency.
#[async_trait]
pub trait Provider: Send + Sync + fmt::Debug {
    /// Which provider this is.
    fn id(&self) -> ProviderId;

    /// Offers matching at least `query` (possibly more; never fewer). Read-only: calling it twice
    /// or concurrently is safe, and answers may differ as the market moves.
    async fn list_offers(&self, query: &OfferQuery) -> Result<Vec<Offer>, ProviderError>;

    /// Rents `request.offer` under `request.external_name`. Idempotent by name: if an instance
    /// with that name exists it is returned and nothing new is rented. Two concurrent calls with
    /// the same name must not create two instances; where the cloud cannot guarantee that, the
    /// adapter serialises creates per name. A create whose outcome is unknown (timeout, 5xx) is
    /// never retried blindly inside the adapter: it looks the name up first.
    async fn create(&self, request: &CreateRequest) -> Result<InstanceState, ProviderError>;

    /// The instance with this provider id, or `None` if the provider no longer knows it.
    /// Read-only.
    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError>;

    /// The live instance carrying this external name, or `None`. Read-only; if the cloud holds
    /// several (created outside our control) the oldest is returned.
    async fn find_by_name(
        &self,
        external_name: &str,
    ) -> Result<Option<InstanceState>, ProviderError>;

    /// Every live instance whose external name starts with `prefix`, across all pages. Read-only;
    /// an instance created or deleted during the call may or may not appear.
    async fn list_ours(&self, prefix: &str) -> Result<Vec<InstanceState>, ProviderError>;

    /// Deletes the instance with this provider id. Idempotent: an instance already gone (or never
    /// known) is success. Concurrent deletes of the same id both succeed.
    async fn delete(&self, id: &str) -> Result<(), ProviderError>;

    /// Checks that the provider answers and accepts our credentials. Read-only.
    async fn health(&self) -> Result<(), ProviderError>;

    /// The registry credentials this adapter made for rentals (each named by its instance's
    /// external name) whose name starts with `prefix`, as `(id, name)`, for the sweeper. Empty
    /// where the cloud keeps none (it takes the login with each create). Read-only.
    async fn list_credentials(&self, prefix: &str) -> Result<Vec<(String, String)>, ProviderError> {
        let _ = prefix;
        Ok(Vec::new())
    }

    /// Deletes the registry credential with this id. Idempotent: one already gone is success.
    async fn delete_credential(&self, id: &str) -> Result<(), ProviderError> {
        let _ = id;
        Ok(())
    }

    /// The workload's output, where the provider itself runs the workload and can read it (a
    /// remote cluster's Pod): `None` when it has no log API, which is every cloud's case (their
    /// Pods' logs come from the node's runner). Read-only; each call gets its own stream, which
    /// with `request.follow` stays open until the workload ends.
    async fn logs(
        &self,
        id: &str,
        request: &LogRequest,
    ) -> Result<Option<LogStream>, ProviderError> {
        let _ = (id, request);
        Ok(None)
    }

    /// An interactive session with the workload, where the provider itself runs it (a remote
    /// cluster's Pod): `request` is an exec (`kubectl exec`) or a forwarded port (`kubectl
    /// port-forward`), and the answer is a stream speaking the runner session's
    /// [`Frame`](neocloud_protocol::session::Frame)s, as a runner's session does. `None` when the
    /// provider has no such API, which is every cloud's case (their Pods' sessions go through the
    /// node's runner). Each call opens its own session; dropping the stream closes it.
    async fn open_session(
        &self,
        id: &str,
        request: &SessionRequest,
    ) -> Result<Option<FrameStream>, ProviderError> {
        let _ = (id, request);
        Ok(None)
    }

    /// How long a create called now would first wait for the adapter's own spacing of creates
    /// (Lambda allows one launch per 12 s), and why; `None` when it would not wait. Read-only
    /// and immediate: the renter uses it to say what a Pod is waiting for.
    fn create_wait(&self) -> Option<(std::time::Duration, String)> {
        None
    }
}

#[cfg(test)]
mod scrub_tests {
    use super::*;

    #[test]
    fn credentials_in_a_provider_message_are_redacted() {
        let cases = [
            (
                "401 from https://api.example/v1?api_key=sk_live_123&page=2: denied",
                "401 from https://api.example/v1?api_key=[redacted]&page=2: denied",
            ),
            (
                "echo: Authorization: Bearer rpa_ABCDEF123, retry",
                "echo: Authorization: Bearer [redacted], retry",
            ),
            (
                "authorization: rpa_X; bearer abc",
                "authorization: [redacted]; bearer [redacted]",
            ),
            (
                r#"{"error":"bad","token":"secret_abc","id":"i-1"}"#,
                r#"{"error":"bad","token":"[redacted]","id":"i-1"}"#,
            ),
            (
                "GET /x?Signature=AbC%2F&X-Id=7 failed",
                "GET /x?Signature=[redacted]&X-Id=7 failed",
            ),
            ("no gpus available", "no gpus available"),
        ];
        for (raw, want) in cases {
            assert_eq!(scrub(raw), want, "{raw}");
        }
    }

    /// Found by the `provider_responses` fuzz target: a Vast body that echoed the key in its
    /// error code leaked it, because the code was set after the message was redacted.
    #[test]
    fn the_key_is_redacted_in_any_case_from_the_message_and_the_code() {
        let key = "rpa_AbC123xyz";
        let e = ProviderError::new(
            ProviderId::Runpod,
            Operation::Create,
            FailureClass::Auth,
            "key rpa_abc123xyz is invalid (RPA_ABC123XYZ)",
        )
        .with_code("bad_key_rpa_AbC123xyz")
        .redact(key);
        assert_eq!(e.message, "key [redacted] is invalid ([redacted])");
        assert_eq!(e.code.as_deref(), Some("bad_key_[redacted]"));
        assert!(
            !format!("{e} {e:?}")
                .to_lowercase()
                .contains(&key.to_lowercase())
        );
        assert_eq!(
            without("ünïcode rpa_abc123xyz!", key),
            "ünïcode [redacted]!"
        );
    }

    #[test]
    fn messages_are_one_line_and_capped() {
        let long = format!("line one\nline two\r\t{}", "x".repeat(2_000));
        let out = scrub(&long);
        assert!(out.starts_with("line one line two  x"), "{out}");
        assert_eq!(out.chars().count(), MAX_MESSAGE_CHARS + 3);
        assert!(out.ends_with("..."));
        let e = ProviderError::new(
            ProviderId::Runpod,
            Operation::Create,
            FailureClass::Transient,
            "denied for ?token=abc",
        )
        .with_code("E1\nE2");
        assert_eq!(e.message, "denied for ?token=[redacted]");
        assert_eq!(e.code.as_deref(), Some("E1 E2"));
    }
}
