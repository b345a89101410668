//! The `kube` provider: remote clusters behind the same
//! [`Provider`](neocloud_providers::Provider) trait as the clouds. Offers come from each
//! cluster's free GPUs, kept current by watches of its Nodes and live Pods; a rental is one Pod
//! (and the Secret its environment travels in) in the cluster's namespace, named by the external
//! name, so creating twice finds the first.
//!
//! The caller passes a client per cluster; [`secret_text`] and [`client_from_kubeconfig`] build
//! one from a kubeconfig in a Secret of the node's own cluster.
//!
//! Here: [`KubeTarget`], the list of clusters, and how a Kubernetes API error is classified.
//! The rest, by concern: `watch` (each cluster's caches, kept by watches, and what keeps it
//! from answering), `provider` (the `Provider` impl), `scheduling` (a create's wait for the
//! remote scheduler).

mod provider;
mod scheduling;
mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{reflector, watcher};
use kube::{Api, Client};
use neocloud_core::{FailureClass, ProviderId};
use neocloud_providers::{Operation, ProviderError};
use parking_lot::{Mutex, RwLock};
use tokio::task::JoinHandle;

use crate::config::RemoteCluster;
use crate::pod::parse_instance_id;
use watch::{Cluster, Trouble, watch};

/// A kube-rs client for a kubeconfig's current context. `origin` names where the kubeconfig was
/// read (`Secret burst/west key "kubeconfig"`) in every error. A kubeconfig that would run a
/// command, read a file of the node or (unless `allow_insecure`) skip TLS verification is
/// refused before anything is built from it ([`crate::kubeconfig::vet`]). A bad kubeconfig is an
/// error naming what is wrong, never a panic.
pub async fn client_from_kubeconfig(
    yaml: &str,
    origin: &str,
    allow_insecure: bool,
) -> Result<Client, String> {
    let kubeconfig =
        Kubeconfig::from_yaml(yaml).map_err(|e| format!("{origin}: invalid kubeconfig: {e}"))?;
    crate::kubeconfig::vet(&kubeconfig, allow_insecure).map_err(|e| format!("{origin}: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("{origin}: unusable kubeconfig: {e}"))?;
    Client::try_from(config)
        .map_err(|e| format!("{origin}: cannot build a client from the kubeconfig: {e}"))
}

/// The value at `key` of Secret `namespace/name` as text.
pub async fn secret_text(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<String, String> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("cannot read Secret {namespace}/{name}: {e}"))?;
    let value = secret
        .data
        .and_then(|mut d| d.remove(key))
        .ok_or_else(|| format!("Secret {namespace}/{name} has no key {key:?}"))?;
    String::from_utf8(value.0)
        .map_err(|_| format!("key {key:?} of Secret {namespace}/{name} is not text"))
}

/// Remote Kubernetes clusters as one provider, `kube`. Each cluster's name is the region of its
/// offers. Cheap to share; every method is safe to call concurrently.
pub struct KubeTarget {
    clusters: RwLock<Vec<Arc<Cluster>>>,
    /// Why cluster discovery last failed, `None` when it answered (or is not configured).
    pub(crate) discovery: Mutex<Option<ProviderError>>,
    /// Background tasks (discovery), stopped with the provider.
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for KubeTarget {
    fn drop(&mut self) {
        for t in self.tasks.lock().iter() {
            t.abort();
        }
    }
}

impl std::fmt::Debug for KubeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTarget")
            .field("clusters", &self.cluster_names())
            .finish()
    }
}

impl KubeTarget {
    /// Starts watching each cluster's Nodes and live Pods. Must be called inside a Tokio
    /// runtime; the watches stop when the provider is dropped. `clusters` should have passed
    /// [`crate::config::validate`].
    pub fn start(clusters: Vec<(RemoteCluster, Client)>) -> KubeTarget {
        let target = KubeTarget {
            clusters: RwLock::new(Vec::new()),
            discovery: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
        };
        for (config, client) in clusters {
            target.add_cluster(config, client);
        }
        target
    }

    /// Adds a cluster and starts watching it; a cluster of that name already there is offered
    /// again instead (its client and configuration are kept). Must be called inside a Tokio
    /// runtime.
    pub fn add_cluster(&self, config: RemoteCluster, client: Client) {
        let mut clusters = self.clusters.write();
        if let Some(known) = clusters.iter().find(|c| c.config.name == config.name) {
            known.offering.store(true, Ordering::Relaxed);
            return;
        }
        let trouble = Arc::new(Trouble::default());
        let (nodes, node_writer) = reflector::store();
        let (pods, pod_writer) = reflector::store();
        let live =
            watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let watches = vec![
            watch(
                watcher::watcher(Api::<Node>::all(client.clone()), Default::default()),
                node_writer,
                trouble.clone(),
                "nodes",
                config.name.clone(),
            ),
            watch(
                watcher::watcher(Api::<Pod>::all(client.clone()), live),
                pod_writer,
                trouble.clone(),
                "pods",
                config.name.clone(),
            ),
        ];
        tracing::info!(cluster = %config.name, namespace = %config.namespace, "renting on remote cluster");
        clusters.push(Arc::new(Cluster {
            config,
            offering: AtomicBool::new(true),
            client,
            nodes,
            pods,
            trouble,
            watches,
        }));
    }

    /// Stops (or resumes) new rentals on a cluster; its Pods are still read and deleted.
    pub fn set_offering(&self, name: &str, offering: bool) {
        if let Some(c) = self.clusters.read().iter().find(|c| c.config.name == name)
            && c.offering.swap(offering, Ordering::Relaxed) != offering
        {
            tracing::info!(cluster = %name, offering, "remote cluster offering changed");
        }
    }

    /// The clusters' names, and whether each takes new rentals.
    pub fn clusters_offering(&self) -> Vec<(String, bool)> {
        self.clusters
            .read()
            .iter()
            .map(|c| (c.config.name.clone(), c.offering.load(Ordering::Relaxed)))
            .collect()
    }

    /// The clusters' names.
    pub fn cluster_names(&self) -> Vec<String> {
        self.clusters
            .read()
            .iter()
            .map(|c| c.config.name.clone())
            .collect()
    }

    fn snapshot(&self) -> Vec<Arc<Cluster>> {
        self.clusters.read().clone()
    }

    /// The cluster and Pod name an instance id names.
    fn instance<'a>(
        &self,
        id: &'a str,
        op: Operation,
    ) -> Result<(Arc<Cluster>, &'a str), ProviderError> {
        let (cluster, pod) = parse_instance_id(id).ok_or_else(|| {
            error(
                op,
                FailureClass::InvalidRequest,
                format!("instance id {id:?} is not <cluster>/<pod>"),
            )
        })?;
        Ok((self.cluster(cluster, op)?, pod))
    }

    fn cluster(&self, name: &str, op: Operation) -> Result<Arc<Cluster>, ProviderError> {
        self.clusters
            .read()
            .iter()
            .find(|c| c.config.name == name)
            .cloned()
            .ok_or_else(|| {
                error(
                    op,
                    FailureClass::InvalidRequest,
                    format!("no remote cluster is named {name:?}"),
                )
            })
    }
}

fn error(op: Operation, class: FailureClass, message: impl Into<String>) -> ProviderError {
    ProviderError::new(ProviderId::Kube, op, class, message)
}

/// A Kubernetes API error as a provider failure: refused credentials are `auth`, an exceeded
/// ResourceQuota `quota`, an invalid object `invalid-request`, 429 `rate-limited`, the rest (5xx,
/// connection errors) `transient`.
fn classify(cluster: &str, op: Operation, e: &kube::Error) -> ProviderError {
    let (class, code) = match e {
        kube::Error::Api(s) => {
            let class = match s.code {
                401 => FailureClass::Auth,
                403 if s.message.contains("exceeded quota") => FailureClass::Quota,
                403 => FailureClass::Auth,
                400 | 404 | 422 => FailureClass::InvalidRequest,
                429 => FailureClass::RateLimited,
                _ => FailureClass::Transient,
            };
            (class, Some(s.reason.clone()).filter(|r| !r.is_empty()))
        }
        _ => (FailureClass::Transient, None),
    };
    let err = error(op, class, format!("remote cluster {cluster}: {e}"));
    match code {
        Some(code) => err.with_code(code),
        None => err,
    }
}
