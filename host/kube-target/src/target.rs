//! The `kube` provider: remote clusters behind the same [`Provider`] trait as the clouds. Offers
//! come from each cluster's free GPUs, kept current by watches of its Nodes and live Pods; a
//! rental is one Pod (and the Secret its environment travels in) in the cluster's namespace,
//! named by the external name, so creating twice finds the first.
//!
//! The caller passes a client per cluster; [`secret_text`] and [`client_from_kubeconfig`] build
//! one from a kubeconfig in a Secret of the node's own cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::AsyncReadExt as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client};
use neocloud_core::{FailureClass, InstanceState, Offer, OfferQuery, ProviderId};
use neocloud_protocol::session::SessionRequest;
use neocloud_providers::{
    CreateRequest, FrameStream, LogRequest, LogStream, Operation, Provider, ProviderError,
};
use parking_lot::{Mutex, RwLock};
use tokio::task::JoinHandle;

use crate::capacity::{NodeGpus, free_gpus};
use crate::config::RemoteCluster;
use crate::offers::{largest_free_by_product, offers, parse_offer_id};
use crate::pod::{
    CONTAINER, MANAGED_BY, env_secret, instance_state, orphan_secret_state, owned_by,
    parse_instance_id, remote_pod, secret_name, secret_pod,
};

/// How long a call waits for a cluster's first listing of Nodes and Pods before it treats the
/// cluster as not answering.
const FIRST_LIST: Duration = Duration::from_secs(10);

/// How long a cluster's health probe waits for its API server.
const HEALTH_PROBE: Duration = Duration::from_secs(10);

/// How long a create waits for the remote scheduler to bind or refuse the new Pod.
const SCHEDULING_WAIT: Duration = Duration::from_secs(5);

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

/// One remote cluster: its configuration, client, caches and whether its API answers.
struct Cluster {
    config: RemoteCluster,
    /// Whether new rentals may go there (discovery stops it for a cluster no longer
    /// provisioned; its Pods are still read and deleted).
    offering: AtomicBool,
    client: Client,
    nodes: reflector::Store<Node>,
    pods: reflector::Store<Pod>,
    /// The last error of each watch and of the health probe, none while the cluster answers.
    trouble: Arc<Trouble>,
    watches: Vec<JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
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

/// What keeps a cluster from answering, by source (`nodes`, `pods`, `health`): each source
/// clears only its own, so a Pod watch that recovers does not hide a Node watch still failing.
#[derive(Debug, Default)]
struct Trouble(Mutex<std::collections::BTreeMap<&'static str, String>>);

impl Trouble {
    fn set(&self, source: &'static str, why: String) {
        self.0.lock().insert(source, why);
    }

    fn clear(&self, source: &'static str) {
        self.0.lock().remove(source);
    }

    /// Every current reason, `None` when there is none.
    fn current(&self) -> Option<String> {
        let all = self.0.lock();
        (!all.is_empty()).then(|| all.values().cloned().collect::<Vec<_>>().join("; "))
    }
}

/// Keeps `store` current from `stream`, recording the latest error in `trouble` under `what`
/// and clearing it when events flow again.
fn watch<K>(
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

impl KubeTarget {
    /// Waits up to [`SCHEDULING_WAIT`] for the remote scheduler's decision on a Pod just
    /// created. Bound, or no decision yet: the instance as it is. Unschedulable (the nodes the
    /// watches showed free were not, or refuse it for another reason): the Pod and its Secret
    /// are deleted and the rental fails for capacity, so the ladder moves on.
    async fn scheduled(
        &self,
        cluster: &Cluster,
        mut pod: Pod,
        subject: &str,
    ) -> Result<InstanceState, ProviderError> {
        let op = Operation::Create;
        let name = cluster.config.name.as_str();
        let started = tokio::time::Instant::now();
        loop {
            let state = instance_state(name, &pod);
            if state.refused_capacity() {
                let pods = cluster.pods();
                let _ = pods
                    .delete(subject, &DeleteParams::default().grace_period(0))
                    .await;
                let _ = cluster
                    .secrets()
                    .delete(&secret_name(subject), &DeleteParams::default())
                    .await;
                return Err(error(
                    op,
                    FailureClass::Capacity,
                    format!(
                        "remote cluster {name} cannot schedule the Pod: {}",
                        state.message.as_deref().unwrap_or("unschedulable")
                    ),
                )
                .with_subject(subject));
            }
            let bound = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some();
            if bound || started.elapsed() >= SCHEDULING_WAIT {
                return Ok(state);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            pod = match cluster.pods().get_opt(subject).await {
                Ok(Some(p)) => p,
                // Gone or unreadable: what was last seen is the answer; `get` tells the rest.
                Ok(None) | Err(_) => return Ok(state),
            };
        }
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

impl Cluster {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    /// Free GPUs per node once both caches have listed, or why they cannot be read: the
    /// cluster's last watch error, or no first listing within [`FIRST_LIST`].
    async fn free(&self, op: Operation) -> Result<Vec<NodeGpus>, ProviderError> {
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

#[async_trait]
impl Provider for KubeTarget {
    fn id(&self) -> ProviderId {
        ProviderId::Kube
    }

    /// Offers of every cluster that answers, looked up together. A cluster that does not answer
    /// (or refuses us) offers nothing rather than failing the call: a catalog keeps a failed
    /// provider's last offers, and a cluster known to be down must not be planned on from
    /// them. Why it offers nothing is what `health` reports.
    async fn list_offers(&self, query: &OfferQuery) -> Result<Vec<Offer>, ProviderError> {
        let clusters = self.snapshot();
        let answers = futures::future::join_all(
            clusters
                .iter()
                .filter(|c| c.offering.load(Ordering::Relaxed))
                .map(|c| async move { (c, c.free(Operation::ListOffers).await) }),
        )
        .await;
        let mut all = Vec::new();
        for (cluster, answer) in answers {
            match answer {
                Ok(free) => all.extend(offers(&cluster.config, &free, query)),
                Err(e) => {
                    tracing::debug!(cluster = %cluster.config.name, error = %e, "remote cluster left out of the offers");
                }
            }
        }
        Ok(all)
    }

    async fn create(&self, req: &CreateRequest) -> Result<InstanceState, ProviderError> {
        let op = Operation::Create;
        let subject = req.external_name.clone();
        let (cluster_name, product) = parse_offer_id(&req.offer.id).ok_or_else(|| {
            error(
                op,
                FailureClass::InvalidRequest,
                format!("offer id {:?} is not <cluster>/<gpu product>", req.offer.id),
            )
            .with_subject(subject.clone())
        })?;
        let cluster = self.cluster(cluster_name, op)?;
        let name = cluster.config.name.as_str();
        let pods = cluster.pods();
        if let Some(existing) = pods
            .get_opt(&req.external_name)
            .await
            .map_err(|e| classify(name, op, &e).with_subject(subject.clone()))?
        {
            return Ok(instance_state(name, &existing));
        }
        if !cluster.offering.load(Ordering::Relaxed) {
            return Err(error(
                op,
                FailureClass::Capacity,
                format!("remote cluster {name} takes no new rentals (no longer provisioned)"),
            )
            .with_subject(subject));
        }
        let free = cluster
            .free(op)
            .await
            .map_err(|e| e.with_subject(subject.clone()))?;
        let by_product = largest_free_by_product(&free);
        let wanted = req.offer.gpu_count.max(1);
        let (most, memory_gib) = by_product.get(product).copied().unwrap_or((0, None));
        if most < wanted {
            return Err(error(
                op,
                FailureClass::Capacity,
                format!("no node of remote cluster {name} has {wanted} free {product} GPUs (most: {most})"),
            )
            .with_subject(subject));
        }
        let secrets = cluster.secrets();
        match secrets
            .create(
                &PostParams::default(),
                &env_secret(req, &cluster.config.namespace),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(classify(name, op, &e).with_subject(subject)),
        }
        let pod = remote_pod(req, &cluster.config.namespace, product, memory_gib);
        let created = match pods.create(&PostParams::default(), &pod).await {
            Ok(created) => created,
            Err(kube::Error::Api(s)) if s.code == 409 => pods
                .get(&req.external_name)
                .await
                .map_err(|e| classify(name, op, &e).with_subject(subject.clone()))?,
            Err(e) => {
                let failure = classify(name, op, &e).with_subject(subject);
                if matches!(e, kube::Error::Api(_)) {
                    // Refused, so no Pod exists: its Secret would only be an orphan.
                    let _ = secrets
                        .delete(&secret_name(&req.external_name), &DeleteParams::default())
                        .await;
                }
                return Err(failure);
            }
        };
        if let Some(owner) = owned_by(&created) {
            let patch = serde_json::json!({"metadata": {"ownerReferences": [owner]}});
            if let Err(e) = secrets
                .patch(
                    &secret_name(&req.external_name),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                tracing::warn!(cluster = %name, pod = %req.external_name, error = %e,
                    "could not make the remote Pod own its Secret; deleting the Pod deletes it anyway");
            }
        }
        tracing::info!(cluster = %name, pod = %req.external_name, product, gpus = wanted, "created the remote Pod");
        self.scheduled(&cluster, created, &subject).await
    }

    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError> {
        let op = Operation::Get;
        let (cluster, pod) = self.instance(id, op)?;
        let cluster_name = cluster.config.name.as_str();
        let found = cluster
            .pods()
            .get_opt(pod)
            .await
            .map_err(|e| classify(cluster_name, op, &e).with_subject(id))?;
        Ok(found.map(|p| instance_state(cluster_name, &p)))
    }

    async fn find_by_name(
        &self,
        external_name: &str,
    ) -> Result<Option<InstanceState>, ProviderError> {
        let op = Operation::FindByName;
        for cluster in &self.snapshot() {
            let name = cluster.config.name.as_str();
            if let Some(pod) = cluster
                .pods()
                .get_opt(external_name)
                .await
                .map_err(|e| classify(name, op, &e).with_subject(external_name))?
            {
                return Ok(Some(instance_state(name, &pod)));
            }
        }
        Ok(None)
    }

    /// Every Pod the node made on any cluster whose name starts with `prefix`. An error when a
    /// cluster cannot be listed: a partial list must not look complete to the sweeper.
    async fn list_ours(&self, prefix: &str) -> Result<Vec<InstanceState>, ProviderError> {
        let op = Operation::ListOurs;
        let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        let mut out = Vec::new();
        for cluster in &self.snapshot() {
            let name = cluster.config.name.as_str();
            let pods = list_all(&cluster.pods(), &selector)
                .await
                .map_err(|e| classify(name, op, &e))?;
            out.extend(
                pods.iter()
                    .filter(|p| {
                        p.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with(prefix))
                    })
                    .map(|p| instance_state(name, p)),
            );
            // Listed after the Pods: a Secret whose Pod was created meanwhile is checked by name.
            let secrets = list_all(&cluster.secrets(), &selector)
                .await
                .map_err(|e| classify(name, op, &e))?;
            for secret in &secrets {
                let Some(pod) = secret.metadata.name.as_deref().and_then(secret_pod) else {
                    continue;
                };
                let listed = out
                    .iter()
                    .any(|i| i.region == name && i.external_name == pod);
                if !pod.starts_with(prefix) || listed {
                    continue;
                }
                let exists = cluster
                    .pods()
                    .get_opt(pod)
                    .await
                    .map_err(|e| classify(name, op, &e))?
                    .is_some();
                if !exists {
                    out.push(orphan_secret_state(name, pod, secret));
                }
            }
        }
        Ok(out)
    }

    /// Deletes the remote Pod with its own grace period, and its Secret (alone, for an orphan
    /// Secret's instance). Gone already is success.
    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let op = Operation::Delete;
        let (cluster, pod) = self.instance(id, op)?;
        let cluster_name = cluster.config.name.as_str();
        match cluster.pods().delete(pod, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(classify(cluster_name, op, &e).with_subject(id)),
        }
        match cluster
            .secrets()
            .delete(&secret_name(pod), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(classify(cluster_name, op, &e).with_subject(id)),
        }
    }

    /// `kubectl exec` or `port-forward` of the remote Pod, through the remote API server (which
    /// asks the remote node's kubelet), relayed as runner session frames.
    async fn open_session(
        &self,
        id: &str,
        request: &SessionRequest,
    ) -> Result<Option<FrameStream>, ProviderError> {
        let op = Operation::Session;
        let (cluster, pod) = self.instance(id, op)?;
        crate::session::open(&cluster.pods(), pod, request)
            .await
            .map(Some)
            .map_err(|e| classify(&cluster.config.name, op, &e).with_subject(id))
    }

    /// The remote Pod's workload container's log, read through the remote API server (which
    /// asks the remote node's kubelet), with the request's options.
    async fn logs(
        &self,
        id: &str,
        request: &LogRequest,
    ) -> Result<Option<LogStream>, ProviderError> {
        let op = Operation::Logs;
        let (cluster, pod) = self.instance(id, op)?;
        let params = LogParams {
            container: Some(CONTAINER.to_owned()),
            follow: request.follow,
            limit_bytes: request.limit_bytes,
            since_seconds: request.since_seconds,
            tail_lines: request.tail_lines,
            timestamps: request.timestamps,
            ..LogParams::default()
        };
        let name = cluster.config.name.clone();
        let reader = cluster
            .pods()
            .log_stream(pod, &params)
            .await
            .map_err(|e| classify(&name, op, &e).with_subject(id))?;
        let chunks = futures::stream::unfold(Some(Box::pin(reader)), move |reader| {
            let name = name.clone();
            async move {
                let mut reader = reader?;
                let mut buf = vec![0u8; 16 * 1024];
                match reader.read(&mut buf).await {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        Some((Ok(Bytes::from(buf)), Some(reader)))
                    }
                    Err(e) => {
                        let message = format!("reading the log from remote cluster {name}: {e}");
                        Some((Err(error(op, FailureClass::Transient, message)), None))
                    }
                }
            }
        });
        Ok(Some(chunks.boxed()))
    }

    /// Healthy while at least one cluster answers with our credentials and discovery (if any)
    /// answers too; each cluster's answer also decides whether its offers are listed.
    async fn health(&self) -> Result<(), ProviderError> {
        let op = Operation::Health;
        if let Some(e) = self.discovery.lock().clone() {
            return Err(e);
        }
        if self.clusters.read().is_empty() {
            return Err(error(
                op,
                FailureClass::Capacity,
                "no remote cluster is configured or provisioned yet",
            ));
        }
        let mut first_error = None;
        let mut healthy = 0;
        let clusters = self.snapshot();
        let probes = futures::future::join_all(clusters.iter().map(|c| probe(c, op))).await;
        for (cluster, outcome) in clusters.iter().zip(probes) {
            match outcome {
                Ok(()) => {
                    cluster.trouble.clear("health");
                    healthy += 1;
                }
                Err(failure) => {
                    cluster.trouble.set("health", failure.message.clone());
                    first_error.get_or_insert(failure);
                }
            }
        }
        match first_error {
            Some(e) if healthy == 0 => Err(e),
            _ => Ok(()),
        }
    }
}

/// Whether `cluster` answers, within [`HEALTH_PROBE`]: a namespaced list proves both that the
/// API answers and that we may work there.
async fn probe(cluster: &Cluster, op: Operation) -> Result<(), ProviderError> {
    let name = cluster.config.name.as_str();
    let (pods, params) = (cluster.pods(), ListParams::default().limit(1));
    match tokio::time::timeout(HEALTH_PROBE, pods.list(&params)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(classify(name, op, &e)),
        Err(_) => Err(error(
            op,
            FailureClass::Transient,
            format!(
                "remote cluster {name} did not answer within {} s",
                HEALTH_PROBE.as_secs()
            ),
        )),
    }
}

/// Every object `api` lists under the label `selector`, across pages.
async fn list_all<K>(api: &kube::Api<K>, selector: &str) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().labels(selector).limit(500);
    let mut all = Vec::new();
    loop {
        let page = api.list(&params).await?;
        all.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(all),
        }
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
