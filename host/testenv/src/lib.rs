//! `neocloud-testenv`: a real Kubernetes control plane for tests, on loopback.
//!
//! It starts etcd, kube-apiserver (authorization `Node,RBAC`, the `NodeRestriction` admission
//! plugin, PKI generated here with a real CA), kube-scheduler and kube-controller-manager as
//! separate processes on free ports, waits until each is ready, writes kubeconfigs, and hands out
//! `kube::Client`s and a fresh namespace per test. Each component logs to its own file; the tail
//! of every log is printed when a test that holds a [`TestContext`] fails. Every process stops when
//! the control plane is dropped or the test process exits, even after a panic.
//!
//! The API server reaches a node's kubelet API (`kubectl logs`) at the node's InternalIP with a
//! client certificate from the same CA, user [`KUBELET_CLIENT_USER`] in `system:masters`: a
//! kubelet server under test trusts [`ControlPlane::ca_pem`] for client certificates.
//!
//! [`Registry`] runs a real OCI registry (the CNCF `distribution` registry) on loopback, with TLS
//! from its own CA and htpasswd basic auth, for tests that push and pull images.
//!
//! [`Collector`] runs a real OpenTelemetry Collector on loopback (OTLP/HTTP and OTLP/gRPC in,
//! traces and metrics out to JSON-lines files), for tests that export telemetry and read what
//! arrived.
//!
//! [`Kwok`] runs KWOK's controller against a control plane as the kubelets of its fake GPU nodes
//! (the remote clusters of the `kube` provider's tests): nodes Ready, Pods Running, exit codes and
//! image pull errors on request, deletions completed, container logs served.
//!
//! [`Kueue`] installs Kueue (CRDs, webhooks, the ProvisioningRequest CRD) on a control plane and
//! runs its manager, for tests of queueing and admission checks.
//!
//! [`Docker`] runs Debian's `dockerd` with its own root and socket, without firewall rules or a
//! bridge, for tests of the runner's container executor.
//!
//! The binaries are built from the Go module proxy by `hack/testenv/build.sh`,
//! `hack/testenv/build-otelcol.sh`, `hack/testenv/build-kwok.sh` and
//! `hack/testenv/build-kueue.sh`; the registry is Debian's, linked into the same cache by
//! `hack/testenv/build-registry.sh` (all of them: `make testenv`); this crate never builds them. It is for
//! tests and local runs, not for production clusters.
//!
//! ```no_run
//! # async fn demo() {
//! let ctx = neocloud_testenv::TestContext::new("my-test").await;
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = ctx.namespaced();
//! # }
//! ```

mod binaries;
mod components;
mod context;
mod control_plane;
pub mod docker;
mod kubeconfig;
pub mod kueue;
pub mod kwok;
pub mod nodes;
pub mod otelcol;
mod pki;
mod process;
mod readiness;
pub mod registry;
pub mod worker;

use std::path::PathBuf;
use std::time::Duration;

pub use binaries::{BINARIES, locate as locate_binaries};
pub use components::KUBELET_CLIENT_USER;
pub use context::{TestContext, shared};
pub use control_plane::{ControlPlane, Options};
pub use docker::Docker;
pub use kueue::Kueue;
pub use kwok::Kwok;
pub use otelcol::Collector;
pub use pki::{CertPair, Pki};
pub use readiness::free_port;
pub use registry::Registry;
pub use worker::WorkerNode;

/// Everything that can go wrong while starting or using a control plane, a registry or a
/// collector.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The binaries have not been built.
    #[error(
        "control plane binaries missing in {dir}: {missing}; build them with `make testenv` \
         (hack/testenv/build.sh) or set NEOCLOUD_TESTENV_BIN"
    )]
    MissingBinaries {
        /// The directory searched.
        dir: PathBuf,
        /// The binaries that are not there.
        missing: String,
    },
    /// A tool of the rig built from the Go module proxy (the OCI registry, the collector, kwok,
    /// kueue, the kubelet or kube-proxy) has not been built.
    #[error(
        "{tool} binary missing at {path}; build it with `make testenv` (hack/testenv/{script}) \
         or set {env}"
    )]
    MissingTool {
        /// The tool, as people name it ("OpenTelemetry Collector").
        tool: String,
        /// The path searched.
        path: PathBuf,
        /// The script under hack/testenv that builds it.
        script: String,
        /// The environment variable that says where it is instead.
        env: String,
    },
    /// A manifest the harness installs (a CRD, a webhook configuration) is unusable or did not
    /// take effect.
    #[error("manifest {path}: {message}")]
    Manifest {
        /// The file, or the object's name.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Debian's Docker engine is not installed.
    #[error(
        "{program} not found on PATH or in /usr/sbin; install Debian's docker.io (`.ci/run` \
         does, from hack/ci/debian-packages.txt)"
    )]
    MissingDocker {
        /// The program looked for.
        program: String,
    },
    /// A program the worker node needs is not installed.
    #[error(
        "{program} not found on PATH, in /usr/sbin or in /usr/lib/cni; install Debian's {package} \
         (`.ci/run` does, from hack/ci/debian-packages.txt)"
    )]
    MissingProgram {
        /// The program looked for.
        program: String,
        /// The Debian package that has it.
        package: String,
    },
    /// A file or process operation failed.
    #[error("failed to {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error("failed to generate {what}: {source}")]
    Pki {
        /// Which certificate or key.
        what: String,
        /// The underlying error.
        source: rcgen::Error,
    },
    /// A kubeconfig could not be written or loaded.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A component exited before it became ready.
    #[error("{component} exited ({status}) before it was ready; last lines of {log}:\n{tail}")]
    Exited {
        /// The component.
        component: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// A component did not become ready in time.
    #[error("{component} not ready after {waited:?} ({reason}); last lines of {log}:\n{tail}")]
    NotReady {
        /// The component.
        component: String,
        /// How long we waited.
        waited: Duration,
        /// The last probe failure.
        reason: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// The control plane failed to start.
    #[error(
        "control plane in {dir} failed to start (set NEOCLOUD_TESTENV_KEEP=1 to keep its files): \
         {source}\n{others}"
    )]
    Start {
        /// The control plane's directory.
        dir: PathBuf,
        /// The first failure.
        source: Box<Error>,
        /// The tails of the components that had started.
        others: String,
    },
    /// A Kubernetes API call made by the harness failed.
    #[error("kubernetes api call failed: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// Whether a component could not bind its port because another process took it after the
    /// harness picked it (the harness finds a free port and lets it go before the component
    /// starts).
    pub fn is_port_taken(&self) -> bool {
        match self {
            Error::Exited { tail, .. } => tail.contains("address already in use"),
            Error::Start { source, .. } => source.is_port_taken(),
            _ => false,
        }
    }
}

/// Writes `contents` to `path`; an error names the file.
pub(crate) fn write_file(path: &std::path::Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

#[cfg(test)]
mod error_tests {
    use super::Error;

    fn exited(tail: &str) -> Error {
        Error::Exited {
            component: "etcd".into(),
            status: "exit status: 1".into(),
            log: "etcd.log".into(),
            tail: tail.into(),
        }
    }

    #[test]
    fn a_component_that_lost_its_port_is_told_apart_from_other_failures() {
        let taken = exited(
            r#"{"level":"fatal","error":"listen tcp 127.0.0.1:42371: bind: address already in use"}"#,
        );
        assert!(taken.is_port_taken());
        let start = Error::Start {
            dir: "/tmp/cp".into(),
            source: Box::new(taken),
            others: String::new(),
        };
        assert!(start.is_port_taken(), "through the start error");
        assert!(!exited("panic: out of disk").is_port_taken());
    }
}
