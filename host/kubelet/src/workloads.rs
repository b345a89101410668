//! What the kubelet API reaches through the node: the [`Workloads`] trait (a container's log,
//! exec and port-forward sessions, the relays' connections, usage), its errors (each with the
//! HTTP status the kubelet would answer), and what the node answers about its Pods
//! ([`NodePods`]: where each is, [`PodPlacement`], and the logs and sessions of the providers
//! that serve them themselves). The node's [`NodeWorkloads`], which reads the runner callback
//! or asks the provider, is in `callback`.
//!
//! Not HTTP and not authorization: the server has authenticated and authorized the caller before
//! a source is asked.

mod callback;

use async_trait::async_trait;
use axum::http::StatusCode;
use bytes::Bytes;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use neocloud_core::ProviderId;
use neocloud_protocol::session::SessionRequest;
use neocloud_remote::callback::{LogOptions, SessionIo};

pub use callback::NodeWorkloads;

/// A Pod as the kubelet API names it: `/containerLogs/{namespace}/{name}/{container}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// The Pod's namespace.
    pub namespace: String,
    /// The Pod's name.
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a log cannot be served. Each variant maps to the status the kubelet answers
/// ([`LogError::status`]); the message is the response body, which the API server passes on to
/// `kubectl logs`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// The Pod is not on this node (or does not exist).
    #[error("pod {pod} does not exist on this node")]
    PodNotFound {
        /// The Pod asked for.
        pod: PodRef,
    },
    /// The Pod has no container of that name.
    #[error("container {container:?} is not valid for pod {pod}")]
    ContainerNotFound {
        /// The Pod.
        pod: PodRef,
        /// The container asked for.
        container: String,
    },
    /// The Pod runs on a provider that offers no way to read a workload's output.
    #[error("logs are not available for pods on {provider}: the provider has no log API")]
    NoLogApi {
        /// The provider, for example `runpod`.
        provider: String,
    },
    /// The container has not started, so there is no log yet.
    #[error("container {container:?} in pod {pod} is waiting to start: {reason}")]
    NotStarted {
        /// The Pod.
        pod: PodRef,
        /// The container.
        container: String,
        /// What it waits for.
        reason: String,
    },
    /// `previous=true` for a container that was never restarted in place (or whose instance
    /// was replaced: the old machine's output went with it), worded as a kubelet's.
    #[error("previous terminated container {container:?} in pod {pod:?} not found")]
    NoPrevious {
        /// The Pod's name.
        pod: String,
        /// The container.
        container: String,
    },
    /// The Pod's provider gives logs and sessions only through the node's runner, and this
    /// node has no `runner:` section: the cause is the node's configuration, not the provider.
    #[error("{what} {verb} not available for pod {pod}: {why}", verb = be(.what), why = NO_RUNNER_CONFIGURED)]
    NoRunnerConfigured {
        /// The Pod.
        pod: PodRef,
        /// What was asked: `logs`, `exec`, `attach` or `port-forward`.
        what: &'static str,
    },
    /// The Pod runs without the node's runner, so there is nothing to enter.
    #[error(
        "{what} is not available for pod {pod}: it runs on {provider} without the node's runner"
    )]
    NoRunner {
        /// The Pod.
        pod: PodRef,
        /// Its provider.
        provider: String,
        /// What was asked: `exec`, `attach` or `port-forward`.
        what: &'static str,
    },
    /// The runner (or, for a Pod it does not run, the provider) did not open an interactive
    /// session.
    #[error("failed to open a session with pod {pod}: {message}")]
    Session {
        /// The Pod.
        pod: PodRef,
        /// What failed.
        message: String,
    },
    /// The Pod already has as many sessions open as it may.
    #[error("pod {pod} already has {limit} sessions open or opening: close one first")]
    TooManySessions {
        /// The Pod.
        pod: PodRef,
        /// The limit.
        limit: usize,
    },
    /// The source failed.
    #[error("failed to read the logs of pod {pod}: {message}")]
    Internal {
        /// The Pod.
        pod: PodRef,
        /// What failed.
        message: String,
    },
}

/// Why a Pod on a cloud has no logs or sessions when the node has no `runner:` section, and
/// where to read how to give it one.
pub const NO_RUNNER_CONFIGURED: &str =
    "no runner configured for this node; see docs/RUNNER.md for its `runner:` section";

/// The verb `what` takes: "logs are", "exec is".
fn be(what: &str) -> &'static str {
    if what.ends_with('s') { "are" } else { "is" }
}

impl LogError {
    /// The HTTP status the kubelet answers a log request with. A provider without a log API (or
    /// a node without a runner) is a 400, not a 501: the API server hands a kubelet's 400 body
    /// to `kubectl logs` as the error message, while it replaces the body of other statuses
    /// with a generic one.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::PodNotFound { .. } => StatusCode::NOT_FOUND,
            Self::ContainerNotFound { .. }
            | Self::NoLogApi { .. }
            | Self::NotStarted { .. }
            | Self::NoPrevious { .. }
            | Self::NoRunnerConfigured { .. }
            | Self::NoRunner { .. } => StatusCode::BAD_REQUEST,
            Self::Session { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::TooManySessions { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The HTTP status an exec, attach or port-forward is refused with, before the upgrade. The
    /// API server hands a refused upgrade's `metav1.Status` to kubectl whole (its code and
    /// message), so these are the statuses' own meanings: an unknown Pod or container is a 404,
    /// a node without a runner a 503.
    pub fn stream_status(&self) -> StatusCode {
        match self {
            Self::PodNotFound { .. } | Self::ContainerNotFound { .. } => StatusCode::NOT_FOUND,
            Self::NoRunnerConfigured { .. } => StatusCode::SERVICE_UNAVAILABLE,
            other => other.status(),
        }
    }
}

/// The workloads of the node's Pods as the kubelet API reaches them: their logs, exec and
/// port-forward sessions, the relays' connections and their usage.
#[async_trait]
pub trait Workloads: Send + Sync {
    /// The log of `container` in `pod` with the kubelet's `opts`, one chunk per line. With
    /// `opts.follow` the stream stays open for new lines until the workload ends. Read-only:
    /// any number of calls may run concurrently and each gets its own stream.
    async fn logs(
        &self,
        pod: &PodRef,
        container: &str,
        opts: LogOptions,
    ) -> Result<BoxStream<'static, Bytes>, LogError>;

    /// The latest usage sample of every Pod on this node that has one (runner-run Pods whose
    /// runner has sent one), for `/stats/summary` and `/metrics/resource`.
    fn usage(&self) -> Vec<PodUsage> {
        Vec::new()
    }

    /// Opens `request` on the runner of `pod`: an exec in `container`, or a forwarded
    /// connection (`container` is then `None`: the Pod's network is one). Without a runner there
    /// is nothing to open.
    async fn open_session(
        &self,
        pod: &PodRef,
        container: Option<&str>,
        request: SessionRequest,
    ) -> Result<SessionIo, LogError> {
        let _ = (container, request);
        Err(LogError::PodNotFound { pod: pod.clone() })
    }

    /// Opens a connection to `port` of `pod` for its relay: a port-forward session, counted
    /// apart from `kubectl exec` and `port-forward` where the source can (the runner's
    /// callback), so that serving traffic neither is capped by their limit nor crowds them out.
    async fn open_relayed(&self, pod: &PodRef, port: u16) -> Result<SessionIo, LogError> {
        self.open_session(pod, None, SessionRequest::PortForward { port })
            .await
    }

    /// Whether `what` (`exec`, `attach` or `port-forward`) into `container` of `pod` (`None`:
    /// the Pod's network) can be served, as far as the node knows without asking anyone: the
    /// Pod is here with that container and placed, the node has a runner for it, and the
    /// runner is registered and alive. The kubelet API checks this before it answers 101, so
    /// that a refusal reaches kubectl with its own status; what is then opened can still fail.
    /// Cheap and read-only.
    fn check_session(
        &self,
        pod: &PodRef,
        container: Option<&str>,
        what: &'static str,
    ) -> Result<(), LogError> {
        let _ = (pod, container, what);
        Ok(())
    }
}

/// What the kubelet API asks of the node about its Pods: where each one is (found by namespace
/// and name, or all of them), and, for the Pods their provider runs itself (a remote cluster's),
/// the provider's log and sessions. The node answers from its reconciler's caches and its
/// providers; [`NodeWorkloads`](callback::NodeWorkloads) asks it.
#[async_trait]
pub trait NodePods: Send + Sync {
    /// The Pod `namespace/name` on this node and where it runs; `None` when it is not here.
    fn find(&self, namespace: &str, name: &str) -> Option<PodPlacement>;

    /// Every Pod on this node: namespace, name and placement.
    fn list(&self) -> Vec<(String, String, PodPlacement)> {
        Vec::new()
    }

    /// The log of `instance` read from `provider` with `opts`; `Ok(None)` when the provider has
    /// no log API, `Err` saying why it failed.
    async fn provider_logs(
        &self,
        provider: ProviderId,
        instance: &str,
        opts: LogOptions,
    ) -> Result<Option<BoxStream<'static, Bytes>>, String> {
        let _ = (provider, instance, opts);
        Ok(None)
    }

    /// An exec or port-forward session with `instance` opened by `provider`, as a stream
    /// speaking the runner session's frames; `Ok(None)` when the provider has no session API,
    /// `Err` saying why it failed.
    async fn provider_session(
        &self,
        provider: ProviderId,
        instance: &str,
        request: SessionRequest,
    ) -> Result<Option<SessionIo>, String> {
        let _ = (provider, instance, request);
        Ok(None)
    }
}

/// One Pod's latest usage, as its runner sampled it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUsage {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
    /// Its container's name.
    pub container: String,
    /// The sample.
    pub stats: neocloud_protocol::WorkloadStats,
}

/// Where a Pod on this node runs, as the reconciler knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlacement {
    /// The Pod's uid: the uid of its binding in the runner callback.
    pub uid: String,
    /// The provider it was rented on, `None` while it is not placed yet.
    pub provider: Option<ProviderId>,
    /// The names of its containers.
    pub containers: Vec<String>,
    /// Whether the node's runner runs it (its logs come from the callback), whatever the
    /// provider; Pods on the source's `runner_providers` always are.
    pub runner: bool,
    /// The provider's id of its instance, once rented.
    pub instance: Option<String>,
}

impl PodPlacement {
    /// The placement of `pod` on `provider`: its uid and container names.
    pub fn of(pod: &Pod, provider: Option<ProviderId>) -> Self {
        let containers = pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        Self {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            provider,
            containers,
            runner: false,
            instance: None,
        }
    }

    /// The same, run by the node's runner or not.
    pub fn with_runner(mut self, runner: bool) -> Self {
        self.runner = runner;
        self
    }

    /// The same, with its instance's provider id.
    pub fn with_instance(mut self, instance: Option<String>) -> Self {
        self.instance = instance;
        self
    }
}
