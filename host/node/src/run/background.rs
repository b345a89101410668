//! The node's small background loops: provider health for the Node status, and the gauges.
//! Each runs until the node stops, supervised by `run`.
//!
//! Not here: the reconciler, the sweeper and the heartbeat, which have modules of their own.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::jiff::Timestamp;
use neocloud_broker::Renter;
use neocloud_core::{CapacityType, InstancePhase, OfferQuery, ProviderId};
use tokio::sync::watch;

use super::capacity::{advertised_gpus, bound_gpus, remaining_usd_per_hour};
use crate::metrics::Metrics;
use crate::reconcile::Reconciler;
use crate::vnode::Health;
use neocloud_controller::holds::Holds;

/// Checks every provider's health and what GPUs the catalog and the budget allow (beside the
/// GPUs of the Pods `reconciler` has bound, and counting what `holds` keeps for
/// ProvisioningRequests as buyable; see `capacity`), and publishes the node's health (the Node
/// status applies its ceiling on top).
pub async fn check_health(
    renter: Renter,
    every: Duration,
    tx: watch::Sender<Health>,
    reconciler: Arc<Reconciler>,
    holds: Option<Arc<Holds>>,
) {
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
        let remaining = remaining_usd_per_hour(&renter.budget);
        let bound = reconciler
            .caches()
            .map_or(0, |c| bound_gpus(c.pods.state().iter().map(|p| &**p)));
        let held = holds.as_ref().map_or(0.0, |h| h.usd_per_hour());
        let gpus = if healthy {
            advertised_gpus(&view.offers, bound, remaining, held)
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

/// Deletes receipts past the retention, at start and every 10 minutes; a failure is logged and
/// tried again at the next round.
pub async fn expire_receipts(reconciler: Arc<Reconciler>) {
    loop {
        match reconciler.expire_receipts(Utc::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(receipts = n, "deleted receipts past their retention"),
            Err(e) => tracing::warn!(error = %e, "failed to expire CloudPodReceipts"),
        }
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
}

/// Refreshes the gauges every 5 s: cost, instances by provider and phase (from bindings), Pods
/// by phase; and counts what each binding spent since into `neocloud_spend_usd_total`. They are read from the reconciler's caches: listing the node's Pods and bindings
/// instead costs megabytes per refresh at 1,000 Pods.
pub async fn gauges(reconciler: Arc<Reconciler>, renter: Renter, metrics: Arc<Metrics>) {
    loop {
        let costs = renter.costs(Utc::now());
        metrics.set_cost(&costs);
        reconciler.observe_spend(&costs.bindings);
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
