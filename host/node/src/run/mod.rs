//! `neocloud-node run`: the node as a process. It serves metrics and health at once, learns its
//! cluster id, waits to be the leader (one active replica per node name, through a Lease), then
//! registers the Node and keeps it alive, runs the reconciler, and starts the sweeper once the
//! reconciler's caches are synced. Losing leadership ends the process, so a restarted replica
//! starts clean; so does any long-running task that ends or panics (`supervise`), after handing
//! the Lease back for a standby.

mod background;
mod capacity;
mod cluster;
mod config;
mod kubelet_api;
mod leadership;
mod supervise;
mod vm;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use neocloud_broker::{
    BudgetGuard, Catalog, CatalogConfig, CostLedger, DefaultFallback, LadderLimits, Planner, Renter,
};
use neocloud_core::ProviderId;
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_policy::wasm::{EngineConfig, WasmEngine};
use neocloud_providers::{
    FakeProvider, LambdaProvider, Provider, RunpodProvider, VastConfig, VastProvider,
};
use tokio::sync::{oneshot, watch};

pub use capacity::gpus_within_budget;
pub use cluster::IDENTITY_NAMESPACE;
pub use config::{LeaderElection, ReconcilerSettings, RunConfig};
pub use kubelet_api::KubeletApiSettings;
pub use supervise::{FAULT_VAR, TaskEnded};
pub use vm::RunnerSettings;

use background::{check_health, gauges};
use leadership::Leadership;
use supervise::Supervisor;

use crate::metrics::{self, Metrics};
use crate::policies::PolicyRegistry;
use crate::reconcile::{Reconciler, ReconcilerConfig};
use crate::sweeper::Sweeper;
use crate::vnode::{Health, Heartbeat};

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
                ProviderId::Kube => anyhow::bail!("providers: kube is not available yet"),
            })
        })
        .collect()
}

/// Runs the node until it fails, one of its tasks ends, or it loses leadership.
pub async fn run(cfg: RunConfig) -> anyhow::Result<()> {
    let kube_config = kube::Config::infer()
        .await
        .context("failed to read the Kubernetes configuration (KUBECONFIG or in-cluster)")?;
    let kube_ca = kube_config.root_cert.clone();
    let client = Client::try_from(kube_config)
        .context("failed to build a Kubernetes client (KUBECONFIG or in-cluster)")?;
    let ids = cfg.provider_ids(std::env::var("GPU_BURST_PROVIDER").ok().as_deref())?;
    let metrics = Arc::new(Metrics::new());
    let providers = metrics::instrument(providers_from_env(&ids)?, &metrics);
    let (ready_tx, ready_rx) = watch::channel(false);
    let mut tasks = Supervisor::new(ready_tx.clone())?;
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
    let mut leadership = tokio::select! {
        led = Leadership::acquire(&client, &cfg) => led?,
        ended = tasks.ended() => return Err(ended.into()),
    };
    tracing::info!(node = %cfg.node.name, %cluster, providers = ?ids, "leading; starting the node");

    let mut node_cfg = cfg.node.clone();
    node_cfg.providers = ids.iter().map(|p| p.as_str().to_owned()).collect();
    let (health_tx, health_rx) = watch::channel(Health {
        healthy: false,
        message: "checking providers".into(),
        gpus: 0,
        since: Timestamp::now(),
    });
    let heartbeat = Heartbeat::new(client.clone(), node_cfg.clone(), health_rx);
    heartbeat
        .register()
        .await
        .with_context(|| format!("failed to register node {}", node_cfg.name))?;
    tasks.spawn("heartbeat", heartbeat.run());

    let renter = Renter {
        catalog: Catalog::new(providers.clone(), CatalogConfig::default()),
        fallback: Arc::new(metrics::InstrumentedFallback::new(
            Arc::new(DefaultFallback::default()),
            "default",
            Arc::clone(&metrics),
        )),
        limits: LadderLimits::default(),
        budget: BudgetGuard::new(cfg.budget_usd_per_hour),
        ledger: Arc::new(CostLedger::new()),
    };
    // What is already spent, before anything reads the budget (the Node's GPUs, the gauges) or
    // rents against it; the reconciler counts it again, idempotently, before it starts.
    let rebuilt = crate::reconcile::rebuild_budget(&client, &node_cfg.name, &renter)
        .await
        .context("failed to list the node's bindings to rebuild the cluster budget")?;
    tracing::info!(
        running = rebuilt.running,
        in_flight = rebuilt.in_flight,
        usd_per_hour = rebuilt.usd_per_hour,
        "budget rebuilt from the bindings"
    );
    tasks.spawn(
        "health",
        check_health(
            renter.clone(),
            Duration::from_secs(cfg.health_interval_seconds),
            health_tx,
        ),
    );
    let mut rc = ReconcilerConfig::new(&node_cfg.name, cluster.clone());
    rc.host_ip = node_cfg.address.clone();
    rc.concurrency = cfg.reconciler.concurrency;
    rc.poll_interval = cfg.poll_interval();
    rc.running_poll_interval = cfg.running_poll_interval();
    rc.retry_interval = cfg.retry_interval();
    // Kept alive for the node's lifetime: dropping the server stops it.
    let callback = match &cfg.runner {
        Some(settings) => {
            let (server, runners) = settings
                .start(client.clone(), &node_cfg.name)
                .await
                .context("failed to start the runner callback server")?;
            rc.runners = Some(Arc::clone(&runners));
            Some((server, runners))
        }
        None => {
            if ids.contains(&ProviderId::Lambda) {
                tracing::warn!(
                    "lambda is enabled without a runner: its Pods are Running once their VM is, with no container, logs or heartbeats"
                );
            }
            None
        }
    };
    let cel = Arc::new(CelEngine::new(CelLimits::default()));
    let wasm = WasmEngine::new(EngineConfig::default())
        .map_err(|e| anyhow::anyhow!("failed to start the Wasm policy engine: {e}"))?;
    let registry =
        PolicyRegistry::new(client.clone(), Arc::clone(&cel), wasm, Arc::clone(&metrics));
    tasks.spawn("policies", Arc::clone(&registry).run());
    let reconciler = Reconciler::new(
        client.clone(),
        rc,
        Planner::default(),
        renter.clone(),
        cel,
        Arc::clone(&metrics),
        Some(registry),
    );
    let (synced_tx, synced_rx) = oneshot::channel();
    tasks.spawn("reconciler", Arc::clone(&reconciler).run(Some(synced_tx)));
    // Kept alive for the node's lifetime, like the callback server.
    let _kubelet = if cfg.kubelet_api.enabled {
        Some(
            cfg.kubelet_api
                .start(
                    &node_cfg,
                    client.clone(),
                    kube_ca.as_deref(),
                    &reconciler,
                    callback.as_ref().map(|(_, runners)| runners),
                )
                .await?,
        )
    } else {
        None
    };
    let sweeper = Sweeper::new(client.clone(), providers, cluster, cfg.sweeper.clone())
        .with_metrics(Arc::clone(&metrics));
    let ready = ready_tx.clone();
    tasks.spawn(
        "sweeper",
        sweeper.run(async move {
            if synced_rx.await.is_ok() {
                let _ = ready.send(true);
            }
        }),
    );
    tasks.spawn("gauges", gauges(reconciler, renter, metrics));

    let outcome = tokio::select! {
        () = leadership.lost() => {
            return Err(anyhow::anyhow!("lost leadership of node {}; exiting so a replica can take over", node_cfg.name));
        }
        ended = tasks.ended() => Err(ended.into()),
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; stopping");
            Ok(())
        }
    };
    tasks.stop().await;
    leadership.release().await;
    outcome
}
