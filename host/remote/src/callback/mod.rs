//! The runner callback: how the runner on a rented machine gets its workload and reports back,
//! on every cloud (started by the VM's `user_data` on Lambda Cloud, by the container's start
//! command on RunPod and Vast.ai). The node [`register`](CallbackHandle::register)s a binding's
//! [`Workload`] and gets a one-time bootstrap token to put in the VM's `user_data`
//! ([`render_user_data`]) or the container's environment ([`render_container_start`]); the
//! runner exchanges it over TLS for a short-lived session, fetches the workload, reports its
//! state, heartbeats and usage, and streams logs.
//! The node keeps what it knows of each runner here, once (module `runner`): a channel of
//! [`RunnerEvent`]s says when that changed, [`CallbackHandle::runner_status`] what it is, and
//! [`CallbackHandle::read_logs`] reads logs.
//!
//! Each registration names the binding's rental (its runner generation, which the node keeps in
//! the binding's status): sessions, bootstrap tokens and credentials name it too, and a runner of
//! a rental that is no longer current (replaced, or declared lost) is refused with 403 and
//! [`RENTAL_NOT_CURRENT`](neocloud_protocol::RENTAL_NOT_CURRENT) on every route, which tells it
//! to stop its workload.
//!
//! Across restarts and leader changes: the keys come from the node's runner identity (a Secret
//! every replica reads, [`identity`]), so sessions and re-authentication credentials
//! ([`credential`]: the boot one in `user_data`, which expires with the bootstrap token and is
//! spent once the runner called in, and the renewal one handed out with each session) stay
//! valid; a new leader
//! [`adopt`](CallbackHandle::adopt)s the bindings it finds, and until the adoption window after
//! its start has passed, a runner of a binding not adopted yet is told to try again (503).
//!
//! Sessions (`kubectl exec`, `kubectl port-forward`) reach the runner the other way round: the
//! node [`open_session`](CallbackHandle::open_session)s, the runner, which keeps a poll open for
//! offers, dials back and its connection is handed to the opener ([`sessions`]).
//!
//! Not the reconciler: deciding what a `Lost` or `Exited` binding means for its Pod is the
//! node's job. Not the runner itself (the `neocloud-runner` crate) nor the JSON shapes it shares
//! with this server (the `neocloud-protocol` crate, re-exported here), nor the kubelet API that
//! reads these logs and opens these sessions for `kubectl` (the `neocloud-kubelet` crate).

pub mod credential;
pub mod egress;
pub mod identity;
mod logs;
mod ratelimit;
mod runner;
mod server;
pub mod sessions;
mod state;
pub mod tokens;
mod user_data;

use std::time::Duration;

pub use crate::tls::TlsMaterial;
pub use credential::{CredentialKind, RunnerKeys};
pub use egress::{EgressConfig, EgressDialer};
pub use identity::RunnerIdentity;
pub use logs::{LogBuffer, LogLimits, LogLine, LogOptions};
pub use neocloud_protocol::{
    BootstrapToken, EnvVar, ErrorBody, ExecutorKind, File, FileMount, Handover, Heartbeat,
    LogRecord, LogStream, ReauthRequest, RegistryLogin, RestartPolicy, RunnerState, Secret,
    SessionToken, StatusReport, Termination, TokenRequest, TokenResponse, Workload,
};
pub use ratelimit::RateLimit;
pub use runner::{InPlace, RunnerStatus};
pub use server::CallbackServer;
pub use sessions::{SessionIo, SessionStream};
pub use state::{CallbackHandle, HeldRunner};
pub use tokens::TokenError;
pub use user_data::{
    CONTAINER_RUNNER_PATH, CONTAINER_SECRETS_FILE, DEFAULT_RUNNER_PATH, RunnerDownload,
    UserDataOptions, VM_SECRETS_FILE, render_container_start, render_user_data,
};

/// The trust domain of session SPIFFE IDs unless configured otherwise.
pub const DEFAULT_TRUST_DOMAIN: &str = "neocloud.local";

/// How the callback server behaves.
#[derive(Debug, Clone)]
pub struct CallbackConfig {
    /// Address to listen on (port 0 picks one).
    pub listen: std::net::SocketAddr,
    /// Trust domain of the sessions' SPIFFE IDs.
    pub trust_domain: String,
    /// Lifetime of bootstrap tokens (10 min by default).
    pub bootstrap_ttl: Duration,
    /// Lifetime of session tokens (15 min by default).
    pub session_ttl: Duration,
    /// Lifetime of the renewal credential handed out with each session (24 h by default): how
    /// long a runner can be cut off from every replica and still get back in.
    pub renewal_ttl: Duration,
    /// A runner that authenticated and then is silent this long is reported `Lost` (60 s).
    pub heartbeat_timeout: Duration,
    /// Per-binding log size.
    pub log_limits: LogLimits,
    /// Token exchanges per client IP.
    pub token_rate_per_ip: RateLimit,
    /// Authenticated requests per binding.
    pub request_rate_per_binding: RateLimit,
    /// The keys of sessions and re-authentication credentials (random unless the node's
    /// runner identity is given: then every replica has the same).
    pub keys: RunnerKeys,
    /// How long after start a runner of a binding not adopted yet gets 503 (try again) rather
    /// than 403: the time the node takes to find its bindings again after a restart (none by
    /// default: nothing to adopt).
    pub adoption_window: Duration,
    /// How long [`CallbackHandle::open_session`] waits for the runner to dial back (15 s).
    pub session_open_timeout: Duration,
    /// How many sessions a binding may have open (or being opened) at once (16): execs and
    /// `kubectl port-forward` connections.
    pub max_sessions_per_binding: usize,
    /// How many connections its relay may carry to a binding at once (1024), counted apart from
    /// [`max_sessions_per_binding`](Self::max_sessions_per_binding) so that a serving replica's
    /// traffic neither is capped by nor crowds out `kubectl exec`.
    pub max_relayed_per_binding: usize,
    /// The listener's bounds: open connections, header and body timeouts.
    pub serve: crate::serving::ServeLimits,
    /// How runners' egress connections are dialled and bounded.
    pub egress: EgressConfig,
}

impl Default for CallbackConfig {
    fn default() -> Self {
        Self {
            listen: std::net::SocketAddr::from(([0, 0, 0, 0], 8443)),
            trust_domain: DEFAULT_TRUST_DOMAIN.to_string(),
            bootstrap_ttl: tokens::DEFAULT_BOOTSTRAP_TTL,
            session_ttl: tokens::DEFAULT_SESSION_TTL,
            renewal_ttl: tokens::DEFAULT_RENEWAL_TTL,
            heartbeat_timeout: Duration::from_secs(60),
            log_limits: LogLimits::default(),
            token_rate_per_ip: RateLimit {
                burst: 10,
                per_second: 1.0,
            },
            request_rate_per_binding: RateLimit {
                burst: 100,
                per_second: 20.0,
            },
            keys: RunnerKeys::random(),
            adoption_window: Duration::ZERO,
            session_open_timeout: Duration::from_secs(15),
            max_sessions_per_binding: 16,
            max_relayed_per_binding: 1024,
            serve: crate::serving::ServeLimits::default(),
            egress: EgressConfig::default(),
        }
    }
}

/// What the node learns about a binding's runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerEvent {
    /// The binding.
    pub uid: String,
    /// The rental whose runner it is about.
    pub rental: u64,
    /// What happened.
    pub kind: RunnerEventKind,
}

/// The kinds of [`RunnerEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerEventKind {
    /// The runner reported a state.
    State(StatusReport),
    /// The runner authenticated, then sent no heartbeat for the heartbeat timeout. Sent once
    /// per registration; the runner is not trusted again until the binding is re-registered.
    Lost,
}

/// Errors of the callback server and its handle. Messages never contain a secret.
#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    /// The binding is not registered.
    #[error("binding {0} is not registered with the runner callback")]
    NotRegistered(String),
    /// The previous run's log was asked for, and the workload of the binding has not been
    /// restarted in place (or that run's log is no longer kept).
    #[error("binding {0} has no previous run of its workload")]
    NoPreviousRun(String),
    /// The caller is the runner of a rental of the binding that is no longer current: it was
    /// replaced, or its runner was declared lost. It must stop its workload.
    #[error(
        "rental no longer current: rental {rental} of binding {uid} is not believed ({why}); stop the workload"
    )]
    RentalNotCurrent {
        /// The binding.
        uid: String,
        /// The rental the caller's token names.
        rental: u64,
        /// Why, in words.
        why: String,
    },
    /// A boot credential (from `user_data`) of a rental whose runner has already called in.
    #[error(
        "the boot credential of rental {rental} of binding {uid} is spent: its runner has \
         called in (a runner renews with the credential it was given with its session)"
    )]
    CredentialSpent {
        /// The binding.
        uid: String,
        /// The rental.
        rental: u64,
    },
    /// The node started moments ago and has not found this binding again yet.
    #[error("binding {0} is not known yet: the node is starting; try again")]
    NotAdoptedYet(String),
    /// A token could not be issued (for example, a uid that cannot be part of a SPIFFE ID).
    #[error("failed to issue a token: {0}")]
    Token(#[from] TokenError),
    /// TLS material could not be made or loaded.
    #[error("runner callback TLS: {0}")]
    Tls(String),
    /// The listening socket could not be opened.
    #[error("runner callback: {0}")]
    Bind(String),
    /// The binding's runner has exited or was declared lost: nothing can serve a session.
    #[error("the runner of binding {uid} has {how}: no session can be opened")]
    RunnerGone {
        /// The binding.
        uid: String,
        /// "exited" or "been declared lost".
        how: &'static str,
    },
    /// The runner did not dial back for a session in time.
    #[error("the runner of binding {uid} did not open the session within {after:?}: {why}")]
    SessionTimeout {
        /// The binding.
        uid: String,
        /// How long the node waited.
        after: Duration,
        /// Whether the runner took the offer at all, in words.
        why: &'static str,
    },
    /// The binding already has as many sessions as it may.
    #[error("binding {uid} already has {limit} sessions open or opening: close one first")]
    TooManySessions {
        /// The binding.
        uid: String,
        /// The limit ([`CallbackConfig::max_sessions_per_binding`]).
        limit: usize,
    },
    /// The runner asked for an egress destination its Pod did not name: nothing is dialled.
    #[error(
        "binding {uid} named no egress destination {index} (it names {named}): the node dials \
         only the destinations of the Pod's cloud.aibrix.ai/egress"
    )]
    EgressNotNamed {
        /// The binding.
        uid: String,
        /// The index asked for.
        index: String,
        /// How many destinations the Pod names.
        named: usize,
    },
    /// The binding already has as many egress connections as it may.
    #[error(
        "binding {uid} already has {limit} egress connections open (the limit \
         runner.egress.maxConnectionsPerBinding): close one first"
    )]
    TooManyEgress {
        /// The binding.
        uid: String,
        /// The limit ([`EgressConfig::max_connections_per_binding`]).
        limit: usize,
    },
    /// The runner of a machine held for a Pod asked for a workload: no Pod has taken the
    /// machine yet, and it waits on `GET /v1/handover`.
    #[error(
        "binding {0} is a machine held for a Pod that has not come yet: no workload; wait on \
         GET /v1/handover"
    )]
    HeldForAPod(String),
    /// A handover was asked of (or for) a binding that is not a machine held for a Pod, or
    /// whose runner was declared lost.
    #[error("binding {uid} cannot be handed over: {why}")]
    NotHeld {
        /// The binding.
        uid: String,
        /// Why, in words.
        why: &'static str,
    },
    /// This node carries no egress (it has no dialer).
    #[error("this node does not carry egress connections")]
    EgressUnavailable,
    /// The runner dialled back but the connection could not be taken over.
    #[error("failed to open a session with the runner of binding {uid}: {message}")]
    SessionFailed {
        /// The binding.
        uid: String,
        /// Why.
        message: String,
    },
}

impl From<crate::tls::TlsError> for CallbackError {
    fn from(e: crate::tls::TlsError) -> Self {
        match e {
            crate::tls::TlsError::Material(m) => Self::Tls(m),
            crate::tls::TlsError::Bind(m) => Self::Bind(m),
        }
    }
}
