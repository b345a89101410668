//! [`NodeWorkloads`]: the [`Workloads`] of the node, which finds a Pod by namespace and name
//! through [`NodePods`], and then reads the runner callback's log of its binding and opens
//! sessions with its runner, or, for Pods their provider runs itself (a remote cluster's), asks
//! the provider through [`NodePods`] too.
//!
//! Not the trait or its errors (the parent module), and not HTTP: the server has authenticated
//! and authorized the caller before a source is asked.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use neocloud_core::ProviderId;
use neocloud_protocol::session::SessionRequest;
use neocloud_remote::callback::{CallbackError, CallbackHandle, LogOptions, SessionIo};

use super::{LogError, NodePods, PodPlacement, PodRef, PodUsage, Workloads};
use crate::slots::{DEFAULT_MAX_SESSIONS_PER_POD, PodSessions};

/// The node's workloads: those the node's runner runs (on any cloud) stream their output to the
/// runner callback and take sessions through it; other Pods' logs and sessions come from their
/// provider where it has an API for them ([`NodePods`]), and otherwise there are none.
#[derive(Clone)]
pub struct NodeWorkloads {
    pods: Arc<dyn NodePods>,
    callback: Option<CallbackHandle>,
    runner_providers: BTreeSet<ProviderId>,
    /// Providers whose Pods only a runner gives logs and sessions, named when there is none.
    runnerless: BTreeSet<ProviderId>,
    /// The providers that open sessions themselves, when known: a Pod the runner does not run
    /// elsewhere has none, which [`Workloads::check_session`] can then say before the upgrade.
    session_providers: Option<BTreeSet<ProviderId>>,
    /// Sessions open with each Pod the provider serves, and how many it may have.
    provider_open: PodSessions,
    max_provider_sessions: usize,
}

impl std::fmt::Debug for NodeWorkloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeWorkloads")
            .field("runner_providers", &self.runner_providers)
            .finish_non_exhaustive()
    }
}

impl NodeWorkloads {
    /// A source that finds Pods through `pods` and reads the callback's log of those placed on
    /// one of `runner_providers` (for example Lambda). Without a callback (no runner
    /// configured) no Pod has a log.
    pub fn new(
        pods: Arc<dyn NodePods>,
        callback: Option<CallbackHandle>,
        runner_providers: impl IntoIterator<Item = ProviderId>,
    ) -> Self {
        Self {
            pods,
            callback,
            runner_providers: runner_providers.into_iter().collect(),
            runnerless: BTreeSet::new(),
            session_providers: None,
            provider_open: PodSessions::default(),
            max_provider_sessions: DEFAULT_MAX_SESSIONS_PER_POD,
        }
    }

    /// The same, with at most `limit` sessions open at once with one Pod its provider serves
    /// (16 by default, as the runner callback allows per binding).
    pub fn with_max_provider_sessions(mut self, limit: usize) -> Self {
        self.max_provider_sessions = limit;
        self
    }

    /// The same, for a node without a runner: the Pods of `providers` (the clouds: Lambda,
    /// RunPod, Vast.ai) are refused logs and sessions with
    /// [`LogError::NoRunnerConfigured`], which names the missing configuration, rather than as
    /// if their provider were to blame.
    pub fn with_runnerless_providers(
        mut self,
        providers: impl IntoIterator<Item = ProviderId>,
    ) -> Self {
        self.runnerless = providers.into_iter().collect();
        self
    }

    /// Why `pod` on `provider` has no `what`, when the cause is that the node has no runner.
    fn no_runner_configured(
        &self,
        pod: &PodRef,
        provider: ProviderId,
        what: &'static str,
    ) -> Result<(), LogError> {
        if self.callback.is_none() && self.runnerless.contains(&provider) {
            return Err(LogError::NoRunnerConfigured {
                pod: pod.clone(),
                what,
            });
        }
        Ok(())
    }

    /// The same, knowing that only the Pods of `providers` (for example a remote cluster's) have
    /// sessions with their provider: the others, when the runner does not run them, are
    /// refused exec, attach and port-forward before the upgrade ([`LogError::NoRunner`]).
    pub fn with_session_providers(
        mut self,
        providers: impl IntoIterator<Item = ProviderId>,
    ) -> Self {
        self.session_providers = Some(providers.into_iter().collect());
        self
    }

    fn run_by_runner(&self, placement: &PodPlacement) -> bool {
        placement.runner
            || placement
                .provider
                .as_ref()
                .is_some_and(|p| self.runner_providers.contains(p))
    }

    /// The log of a Pod the runner does not run, from its provider if it has a log API.
    async fn provider_log(
        &self,
        pod: &PodRef,
        placement: &PodPlacement,
        provider: ProviderId,
        opts: LogOptions,
    ) -> Result<BoxStream<'static, Bytes>, LogError> {
        let no_api = || LogError::NoLogApi {
            provider: provider.to_string(),
        };
        let Some(instance) = &placement.instance else {
            return Err(no_api());
        };
        match self.pods.provider_logs(provider, instance, opts).await {
            Ok(Some(stream)) => Ok(stream),
            Ok(None) => Err(no_api()),
            Err(message) => Err(LogError::Internal {
                pod: pod.clone(),
                message,
            }),
        }
    }

    /// The placement of `pod`, checked against `container` (when one is named).
    fn placement(&self, pod: &PodRef, container: Option<&str>) -> Result<PodPlacement, LogError> {
        let placement = (self.pods.find(&pod.namespace, &pod.name))
            .ok_or_else(|| LogError::PodNotFound { pod: pod.clone() })?;
        let Some(container) = container else {
            return Ok(placement);
        };
        if !placement.containers.iter().any(|c| c == container) {
            return Err(LogError::ContainerNotFound {
                pod: pod.clone(),
                container: container.to_owned(),
            });
        }
        Ok(placement)
    }
}

#[async_trait]
impl Workloads for NodeWorkloads {
    async fn logs(
        &self,
        pod: &PodRef,
        container: &str,
        opts: LogOptions,
    ) -> Result<BoxStream<'static, Bytes>, LogError> {
        let placement = self.placement(pod, Some(container))?;
        let waiting = |reason: String| LogError::NotStarted {
            pod: pod.clone(),
            container: container.to_owned(),
            reason,
        };
        let no_previous = || LogError::NoPrevious {
            pod: pod.name.clone(),
            container: container.to_owned(),
        };
        let Some(provider) = placement.provider else {
            if opts.previous {
                return Err(no_previous());
            }
            return Err(waiting("the pod is not placed on a cloud yet".into()));
        };
        self.no_runner_configured(pod, provider, "logs")?;
        let callback = match &self.callback {
            Some(callback) if self.run_by_runner(&placement) => callback,
            // The provider's log is of the one instance: a replaced one's went with it.
            _ if opts.previous => return Err(no_previous()),
            _ => return self.provider_log(pod, &placement, provider, opts).await,
        };
        callback
            .read_logs(&placement.uid, opts)
            .map_err(|e| match e {
                CallbackError::NotRegistered(_) if opts.previous => no_previous(),
                CallbackError::NoPreviousRun(_) => no_previous(),
                CallbackError::NotRegistered(_) => {
                    waiting(format!("the runner on {provider} has not been set up yet"))
                }
                other => LogError::Internal {
                    pod: pod.clone(),
                    message: other.to_string(),
                },
            })
    }

    async fn open_session(
        &self,
        pod: &PodRef,
        container: Option<&str>,
        request: SessionRequest,
    ) -> Result<SessionIo, LogError> {
        self.open(pod, container, request, false).await
    }

    async fn open_relayed(&self, pod: &PodRef, port: u16) -> Result<SessionIo, LogError> {
        let request = SessionRequest::PortForward { port };
        self.open(pod, None, request, true).await
    }

    fn check_session(
        &self,
        pod: &PodRef,
        container: Option<&str>,
        what: &'static str,
    ) -> Result<(), LogError> {
        let placement = self.placement(pod, container)?;
        let container = container
            .or(placement.containers.first().map(String::as_str))
            .unwrap_or_default();
        let Some(provider) = placement.provider else {
            return Err(LogError::NotStarted {
                pod: pod.clone(),
                container: container.to_owned(),
                reason: "the pod is not placed on a cloud yet".into(),
            });
        };
        self.no_runner_configured(pod, provider, what)?;
        match &self.callback {
            Some(callback) if self.run_by_runner(&placement) => callback
                .session_ready(&placement.uid)
                .map_err(|e| session_error(pod, container, provider, e)),
            _ => match &self.session_providers {
                Some(served) if !served.contains(&provider) => Err(LogError::NoRunner {
                    pod: pod.clone(),
                    provider: provider.to_string(),
                    what,
                }),
                // Sessions with the provider, or none: said when one is opened.
                _ => Ok(()),
            },
        }
    }

    fn usage(&self) -> Vec<PodUsage> {
        let Some(callback) = &self.callback else {
            return Vec::new();
        };
        self.pods
            .list()
            .into_iter()
            .filter(|(_, _, placement)| self.run_by_runner(placement))
            .filter_map(|(namespace, name, placement)| {
                Some(PodUsage {
                    stats: callback.stats(&placement.uid)?,
                    container: placement.containers.first()?.clone(),
                    uid: placement.uid,
                    namespace,
                    name,
                })
            })
            .collect()
    }
}

impl NodeWorkloads {
    /// Opens `request` on the runner of `pod` (a relay's connection when `relayed`), or on
    /// its provider.
    async fn open(
        &self,
        pod: &PodRef,
        container: Option<&str>,
        request: SessionRequest,
        relayed: bool,
    ) -> Result<SessionIo, LogError> {
        let what = match request {
            SessionRequest::Exec { .. } => "exec",
            SessionRequest::PortForward { .. } => "port-forward",
        };
        let placement = self.placement(pod, container)?;
        let container = container
            .or(placement.containers.first().map(String::as_str))
            .unwrap_or_default()
            .to_owned();
        let Some(provider) = placement.provider else {
            return Err(LogError::NotStarted {
                pod: pod.clone(),
                container,
                reason: "the pod is not placed on a cloud yet".into(),
            });
        };
        self.no_runner_configured(pod, provider, what)?;
        let callback = match &self.callback {
            Some(callback) if self.run_by_runner(&placement) => callback,
            _ => {
                let no_runner = || LogError::NoRunner {
                    pod: pod.clone(),
                    provider: provider.to_string(),
                    what,
                };
                let Some(instance) = &placement.instance else {
                    return Err(no_runner());
                };
                let limit = self.max_provider_sessions;
                let Some(slot) = self.provider_open.take(pod, limit) else {
                    let pod = pod.clone();
                    return Err(LogError::TooManySessions { pod, limit });
                };
                return match self
                    .pods
                    .provider_session(provider, instance, request)
                    .await
                {
                    Ok(Some(io)) => Ok(slot.hold(io)),
                    Ok(None) => Err(no_runner()),
                    Err(message) => Err(LogError::Session {
                        pod: pod.clone(),
                        message,
                    }),
                };
            }
        };
        let opened = match request {
            SessionRequest::PortForward { port } if relayed => {
                callback.open_relayed(&placement.uid, port).await
            }
            request => callback.open_session(&placement.uid, request).await,
        };
        opened.map_err(|e| session_error(pod, &container, provider, e))
    }
}

/// Why the runner of `pod` on `provider` did not open a session for `container`.
fn session_error(
    pod: &PodRef,
    container: &str,
    provider: ProviderId,
    e: CallbackError,
) -> LogError {
    match e {
        CallbackError::NotRegistered(_) => LogError::NotStarted {
            pod: pod.clone(),
            container: container.to_owned(),
            reason: format!("the runner on {provider} has not been set up yet"),
        },
        other => LogError::Session {
            pod: pod.clone(),
            message: other.to_string(),
        },
    }
}

#[cfg(test)]
#[path = "callback_tests.rs"]
mod tests;
