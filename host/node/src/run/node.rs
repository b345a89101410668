//! What the leader runs: the Node registered and kept alive, the budget rebuilt from the
//! bindings before anything rents, the provider health check, the runner callback server, the
//! policy registry, the reconciler, the ProvisioningRequest controller, the kubelet API, the
//! sweeper (once the reconciler's caches are synced, which is also when `/readyz` turns ready)
//! and the gauges. Every long-running piece is a task of the [`Supervisor`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::jiff::Timestamp;
use neocloud_broker::{
    BudgetGuard, Catalog, CatalogConfig, CostLedger, DefaultFallback, LadderLimits, Planner, Renter,
};
use neocloud_core::ProviderId;
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_policy::wasm::WasmEngine;
use tokio::sync::{oneshot, watch};

use super::RunConfig;
use super::background::{check_health, expire_receipts, gauges};
use super::startup::Started;
use crate::metrics;
use crate::policies::PolicyRegistry;
use crate::reconcile::{Reconciler, ReconcilerConfig, Runners};
use crate::sweeper::Sweeper;
use crate::vnode::{Health, Heartbeat, NodeConfig};
use neocloud_controller::holds::Holds;
use neocloud_provisioning::Provisioner;

/// Starts everything the leader runs, as tasks of `s.tasks`; see the module documentation.
pub(super) async fn lead(cfg: &RunConfig, s: &mut Started) -> anyhow::Result<()> {
    let mut node = cfg.node.clone();
    node.providers = s.ids.iter().map(|p| p.as_str().to_owned()).collect();
    let health = register(s, &node).await?;
    let renter = rebuilt_renter(cfg, s, &node).await?;
    let runners = match &cfg.runner {
        Some(settings) => {
            let (server, runners, events) = settings
                .start(s.client.clone(), &node.name)
                .await
                .context("failed to start the runner callback server")?;
            s.tasks.spawn("callback", server.serve());
            s.tasks
                .spawn("runner-events", Arc::clone(&runners).follow(events));
            s.tasks.spawn(
                "runner-files",
                Arc::clone(&runners).refresh_files(s.client.clone()),
            );
            Some(runners)
        }
        None => {
            if s.ids.contains(&ProviderId::Lambda) {
                tracing::warn!(
                    "lambda is enabled without a runner: its Pods are Running once their VM is, with no container, logs or heartbeats"
                );
            }
            None
        }
    };
    let kubelet_tls = match cfg.kubelet_api.enabled {
        true => Some(cfg.kubelet_api.tls(&node)?),
        false => None,
    };
    let relays = match &kubelet_tls {
        Some(tls) => cfg.kubelet_api.relays(&node, &s.client, tls).await,
        None => None,
    };
    let table = relays.as_ref().map(|r| Arc::clone(&r.table));
    let holds = (cfg.provisioning.enabled).then(|| Holds::new(Some(Arc::clone(&s.metrics))));
    let pieces = (renter.clone(), runners.clone(), relays, holds.clone());
    let reconciler = reconciler(cfg, s, &node, pieces)?;
    s.tasks.spawn(
        "health",
        check_health(
            renter.clone(),
            Duration::from_secs(cfg.health_interval_seconds),
            health,
            Arc::clone(&reconciler),
            holds.clone(),
        ),
    );
    let (synced_tx, synced_rx) = oneshot::channel();
    s.tasks
        .spawn("reconciler", Arc::clone(&reconciler).run(Some(synced_tx)));
    if let Some(holds) = holds {
        let provisioner = Provisioner::new(
            s.client.clone(),
            Arc::clone(&reconciler),
            holds,
            cfg.provisioning.config(),
        );
        s.tasks.spawn("provisioning", provisioner.run());
    }
    if let Some(tls) = &kubelet_tls {
        let kubelet = cfg.kubelet_api.start(
            &node,
            s.client.clone(),
            s.kube_ca.as_deref(),
            &reconciler,
            runners.as_ref(),
            tls,
            table,
        );
        s.tasks.spawn("kubelet-api", kubelet.await?.serve());
    }
    let sweeper = Sweeper::new(
        s.client.clone(),
        s.providers.clone(),
        s.cluster.clone(),
        cfg.sweeper.clone(),
    )
    .with_metrics(Arc::clone(&s.metrics));
    let ready = s.ready.clone();
    s.tasks.spawn(
        "sweeper",
        sweeper.run(async move {
            if synced_rx.await.is_ok() {
                let _ = ready.send(true);
            }
        }),
    );
    s.tasks
        .spawn("receipts", expire_receipts(Arc::clone(&reconciler)));
    s.tasks
        .spawn("gauges", gauges(reconciler, renter, Arc::clone(&s.metrics)));
    Ok(())
}

/// Registers the Node and starts its heartbeat; returns where the health check reports.
async fn register(s: &mut Started, node: &NodeConfig) -> anyhow::Result<watch::Sender<Health>> {
    let (health_tx, health_rx) = watch::channel(Health {
        healthy: false,
        message: "checking providers".into(),
        gpus: 0,
        since: Timestamp::now(),
    });
    let heartbeat = Heartbeat::new(s.client.clone(), node.clone(), health_rx);
    heartbeat
        .register()
        .await
        .with_context(|| format!("failed to register node {}", node.name))?;
    s.tasks.spawn("heartbeat", heartbeat.run());
    Ok(health_tx)
}

/// The renter, with the budget and cost ledger rebuilt from the bindings: what is already
/// spent is known before anything reads the budget (the Node's GPUs, the gauges) or rents
/// against it. The reconciler counts it again, idempotently, before it starts.
async fn rebuilt_renter(cfg: &RunConfig, s: &Started, node: &NodeConfig) -> anyhow::Result<Renter> {
    let renter = Renter {
        catalog: Catalog::new(s.providers.clone(), CatalogConfig::default()),
        fallback: Arc::new(metrics::InstrumentedFallback::new(
            Arc::new(DefaultFallback::default()),
            "default",
            Arc::clone(&s.metrics),
        )),
        limits: LadderLimits::default(),
        budget: BudgetGuard::new(cfg.budget_usd_per_hour),
        ledger: Arc::new(CostLedger::new()),
    };
    let rebuilt = crate::reconcile::rebuild_budget(&s.client, &node.name, &renter)
        .await
        .context("failed to list the node's bindings to rebuild the cluster budget")?;
    tracing::info!(
        running = rebuilt.running,
        in_flight = rebuilt.in_flight,
        usd_per_hour = rebuilt.usd_per_hour,
        "budget rebuilt from the bindings"
    );
    Ok(renter)
}

/// What the reconciler rents with and hands Pods to: the renter, the runners, the relays and
/// the budget held for ProvisioningRequests.
type Pieces = (
    Renter,
    Option<Arc<Runners>>,
    Option<Arc<crate::reconcile::Relays>>,
    Option<Arc<Holds>>,
);

/// The reconciler, with the policy registry (whose watch is a task) and the CEL engine.
fn reconciler(
    cfg: &RunConfig,
    s: &mut Started,
    node: &NodeConfig,
    (renter, runners, relays, holds): Pieces,
) -> anyhow::Result<Arc<Reconciler>> {
    let mut rc = ReconcilerConfig::new(&node.name, s.cluster.clone());
    rc.host_ip = node.address.clone();
    rc.concurrency = cfg.reconciler.concurrency;
    rc.poll_interval = cfg.poll_interval();
    rc.running_poll_interval = cfg.running_poll_interval();
    rc.retry_interval = cfg.retry_interval();
    rc.runners = runners;
    rc.watch_namespaces = cfg.watch_namespaces.clone();
    rc.team_label = cfg.spend.team_label.clone();
    rc.receipt_retention = cfg.spend.retention();
    rc.relays = relays;
    rc.holds = holds;
    let cel = Arc::new(CelEngine::new(CelLimits::default()));
    let wasm = WasmEngine::new(cfg.policies.engine_config())
        .map_err(|e| anyhow::anyhow!("failed to start the Wasm policy engine: {e}"))?;
    let registry = PolicyRegistry::new(
        s.client.clone(),
        Arc::clone(&cel),
        wasm,
        cfg.policies.wasm_dir.clone(),
        Arc::clone(&s.metrics),
    );
    s.tasks.spawn("policies", Arc::clone(&registry).run());
    Ok(Reconciler::new(
        s.client.clone(),
        rc,
        Planner::default(),
        renter,
        cel,
        Arc::clone(&s.metrics),
        Some(registry),
    ))
}
