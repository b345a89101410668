//! Start-up, before the process leads: the Kubernetes client, the providers from the
//! environment, `/metrics` and the health endpoints (served at once: not ready until the
//! replica stands by), the cluster identity and the CRDs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kube::Client;
use neocloud_core::ProviderId;
use neocloud_kube_target::target::secret_text;
use neocloud_kube_target::{KubeTarget, client_from_kubeconfig, discover};
use neocloud_providers::{
    FakeProvider, LambdaProvider, Provider, RunpodProvider, VastConfig, VastProvider,
};
use tokio::sync::watch;

use super::RunConfig;
use super::cluster;
use super::supervise::Supervisor;
use crate::metrics::{self, Metrics};
use crate::naming::ClusterId;

/// Builds the enabled providers from the specification's environment variables
/// (`RUNPOD_API_KEY`, `LAMBDA_API_KEY`, `VAST_API_KEY` and their `*_API_BASE_URL`).
pub fn providers_from_env(ids: &[ProviderId]) -> anyhow::Result<Vec<Arc<dyn Provider>>> {
    ids.iter()
        .map(|id| -> anyhow::Result<Arc<dyn Provider>> {
            Ok(match id {
                ProviderId::Runpod => Arc::new(RunpodProvider::from_env()?),
                ProviderId::Lambda => Arc::new(LambdaProvider::from_env()?),
                ProviderId::Vast => Arc::new(VastProvider::new(VastConfig::from_env()?)?),
                ProviderId::Fake => Arc::new(FakeProvider::sample_market()),
                ProviderId::Kube => anyhow::bail!(
                    "providers: kube reads its clusters from the config's remoteClusters; \
                     build it with remote_clusters"
                ),
            })
        })
        .collect()
}

/// The `kube` provider over the config's `remoteClusters`: each kubeconfig read from its Secret
/// in this cluster (a bare name is in `POD_NAMESPACE`) or its file, and a client built from it.
/// An unreadable or invalid kubeconfig stops the start, naming the cluster's entry.
pub async fn remote_clusters(cfg: &RunConfig, client: &Client) -> anyhow::Result<Arc<KubeTarget>> {
    if cfg.remote_clusters.is_empty() && cfg.nvke.is_none() {
        anyhow::bail!("providers: kube needs at least one entry in remoteClusters, or nvke");
    }
    let own_namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".to_owned());
    let mut clusters = Vec::with_capacity(cfg.remote_clusters.len());
    for (i, cluster) in cfg.remote_clusters.iter().enumerate() {
        let at = format!("remoteClusters[{i}].kubeconfig");
        let source = &cluster.kubeconfig;
        let (yaml, origin) = match (&source.path, source.secret_ref(&own_namespace)) {
            (Some(path), _) => (
                std::fs::read_to_string(path)
                    .with_context(|| format!("{at}.path: cannot read {}", path.display()))?,
                format!("file {}", path.display()),
            ),
            (None, Some((namespace, name, key))) => (
                secret_text(client, namespace, name, key)
                    .await
                    .map_err(|e| anyhow::anyhow!("{at}.secret: {e}"))?,
                format!("Secret {namespace}/{name} key {key:?}"),
            ),
            (None, None) => anyhow::bail!("{at}: give a secret or a path"),
        };
        let allow_insecure = cluster.allow_insecure_skip_tls_verify;
        let remote = client_from_kubeconfig(&yaml, &origin, allow_insecure)
            .await
            .map_err(|e| anyhow::anyhow!("{at} ({}): {e}", cluster.name))?;
        clusters.push((cluster.clone(), remote));
    }
    let target = Arc::new(KubeTarget::start(clusters));
    if let Some(nvke) = &cfg.nvke {
        tracing::info!(url = %nvke.url, "discovering NVKE workload clusters");
        discover(&target, nvke.clone(), client.clone(), own_namespace)?;
    }
    tracing::info!(clusters = ?target.cluster_names(), "renting on remote clusters (provider kube)");
    Ok(target)
}

/// What the process has once started, before it leads.
pub(super) struct Started {
    pub client: Client,
    /// The API server's CA, which the kubelet API trusts for the API server's own calls.
    pub kube_ca: Option<Vec<Vec<u8>>>,
    pub ids: Vec<ProviderId>,
    pub metrics: Arc<Metrics>,
    /// The providers, instrumented.
    pub providers: Vec<Arc<dyn Provider>>,
    /// The supervised tasks (the metrics server is the first).
    pub tasks: Supervisor,
    /// `/readyz`: true while a standby waits to lead, and once the leader's caches are synced.
    pub ready: watch::Sender<bool>,
    pub cluster: ClusterId,
}

/// Starts everything that runs before leading; see the module documentation.
pub(super) async fn start(cfg: &RunConfig) -> anyhow::Result<Started> {
    let kube_config = kube::Config::infer()
        .await
        .context("failed to read the Kubernetes configuration (KUBECONFIG or in-cluster)")?;
    let kube_ca = kube_config.root_cert.clone();
    let client = Client::try_from(kube_config)
        .context("failed to build a Kubernetes client (KUBECONFIG or in-cluster)")?;
    let ids = cfg.provider_ids(std::env::var("GPU_BURST_PROVIDER").ok().as_deref())?;
    let metrics = Arc::new(Metrics::new());
    if let Some(meter) = crate::telemetry::meter() {
        metrics.export_otlp(&meter);
    }
    metrics.set_spend_labels(&cfg.spend.labels);
    let mut built = Vec::with_capacity(ids.len());
    for id in &ids {
        match id {
            ProviderId::Kube => {
                built.push(remote_clusters(cfg, &client).await? as Arc<dyn Provider>)
            }
            ProviderId::Fake => {
                let fake = FakeProvider::sample_market();
                let seconds = cfg.fake.workload_seconds;
                fake.set_workload_run_time(seconds.map(Duration::from_secs));
                built.push(Arc::new(fake) as Arc<dyn Provider>)
            }
            other => built.extend(providers_from_env(std::slice::from_ref(other))?),
        }
    }
    let providers = metrics::instrument(built, &metrics);
    let (ready, ready_rx) = watch::channel(false);
    let mut tasks = Supervisor::new(ready.clone())?;
    let listener = tokio::net::TcpListener::bind(&cfg.metrics_address)
        .await
        .with_context(|| {
            format!(
                "metricsAddress: failed to listen on {}",
                cfg.metrics_address
            )
        })?;
    tracing::info!(address = %cfg.metrics_address, "serving /metrics, /healthz and /readyz");
    tasks.spawn(
        "metrics",
        metrics::serve(listener, Arc::clone(&metrics), ready_rx),
    );
    let cluster = cluster::resolve(&client, cfg.cluster()?).await?;
    if cfg.install_crds {
        crate::crd::install(
            &client,
            crate::vnode::FIELD_MANAGER,
            Duration::from_secs(60),
        )
        .await
        .context("failed to install the CRDs")?;
    }
    Ok(Started {
        client,
        kube_ca,
        ids,
        metrics,
        providers,
        tasks,
        ready,
        cluster,
    })
}
