//! The [`Provider`] impl of [`KubeTarget`]: offers from the clusters' free GPUs, a rental as a
//! Pod (and the Secret its environment travels in) named by the external name, found again by
//! that name and by our label, deleted with its Secret; logs and exec or port-forward sessions
//! through the remote API server; health as whether the clusters answer.
//!
//! Not the watches that keep each cluster's caches (`watch`), not the wait for the remote
//! scheduler after a create (`scheduling`), and not the Pod and Secret shapes (`crate::pod`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::AsyncReadExt as _;
use futures::StreamExt as _;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use neocloud_core::{FailureClass, InstanceState, Offer, OfferQuery, ProviderId};
use neocloud_protocol::session::SessionRequest;
use neocloud_providers::{
    CreateRequest, FrameStream, LogRequest, LogStream, Operation, Provider, ProviderError,
};

use super::watch::Cluster;
use super::{KubeTarget, classify, error};
use crate::offers::{largest_free_by_product, offers, parse_offer_id};
use crate::pod::{
    CONTAINER, MANAGED_BY, env_secret, instance_state, orphan_secret_state, owned_by, remote_pod,
    secret_name, secret_pod,
};

/// How long a cluster's health probe waits for its API server.
const HEALTH_PROBE: Duration = Duration::from_secs(10);

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
