//! The watch plumbing of one remote cluster: its [`Cluster`] (configuration, client, and the
//! caches of its Nodes and live Pods that [`watch`]es keep current), what keeps it from
//! answering ([`Trouble`], by source), and its free GPUs once both caches have listed.
//!
//! Not what is offered or rented from those GPUs (the `Provider` impl next door, `offers`,
//! `pod`), and not the list of clusters (the parent, `KubeTarget`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client};
use neocloud_core::FailureClass;
use neocloud_providers::{Operation, ProviderError};
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use super::error;
use crate::capacity::{NodeGpus, free_gpus};
use crate::config::RemoteCluster;

/// How long a call waits for a cluster's first listing of Nodes and Pods before it treats the
/// cluster as not answering.
const FIRST_LIST: Duration = Duration::from_secs(10);

/// One remote cluster: its configuration, client, caches and whether its API answers.
pub(super) struct Cluster {
    pub(super) config: RemoteCluster,
    /// Whether new rentals may go there (discovery stops it for a cluster no longer
    /// provisioned; its Pods are still read and deleted).
    pub(super) offering: AtomicBool,
    pub(super) client: Client,
    pub(super) nodes: reflector::Store<Node>,
    pub(super) pods: reflector::Store<Pod>,
    /// The last error of each watch and of the health probe, none while the cluster answers.
    pub(super) trouble: Arc<Trouble>,
    pub(super) watches: Vec<JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

/// What keeps a cluster from answering, by source (`nodes`, `pods`, `health`): each source
/// clears only its own, so a Pod watch that recovers does not hide a Node watch still failing.
#[derive(Debug, Default)]
pub(super) struct Trouble(Mutex<std::collections::BTreeMap<&'static str, String>>);

impl Trouble {
    pub(super) fn set(&self, source: &'static str, why: String) {
        self.0.lock().insert(source, why);
    }

    pub(super) fn clear(&self, source: &'static str) {
        self.0.lock().remove(source);
    }

    /// Every current reason, `None` when there is none.
    pub(super) fn current(&self) -> Option<String> {
        let all = self.0.lock();
        (!all.is_empty()).then(|| all.values().cloned().collect::<Vec<_>>().join("; "))
    }
}

/// Keeps `store` current from `stream`, recording the latest error in `trouble` under `what`
/// and clearing it when events flow again.
pub(super) fn watch<K>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    writer: reflector::store::Writer<K>,
    trouble: Arc<Trouble>,
    what: &'static str,
    cluster: String,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + Send + Sync + std::fmt::Debug + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        let mut events = std::pin::pin!(stream.default_backoff().reflect(writer));
        while let Some(event) = events.next().await {
            match event {
                Ok(_) => trouble.clear(what),
                Err(e) => {
                    tracing::warn!(cluster = %cluster, error = %e, "watching the remote cluster's {what} failed");
                    trouble.set(what, format!("watching {what}: {e}"));
                }
            }
        }
    })
}

impl Cluster {
    pub(super) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    pub(super) fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    /// Free GPUs per node once both caches have listed, or why they cannot be read: the
    /// cluster's last watch error, or no first listing within [`FIRST_LIST`].
    pub(super) async fn free(&self, op: Operation) -> Result<Vec<NodeGpus>, ProviderError> {
        let started = tokio::time::Instant::now();
        loop {
            if let Some(trouble) = self.trouble.current() {
                return Err(error(
                    op,
                    FailureClass::Transient,
                    format!(
                        "remote cluster {} does not answer: {trouble}",
                        self.config.name
                    ),
                ));
            }
            let listed = async {
                self.nodes.wait_until_ready().await.is_ok()
                    && self.pods.wait_until_ready().await.is_ok()
            };
            if tokio::time::timeout(Duration::from_millis(50), listed)
                .await
                .unwrap_or(false)
            {
                break;
            }
            if started.elapsed() >= FIRST_LIST {
                return Err(error(
                    op,
                    FailureClass::Transient,
                    format!(
                        "remote cluster {} has not listed its nodes and pods within {} s",
                        self.config.name,
                        FIRST_LIST.as_secs()
                    ),
                ));
            }
        }
        let nodes = self.nodes.state();
        let pods = self.pods.state();
        Ok(free_gpus(
            nodes.iter().map(|n| n.as_ref()),
            pods.iter().map(|p| p.as_ref()),
        ))
    }
}

#[cfg(test)]
mod trouble_tests {
    use super::Trouble;

    #[test]
    fn each_source_clears_only_its_own_trouble() {
        let t = Trouble::default();
        assert_eq!(t.current(), None);
        t.set("nodes", "watching nodes: 403".into());
        t.set("pods", "watching pods: connection refused".into());
        t.clear("pods");
        assert_eq!(t.current().as_deref(), Some("watching nodes: 403"));
        t.set("health", "401 Unauthorized".into());
        assert_eq!(
            t.current().as_deref(),
            Some("401 Unauthorized; watching nodes: 403")
        );
        t.clear("nodes");
        t.clear("health");
        assert_eq!(t.current(), None);
    }
}
