//! The node's kubelet API: what the API server calls for `kubectl logs`, `exec`, `attach`,
//! `port-forward` and what metrics-server scrapes. A TLS server on the port the Node advertises
//! (`daemonEndpoints.kubeletEndpoint`, 10250 by default) that serves
//! `GET /containerLogs/{namespace}/{pod}/{container}` with the kubelet's query parameters,
//! `/exec`, `/attach` and `/portForward` over SPDY (`streams`, [`spdy`]), `/stats/summary`,
//! `/metrics/resource` and `GET /healthz`; and the relays of burst Pods ([`relay`]), whose
//! connections from the cluster network it takes at `GET /relay/{uid}/{port}`.
//!
//! Callers authenticate as a kubelet's do: with a client certificate that chains to
//! [`KubeletConfig::client_ca_pem`] (the API server's `--kubelet-client-certificate`), or with a
//! bearer token the API server accepts in a TokenReview. They are then authorized by a
//! SubjectAccessReview for the node's `proxy` subresource: the HTTP method's verb for logs,
//! `create` for `/exec`, `/attach` and `/portForward` whatever the method. Logs come from a
//! [`Workloads`]; [`NodeWorkloads`] reads those the runner callback (`neocloud-remote`)
//! holds.
//!
//! ```no_run
//! # async fn demo(
//! #     client: kube::Client,
//! #     source: std::sync::Arc<dyn neocloud_kubelet::Workloads>,
//! # ) -> Result<(), neocloud_kubelet::KubeletError> {
//! use std::sync::Arc;
//! use neocloud_remote::callback::TlsMaterial;
//! use neocloud_kubelet::{KubeAccessReview, KubeletConfig, KubeletServer};
//!
//! let config = KubeletConfig::for_node("gpu-burst", 10250)
//!     .with_client_ca_file("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt".as_ref())?;
//! let tls = TlsMaterial::self_signed(&["gpu-burst".to_owned(), "10.0.0.5".to_owned()])?;
//! let reviews = Arc::new(KubeAccessReview::new(client));
//! let server = KubeletServer::start(config, &tls, reviews, source).await?;
//! # server.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Not the Node object (the node crate's `vnode`) and not where a Pod's provider is decided: the
//! reconciler knows that and hands it over through [`NodePods`]. Not the runner callback,
//! the listener's TLS or its bounds either: those are `neocloud-remote`'s, shared with the
//! callback server.

mod auth;
pub mod relay;
/// The parsing of a log request, public only for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub mod request;
mod server;
mod slots;
/// SPDY/3.1, the multiplexing of `kubectl exec` and `port-forward` after the HTTP upgrade.
pub mod spdy;
mod streams;
mod usage;
mod workloads;
mod x509;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use auth::{AccessReview, Decision, KubeAccessReview, Refusal, ReviewError, UserInfo};
pub use request::RequestError;
pub use server::KubeletServer;
pub use slots::DEFAULT_MAX_SESSIONS_PER_POD;
pub use workloads::{
    LogError, NO_RUNNER_CONFIGURED, NodePods, NodeWorkloads, PodPlacement, PodRef, PodUsage,
    Workloads,
};

use neocloud_remote::tls::TlsError;

/// The kubelet API port unless configured otherwise.
pub const DEFAULT_PORT: u16 = 10250;

/// How the kubelet API server behaves.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Address to listen on (port 0 picks one).
    pub listen: SocketAddr,
    /// The node's name: the object of the SubjectAccessReviews.
    pub node_name: String,
    /// The CA (PEM) whose client certificates authenticate their common name and organizations,
    /// usually the cluster CA that signed the API server's kubelet client certificate. Without
    /// it only bearer tokens authenticate.
    pub client_ca_pem: Option<String>,
    /// How long accepted tokens and allowed users are remembered (30 s by default; zero turns
    /// the caches off). Refused tokens are remembered for this long but at most 5 s; denials
    /// are not remembered.
    pub auth_cache_ttl: Duration,
    /// The listener's bounds: open connections, header and body timeouts.
    pub serve: neocloud_remote::serving::ServeLimits,
    /// Each SPDY connection's bounds (exec, attach, port-forward): open streams, idle timeout.
    pub streams: spdy::Limits,
    /// The relays of burst Pods served at `/relay/{uid}/{port}`; `None`: none.
    pub relays: Option<std::sync::Arc<crate::relay::RelayTable>>,
}

impl KubeletConfig {
    /// Listens on every address at [`DEFAULT_PORT`] for node `node_name`, with no client CA.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
            node_name: node_name.into(),
            client_ca_pem: None,
            auth_cache_ttl: Duration::from_secs(30),
            serve: neocloud_remote::serving::ServeLimits::default(),
            streams: spdy::Limits::default(),
            relays: None,
        }
    }

    /// The configuration for node `node_name` with its kubelet API on `port`.
    pub fn for_node(node_name: &str, port: u16) -> Self {
        let mut config = Self::new(node_name);
        config.listen.set_port(port);
        config
    }

    /// Trusts the client certificates of the CA in the PEM file at `path`.
    pub fn with_client_ca_file(mut self, path: &Path) -> Result<Self, KubeletError> {
        let pem = std::fs::read_to_string(path).map_err(|e| KubeletError::ClientCa {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        self.client_ca_pem = Some(pem);
        Ok(self)
    }
}

/// Errors of starting the kubelet API server.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The client CA file could not be read.
    #[error("failed to read the kubelet client CA {path}: {message}")]
    ClientCa {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
    /// TLS material could not be made or loaded.
    #[error("kubelet API TLS: {0}")]
    Tls(String),
    /// The listening socket could not be opened.
    #[error("kubelet API: {0}")]
    Bind(String),
}

impl From<TlsError> for KubeletError {
    fn from(e: TlsError) -> Self {
        match e {
            TlsError::Material(m) => Self::Tls(m),
            TlsError::Bind(m) => Self::Bind(m),
        }
    }
}
