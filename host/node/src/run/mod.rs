//! `neocloud-node run`: the node as a process. It serves metrics and health at once, waits to
//! be the leader (one active replica per node name, through a Lease), then registers the Node
//! and keeps it alive, runs the reconciler, and starts the sweeper once the reconciler's caches
//! are synced. Losing leadership ends the process, so a restarted replica starts clean.

mod capacity;
mod config;
mod kubelet_api;
mod vm;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use neocloud_broker::{
    BudgetGuard, Catalog, CatalogConfig, CostLedger, DefaultFallback, LadderLimits, Planner, Renter,
};
use neocloud_core::{CapacityType, InstancePhase, OfferQuery, ProviderId};
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_policy::wasm::{EngineConfig, WasmEngine};
use neocloud_providers::{LambdaProvider, Provider, RunpodProvider, VastConfig, VastProvider};
use tokio::sync::{oneshot, watch};

pub use capacity::gpus_within_budget;
pub use config::{LeaderElection, ReconcilerSettings, RunConfig};
pub use kubelet_api::KubeletApiSettings;
pub use vm::RunnerSettings;

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
                ProviderId::Fake => Arc::new(crate::smoke::fake_market()),
                ProviderId::Kube => anyhow::bail!("providers: kube is not available yet"),
            })
        })
        .collect()
}

/// Runs the node until it fails or loses leadership.
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
    let listener = tokio::net::TcpListener::bind(&cfg.metrics_address)
        .await
        .with_context(|| {
            format!(
                "metricsAddress: failed to listen on {}",
                cfg.metrics_address
            )
        })?;
    tracing::info!(address = %cfg.metrics_address, "serving /metrics, /healthz and /readyz");
    let server = tokio::spawn(metrics::serve(listener, Arc::clone(&metrics), ready_rx));
    if cfg.install_crds {
        crate::crd::install(
            &client,
            crate::vnode::FIELD_MANAGER,
            Duration::from_secs(60),
        )
        .await
        .context("failed to install the CRDs")?;
    }
    let mut leadership = lead(&client, &cfg).await?;
    tracing::info!(node = %cfg.node.name, providers = ?ids, "leading; starting the node");

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
    let beats = tokio::spawn(heartbeat.run());

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
    let health = tokio::spawn(check_health(
        renter.clone(),
        Duration::from_secs(cfg.health_interval_seconds),
        health_tx,
    ));
    let mut rc = ReconcilerConfig::new(&node_cfg.name, cfg.cluster());
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
    let policies = tokio::spawn(Arc::clone(&registry).run());
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
    let reconcile = tokio::spawn(Arc::clone(&reconciler).run(Some(synced_tx)));
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
    let sweeper = Sweeper::new(
        client.clone(),
        providers,
        cfg.cluster(),
        cfg.sweeper.clone(),
    )
    .with_metrics(Arc::clone(&metrics));
    let ready = ready_tx.clone();
    let sweep = tokio::spawn(sweeper.run(async move {
        if synced_rx.await.is_ok() {
            let _ = ready.send(true);
        }
    }));
    let gauges = tokio::spawn(gauges(reconciler, renter, metrics));

    let outcome = tokio::select! {
        _ = leadership.changed() => {
            Err(anyhow::anyhow!("lost leadership of node {}; exiting so a replica can take over", node_cfg.name))
        }
        r = server => Err(anyhow::anyhow!("the metrics server stopped: {r:?}")),
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; stopping");
            Ok(())
        }
    };
    for task in [reconcile, sweep, gauges, beats, health, policies] {
        task.abort();
    }
    outcome
}

/// Waits until this replica holds the node's Lease; the receiver changes when it no longer
/// does. With leader election off, returns a receiver that never changes.
async fn lead(client: &Client, cfg: &RunConfig) -> anyhow::Result<watch::Receiver<bool>> {
    let le = &cfg.leader_election;
    if !le.enabled {
        let (tx, rx) = watch::channel(true);
        std::mem::forget(tx);
        return Ok(rx);
    }
    let namespace = le
        .namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "default".to_owned());
    let name = le
        .lease_name
        .clone()
        .unwrap_or_else(|| format!("neocloud-node-{}", cfg.node.name));
    let identity = std::env::var("POD_NAME")
        .ok()
        .unwrap_or_else(|| format!("{}-{}", cfg.node.name, std::process::id()));
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &name)
        .with_namespace(&namespace)
        .with_identity(&identity)
        .with_duration(le.lease_duration_seconds)
        .with_grace(le.renew_grace_seconds)
        .build()
        .await
        .with_context(|| format!("leaderElection: failed to use Lease {namespace}/{name}"))?;
    let (mut rx, _task) = manager.watch().await;
    tracing::info!(lease = %format!("{namespace}/{name}"), %identity, "waiting to lead");
    while !*rx.borrow_and_update() {
        rx.changed()
            .await
            .context("leader election stopped before this replica led")?;
    }
    Ok(rx)
}

/// Checks every provider's health and what GPUs the catalog and the budget allow, and publishes
/// the node's health (the Node status applies its ceiling on top).
async fn check_health(renter: Renter, every: Duration, tx: watch::Sender<Health>) {
    let any_gpu = OfferQuery {
        gpu_models: Vec::new(),
        gpu_count: 1,
        capacity: Some(CapacityType::Any),
    };
    loop {
        let ids = renter.catalog.provider_ids();
        let mut failures = Vec::new();
        for id in &ids {
            if let Some(p) = renter.catalog.provider(*id)
                && let Err(e) = p.health().await
            {
                failures.push(e.to_string());
            }
        }
        let healthy = failures.len() < ids.len();
        let view = renter.catalog.offers(&any_gpu, &[]).await;
        let budget = &renter.budget;
        let remaining = budget
            .cap_usd_per_hour()
            .map(|cap| cap - budget.running_usd_per_hour() - budget.in_flight_usd_per_hour());
        let gpus = if healthy {
            gpus_within_budget(&view.offers, remaining)
        } else {
            0
        };
        let message = if failures.is_empty() {
            "every provider answers".to_owned()
        } else {
            failures.join("; ")
        };
        tx.send_if_modified(|h| {
            let changed = h.healthy != healthy || h.message != message || h.gpus != gpus;
            if changed {
                let since = if h.healthy == healthy {
                    h.since
                } else {
                    Timestamp::now()
                };
                *h = Health {
                    healthy,
                    message: message.clone(),
                    gpus,
                    since,
                };
            }
            changed
        });
        tokio::time::sleep(every).await;
    }
}

/// Refreshes the gauges every 5 s: cost, instances by provider and phase (from bindings), Pods
/// by phase. They are read from the reconciler's caches: listing the node's Pods and bindings
/// instead costs megabytes per refresh at 1,000 Pods.
async fn gauges(reconciler: Arc<Reconciler>, renter: Renter, metrics: Arc<Metrics>) {
    loop {
        let costs = neocloud_broker::Broker {
            planner: Planner::default(),
            renter: renter.clone(),
        }
        .costs(Utc::now());
        metrics.set_cost(&costs);
        if let Some(caches) = reconciler.caches() {
            metrics.set_instances(caches.bindings.state().iter().filter_map(|b| {
                let s = b.status.as_ref()?;
                let provider = s.provider.as_deref()?.parse::<ProviderId>().ok()?;
                s.instance_id.as_ref()?;
                let phase = match s.phase {
                    crate::crd::BindingPhase::Running => InstancePhase::Running,
                    crate::crd::BindingPhase::Provisioning => InstancePhase::Starting,
                    crate::crd::BindingPhase::Releasing => InstancePhase::Terminating,
                    crate::crd::BindingPhase::Pending | crate::crd::BindingPhase::Planning => {
                        InstancePhase::Pending
                    }
                    _ => return None,
                };
                Some((provider, phase))
            }));
            metrics.set_pods(
                caches
                    .pods
                    .state()
                    .iter()
                    .filter_map(|p| p.status.as_ref()?.phase.clone()),
            );
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
