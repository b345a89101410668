//! The `kubeletApi:` section of the node's configuration and starting the kubelet API
//! (`kubectl logs`) over the reconciler's caches.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use futures::stream::BoxStream;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use serde::Deserialize;

use crate::callback::TlsMaterial;
use futures::StreamExt as _;
use neocloud_core::ProviderId;
use neocloud_protocol::session::SessionRequest;
use neocloud_providers::LogRequest;

use crate::callback::{LogOptions, SessionIo};
use crate::kubelet::{
    KubeAccessReview, KubeletConfig, KubeletServer, NodePods, NodeWorkloads, PodPlacement,
};
use crate::reconcile::{Reconciler, Runners};
use crate::vnode::NodeConfig;

/// Where the cluster CA is inside a Pod.
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// The kubelet API on `node.kubeletPort`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeletApiSettings {
    /// Serve it (the API server calls it for `kubectl logs`).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The address to listen on; the port is `node.kubeletPort`.
    #[serde(default = "default_host")]
    pub listen_host: String,
    /// The serving certificate (PEM); without it a self-signed one for the node's name and
    /// address is made at start (the API server does not verify kubelet certificates unless
    /// given `--kubelet-certificate-authority`).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The certificate's key, with `certFile`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The CA whose client certificates are accepted (the one that signed the API server's
    /// `--kubelet-client-certificate`). Default: the in-cluster CA, else the kubeconfig's.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// The listener's bounds: open connections, header and body timeouts.
    #[serde(default)]
    pub connections: super::listener::ConnectionSettings,
    /// Each `kubectl exec`, `attach` or `port-forward` connection's bounds.
    #[serde(default)]
    pub streams: StreamSettings,
    /// Sessions (an exec, a forwarded connection) open at once with one Pod a remote cluster
    /// runs; the runner's Pods have the runner callback's limit per binding.
    #[serde(default = "default_max_sessions_per_pod")]
    pub max_sessions_per_pod: usize,
    /// A cluster address for burst Pods: relay Pods that carry their TCP ports from the cluster
    /// network to the workload, through this API.
    #[serde(default)]
    pub relays: RelaySettings,
}

/// `kubeletApi.relays`: each burst Pod that declares TCP `containerPort`s and runs through the
/// runner (or on a remote cluster) gets a relay Pod on a real node, whose IP becomes its
/// `podIP`; it is Ready only while its relay is.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelaySettings {
    /// Make relays.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The relay Pods' image. Unset: the image of the node's own container when it runs in a
    /// Pod; outside a Pod relays are then off (said at start), and Pods report their instance's
    /// public IP.
    #[serde(default)]
    pub image: Option<String>,
    /// The `host:port` relay Pods dial to reach this API. Unset: `node.address` and
    /// `node.kubeletPort`.
    #[serde(default)]
    pub address: Option<String>,
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            enabled: true,
            image: None,
            address: None,
        }
    }
}

/// `kubeletApi.streams`: the bounds of one SPDY connection.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StreamSettings {
    /// Streams open at once on one connection (an exec opens up to 5, a forwarded connection
    /// 2); more are refused.
    #[serde(default = "default_max_streams")]
    pub max_per_connection: usize,
    /// Seconds without a frame either way after which a connection is closed (the kubelet's
    /// `streamingConnectionIdleTimeout`, 4 h).
    #[serde(default = "default_stream_idle_timeout")]
    pub idle_timeout_seconds: u64,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            max_per_connection: default_max_streams(),
            idle_timeout_seconds: default_stream_idle_timeout(),
        }
    }
}

fn default_max_streams() -> usize {
    crate::kubelet::spdy::Limits::default().max_streams
}
fn default_stream_idle_timeout() -> u64 {
    crate::kubelet::spdy::Limits::default()
        .idle_timeout
        .as_secs()
}
fn default_max_sessions_per_pod() -> usize {
    crate::kubelet::DEFAULT_MAX_SESSIONS_PER_POD
}

impl Default for KubeletApiSettings {
    fn default() -> Self {
        KubeletApiSettings {
            enabled: true,
            listen_host: default_host(),
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            connections: Default::default(),
            streams: StreamSettings::default(),
            max_sessions_per_pod: default_max_sessions_per_pod(),
            relays: RelaySettings::default(),
        }
    }
}

fn yes() -> bool {
    true
}
fn default_host() -> String {
    "0.0.0.0".to_owned()
}

impl KubeletApiSettings {
    /// Checks the fields; errors name the field and the value.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.listen_host.parse::<std::net::IpAddr>().is_err() {
            bail!(
                "kubeletApi.listenHost: {:?} is not an IP address",
                self.listen_host
            );
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            bail!("kubeletApi.certFile and kubeletApi.keyFile: set both or neither");
        }
        self.connections.check("kubeletApi.connections")?;
        let streams = &self.streams;
        if streams.max_per_connection == 0 {
            bail!("kubeletApi.streams.maxPerConnection: 0 would refuse every stream");
        }
        if streams.idle_timeout_seconds == 0 {
            bail!("kubeletApi.streams.idleTimeoutSeconds: 0 would close every connection");
        }
        if self.max_sessions_per_pod == 0 {
            bail!("kubeletApi.maxSessionsPerPod: 0 would refuse every exec and port-forward");
        }
        if let Some(image) = &self.relays.image
            && image.trim().is_empty()
        {
            bail!("kubeletApi.relays.image: {image:?} is empty; unset it for the node's own image");
        }
        if let Some(address) = &self.relays.address {
            let port = address.rsplit_once(':').and_then(|(host, port)| {
                (!host.is_empty()).then_some(())?;
                port.parse::<u16>().ok().filter(|p| *p > 0)
            });
            if port.is_none() {
                bail!("kubeletApi.relays.address: {address:?} is not host:port");
            }
        }
        Ok(())
    }

    /// The server's certificate: the configured one, or a fresh self-signed one for the node's
    /// name and address.
    pub fn tls(&self, node: &NodeConfig) -> anyhow::Result<TlsMaterial> {
        Ok(match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => TlsMaterial::from_files(cert, key)?,
            _ => TlsMaterial::self_signed(&[node.name.clone(), node.address.clone()])?,
        })
    }

    /// How relays are made, when they are: the image (configured, else the node's own Pod's),
    /// the address relays dial, and `tls`'s certificate, which they pin.
    pub async fn relays(
        &self,
        node: &NodeConfig,
        client: &kube::Client,
        tls: &TlsMaterial,
    ) -> Option<Arc<crate::reconcile::Relays>> {
        if !self.enabled || !self.relays.enabled {
            return None;
        }
        let image = match &self.relays.image {
            Some(image) => image.clone(),
            None => match super::role::own_image(client).await {
                Some(image) => image,
                None => {
                    tracing::warn!(
                        "kubeletApi.relays: no image set and the node runs outside a Pod; burst Pods get no cluster address (their podIP is their instance's public IP)"
                    );
                    return None;
                }
            },
        };
        let node_address = self
            .relays
            .address
            .clone()
            .unwrap_or_else(|| format!("{}:{}", node.address, node.kubelet_port));
        tracing::info!(%image, address = %node_address, "relays give burst Pods a cluster address");
        Some(Arc::new(crate::reconcile::Relays {
            image,
            node_address,
            certificate_pem: tls.cert_pem().to_owned(),
            table: Arc::default(),
        }))
    }

    /// Starts the server for `node`, reading Pods and bindings from `reconciler`'s caches and
    /// logs from the runners (if any). `kube_ca_der` is the kubeconfig's CA, the fallback
    /// client CA.
    pub async fn start(
        &self,
        node: &NodeConfig,
        client: kube::Client,
        kube_ca_der: Option<&[Vec<u8>]>,
        reconciler: &Arc<Reconciler>,
        runners: Option<&Arc<Runners>>,
        tls: &TlsMaterial,
        relays: Option<Arc<neocloud_kubelet::relay::RelayTable>>,
    ) -> anyhow::Result<KubeletServer> {
        let mut config = KubeletConfig::for_node(&node.name, node.kubelet_port);
        let host: std::net::IpAddr = self.listen_host.parse()?;
        config.listen.set_ip(host);
        config.serve = self.connections.limits();
        config.streams.max_streams = self.streams.max_per_connection;
        config.streams.idle_timeout =
            std::time::Duration::from_secs(self.streams.idle_timeout_seconds);
        config = match &self.client_ca_file {
            Some(path) => config.with_client_ca_file(path)?,
            None if std::path::Path::new(IN_CLUSTER_CA).exists() => {
                config.with_client_ca_file(IN_CLUSTER_CA.as_ref())?
            }
            None => {
                config.client_ca_pem = kube_ca_der.map(pem_certificates);
                config
            }
        };
        if config.client_ca_pem.is_none() {
            tracing::warn!(
                "kubelet API: no client CA; only bearer tokens authenticate, so the API server's own calls (kubectl logs) are refused"
            );
        }
        config.relays = relays;
        let source = NodeWorkloads::new(
            Arc::new(ReconcilerPods(Arc::clone(reconciler))),
            runners.map(|r| r.handle().clone()),
            runners.map(|r| r.providers().to_vec()).unwrap_or_default(),
        )
        .with_runnerless_providers(runnerless(runners.is_some()))
        .with_session_providers([ProviderId::Kube])
        .with_max_provider_sessions(self.max_sessions_per_pod);
        let reviews = Arc::new(KubeAccessReview::new(client));
        KubeletServer::start(config, tls, reviews, Arc::new(source))
            .await
            .with_context(|| {
                format!(
                    "failed to serve the kubelet API on port {}",
                    node.kubelet_port
                )
            })
    }
}

/// The clouds whose Pods only the node's runner gives logs and sessions, named in their
/// refusals when the node has no `runner:` section (none when it has one).
fn runnerless(has_runner: bool) -> Vec<ProviderId> {
    if has_runner {
        return Vec::new();
    }
    vec![ProviderId::Lambda, ProviderId::Runpod, ProviderId::Vast]
}

/// The node's Pods as the kubelet API asks for them: from the reconciler's caches, and for the
/// Pods their provider runs itself (a remote cluster's), from that provider.
struct ReconcilerPods(Arc<Reconciler>);

#[async_trait]
impl NodePods for ReconcilerPods {
    fn find(&self, namespace: &str, name: &str) -> Option<PodPlacement> {
        let caches = self.0.caches()?;
        let pod = caches.pods.get(&ObjectRef::new(name).within(namespace))?;
        placement(&self.0, caches, &pod)
    }

    fn list(&self) -> Vec<(String, String, PodPlacement)> {
        let Some(caches) = self.0.caches() else {
            return Vec::new();
        };
        caches
            .pods
            .state()
            .iter()
            .filter_map(|pod| {
                let p = placement(&self.0, caches, pod)?;
                Some((pod.namespace()?, pod.name_any(), p))
            })
            .collect()
    }

    /// An error in the middle of the provider's stream ends it, logged.
    async fn provider_logs(
        &self,
        provider: ProviderId,
        instance: &str,
        opts: LogOptions,
    ) -> Result<Option<BoxStream<'static, Bytes>>, String> {
        let Some(provider) = self.0.provider(provider) else {
            return Ok(None);
        };
        let request = LogRequest {
            follow: opts.follow,
            tail_lines: opts.tail_lines.map(saturating_i64),
            limit_bytes: opts.limit_bytes.map(saturating_i64),
            since_seconds: opts.since_seconds.map(saturating_i64),
            timestamps: opts.timestamps,
        };
        let stream = provider
            .logs(instance, &request)
            .await
            .map_err(|e| e.to_string())?;
        Ok(stream.map(|s| {
            s.take_while(|chunk| {
                if let Err(e) = chunk {
                    tracing::warn!(error = %e, "the provider's log stream ended with an error");
                }
                std::future::ready(chunk.is_ok())
            })
            .filter_map(|chunk| std::future::ready(chunk.ok()))
            .boxed()
        }))
    }

    async fn provider_session(
        &self,
        provider: ProviderId,
        instance: &str,
        request: SessionRequest,
    ) -> Result<Option<SessionIo>, String> {
        let Some(provider) = self.0.provider(provider) else {
            return Ok(None);
        };
        let opened = provider
            .open_session(instance, &request)
            .await
            .map_err(|e| e.to_string())?;
        Ok(opened.map(|io| Box::new(io) as SessionIo))
    }
}

/// `n` as the API's `i64`, the largest one for anything larger.
fn saturating_i64(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Where `pod` runs, as the caches say.
fn placement(
    reconciler: &Reconciler,
    caches: &crate::reconcile::Caches,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> Option<PodPlacement> {
    let (namespace, name) = (pod.namespace()?, pod.name_any());
    let uid = pod.metadata.uid.clone();
    let status = caches
        .bindings
        .get(&ObjectRef::new(&name).within(&namespace))
        .filter(|b| Some(&b.spec.pod_uid) == uid.as_ref())
        .and_then(|b| b.status.clone());
    let provider = status
        .as_ref()
        .and_then(|s| s.provider.as_deref())
        .and_then(|p| p.parse::<ProviderId>().ok());
    let instance = status.and_then(|s| s.instance_id);
    let runner = provider
        .zip(reconciler.runners())
        .is_some_and(|(p, runners)| runners.runs(p, pod));
    Some(
        PodPlacement::of(pod, provider)
            .with_runner(runner)
            .with_instance(instance),
    )
}

/// DER certificates as PEM.
fn pem_certificates(ders: &[Vec<u8>]) -> String {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut pem = String::new();
    for der in ders {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let text = engine.encode(der);
        for chunk in text.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(chunk));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_fields_are_named() {
        let s: KubeletApiSettings = serde_yaml::from_str("listenHost: everywhere").unwrap();
        let e = s.check().unwrap_err().to_string();
        assert!(
            e.contains("kubeletApi.listenHost") && e.contains("everywhere"),
            "{e}"
        );
        let s: KubeletApiSettings = serde_yaml::from_str("certFile: /c.pem").unwrap();
        assert!(
            s.check()
                .unwrap_err()
                .to_string()
                .contains("kubeletApi.keyFile")
        );
        assert!(serde_yaml::from_str::<KubeletApiSettings>("port: 1").is_err());
    }

    #[test]
    fn der_becomes_pem_in_64_column_lines() {
        let pem = pem_certificates(&[vec![0u8; 100]]);
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines[0], "-----BEGIN CERTIFICATE-----");
        assert_eq!(lines[1].len(), 64);
        assert_eq!(lines.last(), Some(&"-----END CERTIFICATE-----"));
    }
}
