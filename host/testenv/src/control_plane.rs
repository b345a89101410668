//! One real Kubernetes control plane on loopback: etcd, kube-apiserver (authorization
//! `Node,RBAC`, admission with `NodeRestriction`), kube-scheduler and kube-controller-manager,
//! each a separate process on free ports, with its own log file.
//!
//! It is for tests and local runs only: a single etcd member without fsync, certificates valid
//! for a year, everything bound to 127.0.0.1.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::kubeconfig::{self, KubeconfigSpec};
use crate::pki::{CertPair, Pki};
use crate::process::Supervised;
use crate::readiness;
use crate::{Error, binaries};

/// Tunables of a control plane; the defaults suit integration tests.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the binaries are; `None` finds them with [`binaries::locate`].
    pub bin_dir: Option<PathBuf>,
    /// How long the controller manager waits for a node's heartbeat before it marks the node
    /// unreachable and taints it (`--node-monitor-grace-period`).
    pub node_monitor_grace_period: Duration,
    /// Extra flags for kube-apiserver, appended after the defaults (a later flag wins). By
    /// default, `NEOCLOUD_TESTENV_APISERVER_ARGS` split on whitespace, for example
    /// `--profiling=true` to profile the API server under a bench.
    pub extra_apiserver_args: Vec<String>,
    /// Keep the working directory (certificates, kubeconfigs, logs, etcd data) after stopping.
    pub keep_dir: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bin_dir: None,
            node_monitor_grace_period: Duration::from_secs(10),
            extra_apiserver_args: std::env::var("NEOCLOUD_TESTENV_APISERVER_ARGS")
                .map(|args| args.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            keep_dir: std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_some(),
        }
    }
}

/// A running control plane. Dropping it stops every component; if it is never dropped (a
/// `static`), the components stop when the test process exits.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    bin: PathBuf,
    pki: Pki,
    api_url: String,
    components: Mutex<Vec<Supervised>>,
    keep_dir: bool,
}

/// The loopback ports of one control plane.
/// How many times [`ControlPlane::start`] tries when a picked port was taken meanwhile.
const START_TRIES: u32 = 3;

pub(crate) struct Ports {
    pub(crate) etcd_client: u16,
    pub(crate) etcd_peer: u16,
    pub(crate) apiserver: u16,
    pub(crate) scheduler: u16,
    pub(crate) controller_manager: u16,
}

impl ControlPlane {
    /// Starts every component and waits until each is ready. On failure, stops what started and
    /// returns an error that carries the failing component's log.
    ///
    /// Ports are picked free and then let go, so another process may take one before its
    /// component binds it; a start that fails that way is tried again with new ports, up to
    /// three times.
    pub async fn start(options: Options) -> Result<Self, Error> {
        let mut tries = 1;
        loop {
            match Self::start_once(&options).await {
                Err(e) if e.is_port_taken() && tries < START_TRIES => {
                    tracing::warn!(error = %e, "testenv: a port was taken before its component bound it; starting again with new ports");
                    tries += 1;
                }
                started => return started,
            }
        }
    }

    async fn start_once(options: &Options) -> Result<Self, Error> {
        let bin = match &options.bin_dir {
            Some(dir) => dir.clone(),
            None => binaries::locate()?,
        };
        let dir = tempfile::Builder::new()
            .prefix("neocloud-testenv-")
            .tempdir()
            .map_err(|e| Error::io("create the control plane directory", e))?
            .keep();
        std::fs::create_dir_all(dir.join("logs"))
            .map_err(|e| Error::io(format!("create {}/logs", dir.display()), e))?;
        let ports = Ports {
            etcd_client: readiness::free_port()?,
            etcd_peer: readiness::free_port()?,
            apiserver: readiness::free_port()?,
            scheduler: readiness::free_port()?,
            controller_manager: readiness::free_port()?,
        };
        let cp = Self {
            api_url: format!("https://127.0.0.1:{}", ports.apiserver),
            dir,
            bin: bin.clone(),
            pki: Pki::new()?,
            components: Mutex::new(Vec::new()),
            keep_dir: options.keep_dir,
        };
        match cp.start_components(&bin, &ports, options).await {
            Ok(()) => Ok(cp),
            Err(e) => {
                let others = cp.logs(20);
                Err(Error::Start {
                    dir: cp.dir.clone(),
                    source: Box::new(e),
                    others,
                })
            }
        }
    }

    async fn start_components(
        &self,
        bin: &Path,
        ports: &Ports,
        options: &Options,
    ) -> Result<(), Error> {
        self.write_pki()?;
        self.start_etcd(bin, ports).await?;
        self.start_apiserver(bin, ports, options).await?;
        self.start_scheduler(bin, ports).await?;
        self.start_controller_manager(bin, ports, options).await
    }

    /// `https://127.0.0.1:<port>` of the API server.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The control plane's working directory: certificates, kubeconfigs, logs, etcd data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate that signed every certificate of this control plane, PEM.
    pub fn ca_pem(&self) -> String {
        self.pki.ca_pem()
    }

    /// The CA certificate file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("pki/ca.crt")
    }

    /// The kubeconfig of the cluster administrator (`system:masters`), for kubectl and tests.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// A `kubectl` command (the one built with the control plane) talking to this API server as
    /// the administrator; add arguments and run it.
    pub fn kubectl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(self.bin.join("kubectl"));
        cmd.arg("--kubeconfig").arg(self.admin_kubeconfig());
        cmd
    }

    /// A client authenticated as the cluster administrator, bound to the current Tokio runtime.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        kubeconfig::client(&self.admin_kubeconfig()).await
    }

    /// A kubeconfig for a certificate identity `user` in `groups` (for example
    /// `system:node:gpu-1` in `system:nodes`), created on first use.
    pub fn kubeconfig_as(&self, user: &str, groups: &[&str]) -> Result<PathBuf, Error> {
        let slug: String = user
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let cert = self.write_cert(&format!("user-{slug}"), &self.pki.client(user, groups)?)?;
        let path = self.dir.join(format!("user-{slug}.kubeconfig"));
        kubeconfig::write(&path, &self.spec_for(&self.api_url, Some(cert)))
    }

    /// A kubeconfig (YAML) for a certificate identity `user` in `groups` with every certificate
    /// inline, as a remote cluster's kubeconfig Secret holds it (the node refuses file paths).
    pub fn inline_kubeconfig_as(&self, user: &str, groups: &[&str]) -> Result<String, Error> {
        kubeconfig::inline(
            &self.api_url,
            &self.ca_pem(),
            &self.pki.client(user, groups)?,
        )
    }

    /// A client certificate for `user` in `groups` from this control plane's CA, for calling
    /// servers that trust [`Self::ca_pem`] directly (a node's kubelet API, for example).
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<CertPair, Error> {
        self.pki.client(user, groups)
    }

    /// A client authenticated by certificate as `user` in `groups`.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Result<kube::Client, Error> {
        kubeconfig::client(&self.kubeconfig_as(user, groups)?).await
    }

    /// The last `lines` lines of every component's log, each under a header with its path.
    pub fn logs(&self, lines: usize) -> String {
        let components = self.components.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for c in components.iter() {
            out.push_str(&format!(
                "----- {} (last {lines} lines of {}) -----\n{}\n",
                c.name(),
                c.log_path().display(),
                c.log_tail(lines)
            ));
        }
        out
    }

    /// Stops every component, newest first.
    pub fn stop(&self) {
        let mut components = self.components.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut c) = components.pop() {
            c.stop();
        }
    }

    pub(crate) fn spec_for(
        &self,
        server: &str,
        client: Option<(PathBuf, PathBuf)>,
    ) -> KubeconfigSpec {
        KubeconfigSpec {
            server: server.to_owned(),
            ca_file: self.ca_file(),
            client,
        }
    }

    pub(crate) fn pki(&self) -> &Pki {
        &self.pki
    }

    pub(crate) fn keep_dir(&self) -> bool {
        self.keep_dir
    }

    /// Takes ownership of a started component, so that it is stopped with the control plane.
    pub(crate) fn adopt(&self, component: Supervised) {
        self.components
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(component);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
