//! The `runner:` section of the node's configuration and the callback server it starts: how
//! VMs rented from Lambda Cloud boot `neocloud-runner` and reach the node. The keys and the
//! self-signed certificate runners rely on come from the node's runner identity Secret, so every
//! replica that leads presents and accepts the same ones.

mod secret;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use neocloud_core::ProviderId;
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::callback::{
    CallbackConfig, CallbackServer, DEFAULT_TRUST_DOMAIN, EgressConfig, RunnerEvent,
    RunnerIdentity, TlsMaterial,
};
use crate::callback::{ExecutorKind, RunnerDownload, UserDataOptions};
use crate::reconcile::Runners;

/// The VM runner: where its callback listens, the URL runners use, and how they start.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunnerSettings {
    /// The callback server's listen address.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The `https://` URL runners on the VMs reach the callback server at.
    pub callback_url: String,
    /// The server certificate (PEM); without it a self-signed one for the URL's host is made
    /// at start and pinned in each VM's `user_data`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The certificate's key (PEM), with `certFile`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The Secret that keeps the runners' signing key (and the self-signed certificate) for every
    /// replica; made on first start. Default `neocloud-node-<node name>-runner-identity`.
    #[serde(default)]
    pub identity_secret_name: Option<String>,
    /// Its namespace. Default: `POD_NAMESPACE`, else `default`.
    #[serde(default)]
    pub identity_secret_namespace: Option<String>,
    /// Trust domain of the runners' SPIFFE IDs.
    #[serde(default = "default_trust_domain")]
    pub trust_domain: String,
    /// A runner silent this long after it authenticated is lost: its instance is terminated
    /// and the Pod placed again. Seconds.
    #[serde(default = "default_heartbeat_timeout")]
    pub heartbeat_timeout_seconds: u64,
    /// A runner that has not called back this long after its VM appeared is given up: the
    /// instance is terminated and the Pod placed again. Seconds; VMs take minutes to boot.
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_seconds: u64,
    /// How often runners send heartbeats, seconds.
    #[serde(default = "default_heartbeat_interval")]
    pub heartbeat_interval_seconds: u64,
    /// The runner binary's path on the VM image.
    #[serde(default = "default_runner_path")]
    pub runner_path: String,
    /// Download the runner from this HTTPS URL first (with `downloadSha256`).
    #[serde(default)]
    pub download_url: Option<String>,
    /// The downloaded runner's SHA-256, lowercase hex.
    #[serde(default)]
    pub download_sha256: Option<String>,
    /// `docker` (the image runs with `docker run --gpus all`) or `process` (the command runs
    /// directly on the VM; for images without Docker, and for the simulator).
    #[serde(default = "default_executor")]
    pub executor: String,
    /// The container's network mode with the docker executor (`docker run --network`): `host`
    /// (the default: the Pod's container ports are the VM's, which is how its endpoints are
    /// reached), `bridge`, `none`, a network's name or `container:<name>`.
    #[serde(default = "default_container_network")]
    pub container_network: String,
    /// The container providers whose Pods the runner runs, inside the container (for Pods with
    /// an explicit command, unless `cloud.aibrix.ai/runner: "false"`): `runpod`, `vast`. Both by
    /// default; `[]` runs every container Pod's command directly, as before the runner.
    #[serde(default = "default_container_providers")]
    pub container_providers: Vec<ProviderId>,
    /// The callback listener's bounds: open connections, header and body timeouts.
    #[serde(default)]
    pub connections: super::listener::ConnectionSettings,
    /// Bounds of the connections workloads open to the in-cluster destinations their Pods name
    /// (`cloud.aibrix.ai/egress`).
    #[serde(default)]
    pub egress: EgressSettings,
}

/// Bounds of egress connections (see `cloud.aibrix.ai/egress`).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EgressSettings {
    /// Egress connections one Pod may have open at once; more are refused (429).
    #[serde(default = "default_egress_connections")]
    pub max_connections_per_binding: usize,
    /// How long dialling a destination may take, seconds.
    #[serde(default = "default_egress_connect_timeout")]
    pub connect_timeout_seconds: u64,
    /// A connection on which nothing moved either way this long is closed, seconds.
    #[serde(default = "default_egress_idle_timeout")]
    pub idle_timeout_seconds: u64,
}

impl Default for EgressSettings {
    fn default() -> Self {
        Self {
            max_connections_per_binding: default_egress_connections(),
            connect_timeout_seconds: default_egress_connect_timeout(),
            idle_timeout_seconds: default_egress_idle_timeout(),
        }
    }
}

fn default_egress_connections() -> usize {
    64
}
fn default_egress_connect_timeout() -> u64 {
    10
}
fn default_egress_idle_timeout() -> u64 {
    600
}

impl EgressSettings {
    /// The callback's egress configuration, dialling through the API server with `client`.
    fn config(&self, client: Client) -> EgressConfig {
        EgressConfig {
            dialer: Some(Arc::new(crate::egress::KubeDialer::new(client))),
            max_connections_per_binding: self.max_connections_per_binding,
            connect_timeout: Duration::from_secs(self.connect_timeout_seconds),
            idle_timeout: Duration::from_secs(self.idle_timeout_seconds),
        }
    }
}

fn default_container_providers() -> Vec<ProviderId> {
    vec![ProviderId::Runpod, ProviderId::Vast]
}

/// How long a rental may take on top of the boot timeout before a bootstrap token expires.
const RENTAL_SLACK_SECONDS: u64 = 600;

fn default_listen() -> String {
    "0.0.0.0:8443".to_owned()
}
fn default_trust_domain() -> String {
    DEFAULT_TRUST_DOMAIN.to_owned()
}
fn default_heartbeat_timeout() -> u64 {
    60
}
fn default_boot_timeout() -> u64 {
    900
}
fn default_heartbeat_interval() -> u64 {
    15
}
fn default_runner_path() -> String {
    crate::callback::DEFAULT_RUNNER_PATH.to_owned()
}
fn default_executor() -> String {
    "docker".to_owned()
}
fn default_container_network() -> String {
    neocloud_protocol::DEFAULT_CONTAINER_NETWORK.to_owned()
}

impl RunnerSettings {
    /// Checks every field; errors name the field and the value.
    pub fn check(&self) -> anyhow::Result<()> {
        self.listen_addr()?;
        self.executor_kind()?;
        self.connections.check("runner.connections")?;
        let e = &self.egress;
        if e.max_connections_per_binding == 0
            || e.connect_timeout_seconds == 0
            || e.idle_timeout_seconds == 0
        {
            bail!(
                "runner.egress: maxConnectionsPerBinding, connectTimeoutSeconds and \
                 idleTimeoutSeconds must each be at least 1"
            );
        }
        if let Some(p) = self
            .container_providers
            .iter()
            .find(|p| !matches!(p, ProviderId::Runpod | ProviderId::Vast))
        {
            bail!(
                "runner.containerProviders: {p} is not a container provider (runpod or vast); \
                 the runner boots lambda VMs from user_data"
            );
        }
        neocloud_protocol::check_network_mode(&self.container_network)
            .map_err(|e| anyhow::anyhow!("runner.containerNetwork: {e}"))?;
        // The path goes into cloud-init's command lines: an absolute path of plain characters.
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-');
        if !self.runner_path.starts_with('/')
            || !self.runner_path.chars().all(plain)
            || self.runner_path.split('/').any(|part| part == "..")
        {
            bail!(
                "runner.runnerPath: {:?} must be an absolute path of letters, digits and / . _ - \
                 (no ..)",
                self.runner_path
            );
        }
        let url = reqwest::Url::parse(&self.callback_url)
            .with_context(|| format!("runner.callbackUrl: {:?} is not a URL", self.callback_url))?;
        if url.scheme() != "https" || url.host_str().is_none() {
            bail!(
                "runner.callbackUrl: {:?} must be an https:// URL with a host (runners fetch secrets from it)",
                self.callback_url
            );
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            bail!("runner.certFile and runner.keyFile: set both or neither");
        }
        if self.boot_timeout_seconds == 0 {
            bail!("runner.bootTimeoutSeconds: 0 must be at least 1");
        }
        if self.heartbeat_interval_seconds == 0 {
            bail!("runner.heartbeatIntervalSeconds: 0 must be at least 1");
        }
        if self.heartbeat_timeout_seconds < 2 * self.heartbeat_interval_seconds {
            bail!(
                "runner.heartbeatTimeoutSeconds: {} must be at least twice heartbeatIntervalSeconds ({})",
                self.heartbeat_timeout_seconds,
                self.heartbeat_interval_seconds
            );
        }
        match (&self.download_url, &self.download_sha256) {
            (None, None) => {}
            (Some(u), Some(sha)) => {
                if !u.starts_with("https://") {
                    bail!("runner.downloadUrl: {u:?} must be an https:// URL");
                }
                if sha.len() != 64 || !sha.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
                    bail!("runner.downloadSha256: {sha:?} is not 64 lowercase hex digits");
                }
            }
            _ => bail!("runner.downloadUrl and runner.downloadSha256: set both or neither"),
        }
        Ok(())
    }

    fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listen
            .parse()
            .with_context(|| format!("runner.listen: {:?} is not an address:port", self.listen))
    }

    fn executor_kind(&self) -> anyhow::Result<ExecutorKind> {
        match self.executor.as_str() {
            "docker" => Ok(ExecutorKind::Docker),
            "process" => Ok(ExecutorKind::Process),
            other => bail!("runner.executor: {other:?} is not one of docker, process"),
        }
    }

    /// The identity Secret's namespace and name for node `node`.
    fn identity_secret(&self, node: &str) -> (String, String) {
        let namespace = self
            .identity_secret_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".to_owned());
        let name = self
            .identity_secret_name
            .clone()
            .unwrap_or_else(|| format!("neocloud-node-{node}-runner-identity"));
        (namespace, name)
    }

    /// The host of the callback URL, for a self-signed certificate.
    fn callback_host(&self) -> anyhow::Result<String> {
        Ok(reqwest::Url::parse(&self.callback_url)?
            .host_str()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_owned())
    }

    /// The runner identity of node `node` from its Secret, which is created if missing and
    /// replaced if rotation was asked or its certificate is for another host. Safe to call from
    /// several replicas at once: they all get the identity the Secret ends up holding.
    pub async fn load_identity(
        &self,
        client: Client,
        node: &str,
    ) -> anyhow::Result<RunnerIdentity> {
        let host = match (&self.cert_file, &self.key_file) {
            (Some(_), Some(_)) => None,
            _ => Some(self.callback_host()?),
        };
        let (namespace, name) = self.identity_secret(node);
        let api: Api<Secret> = Api::namespaced(client, &namespace);
        secret::load_or_create(&api, &name, host.as_deref())
            .await
            .with_context(|| format!("runner.identitySecretName: {namespace}/{name}"))
    }

    /// Starts the callback server of node `node` and returns it with the reconciler's view of
    /// the runners (on Lambda Cloud, the one provider that rents VMs) and the server's events,
    /// which [`Runners::follow`] must apply. The server stops when dropped.
    pub async fn start(
        &self,
        client: Client,
        node: &str,
    ) -> anyhow::Result<(CallbackServer, Arc<Runners>, mpsc::Receiver<RunnerEvent>)> {
        let files = self.cert_file.as_ref().zip(self.key_file.as_ref());
        let egress = self.egress.config(client.clone());
        let identity = self.load_identity(client, node).await?;
        let tls = match (files, identity.tls()) {
            (Some((cert, key)), _) => TlsMaterial::from_files(cert, key)?,
            (None, Some(tls)) => tls.clone(),
            (None, None) => bail!("the runner identity has no certificate"),
        };
        let config = CallbackConfig {
            keys: identity.keys(),
            // A restarted node finds its bindings again as it reconciles them; until then their
            // runners are told to try again. Booting VMs may call in late.
            adoption_window: Duration::from_secs(
                self.heartbeat_timeout_seconds
                    .max(self.boot_timeout_seconds),
            ),
            listen: self.listen_addr()?,
            trust_domain: self.trust_domain.clone(),
            heartbeat_timeout: Duration::from_secs(self.heartbeat_timeout_seconds),
            // Valid from registration, before the rental, for the boot timeout and the time
            // renting may take (a fallback ladder with provider retries).
            bootstrap_ttl: Duration::from_secs(self.boot_timeout_seconds + RENTAL_SLACK_SECONDS),
            serve: self.connections.limits(),
            egress,
            ..CallbackConfig::default()
        };
        let (server, events) = CallbackServer::start(config, &tls).await?;
        let options = UserDataOptions {
            runner_path: self.runner_path.clone(),
            download: self
                .download_url
                .clone()
                .zip(self.download_sha256.clone())
                .map(|(url, sha256)| RunnerDownload { url, sha256 }),
            executor: self.executor_kind()?,
            network: self.container_network.clone(),
            heartbeat_interval: Duration::from_secs(self.heartbeat_interval_seconds),
        };
        let runners = Runners::new(
            server.handle(),
            self.callback_url.clone(),
            server.cert_pem(),
            options,
            vec![ProviderId::Lambda],
            self.container_providers.clone(),
            Duration::from_secs(self.boot_timeout_seconds),
        );
        Ok((server, runners, events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(extra: &str) -> anyhow::Result<RunnerSettings> {
        let s: RunnerSettings =
            serde_yaml::from_str(&format!("callbackUrl: https://node.example:8443\n{extra}"))?;
        s.check()?;
        Ok(s)
    }

    #[test]
    fn defaults_are_docker_with_a_minute_of_heartbeats() {
        let s = settings("").unwrap();
        assert_eq!(s.listen, "0.0.0.0:8443");
        assert_eq!(s.executor, "docker");
        assert_eq!(s.container_network, "host");
        assert_eq!(s.heartbeat_timeout_seconds, 60);
        assert_eq!(s.heartbeat_interval_seconds, 15);
        assert_eq!(s.boot_timeout_seconds, 900);
        assert_eq!(
            s.container_providers,
            [ProviderId::Runpod, ProviderId::Vast]
        );
        assert!(
            settings("containerProviders: []")
                .unwrap()
                .container_providers
                .is_empty()
        );
    }

    #[test]
    fn bad_fields_are_named_with_their_value() {
        for (extra, field, value) in [
            ("listen: nowhere", "runner.listen", "nowhere"),
            (
                "containerProviders: [lambda]",
                "runner.containerProviders",
                "lambda",
            ),
            ("executor: podman", "runner.executor", "podman"),
            (
                "containerNetwork: host --privileged",
                "runner.containerNetwork",
                "host --privileged",
            ),
            (
                "runnerPath: /opt/r;reboot",
                "runner.runnerPath",
                "/opt/r;reboot",
            ),
            ("runnerPath: bin/runner", "runner.runnerPath", "bin/runner"),
            (
                "runnerPath: /opt/../etc/r",
                "runner.runnerPath",
                "/opt/../etc/r",
            ),
            (
                "heartbeatTimeoutSeconds: 20",
                "runner.heartbeatTimeoutSeconds",
                "20",
            ),
            (
                "heartbeatIntervalSeconds: 0",
                "runner.heartbeatIntervalSeconds",
                "0",
            ),
            ("certFile: /tmp/c.pem", "runner.certFile", "keyFile"),
            ("downloadUrl: http://x/r", "runner.downloadUrl", ""),
            (
                "downloadUrl: http://x/r\ndownloadSha256: 00",
                "runner.downloadUrl",
                "http://x/r",
            ),
            (
                "downloadUrl: https://x/r\ndownloadSha256: 00",
                "runner.downloadSha256",
                "00",
            ),
        ] {
            let e = format!("{:#}", settings(extra).unwrap_err());
            assert!(e.contains(field) && e.contains(value), "{extra}: {e}");
        }
        let plain: RunnerSettings = serde_yaml::from_str("callbackUrl: http://node:8443").unwrap();
        let e = format!("{:#}", plain.check().unwrap_err());
        assert!(
            e.contains("runner.callbackUrl") && e.contains("http://node:8443"),
            "{e}"
        );
    }
}
