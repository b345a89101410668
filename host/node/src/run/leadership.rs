//! Leadership of the node: one active replica per node name, through a Lease held with
//! `kube-lease-manager`. A replica waits to lead, notices when it no longer does, and hands the
//! Lease back when it stops on its own, so the Lease shows no holder and a standby takes it
//! without forcing it (a standby still sleeps until the end of the term it last saw).
//!
//! Not here: what the leader does (`run`).

use std::time::Duration;

use anyhow::Context;
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::RunConfig;

/// How long a stopping replica waits for the Lease to be handed back.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// This replica's hold on the node's Lease.
pub struct Leadership {
    held: watch::Receiver<bool>,
    /// The lease manager's task; it releases the Lease once `held` is dropped. `None` with
    /// leader election off.
    manager: Option<JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>>,
    /// Keeps `held` open with leader election off.
    _always: Option<watch::Sender<bool>>,
}

impl Leadership {
    /// Waits until this replica holds the node's Lease. With leader election off, leads at once.
    pub async fn acquire(client: &Client, cfg: &RunConfig) -> anyhow::Result<Leadership> {
        let le = &cfg.leader_election;
        if !le.enabled {
            let (tx, held) = watch::channel(true);
            return Ok(Leadership {
                held,
                manager: None,
                _always: Some(tx),
            });
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
        let (mut held, manager) = manager.watch().await;
        tracing::info!(lease = %format!("{namespace}/{name}"), %identity, "waiting to lead");
        while !*held.borrow_and_update() {
            held.changed()
                .await
                .context("leader election stopped before this replica led")?;
        }
        Ok(Leadership {
            held,
            manager: Some(manager),
            _always: None,
        })
    }

    /// Returns once this replica no longer leads (the Lease was lost or the manager stopped).
    pub async fn lost(&mut self) {
        while *self.held.borrow_and_update() {
            if self.held.changed().await.is_err() {
                return;
            }
        }
    }

    /// Hands the Lease back (if still held), waiting at most a few seconds.
    pub async fn release(self) {
        let Some(manager) = self.manager else {
            return;
        };
        drop(self.held);
        match tokio::time::timeout(RELEASE_WAIT, manager).await {
            Ok(Ok(Ok(_))) => tracing::info!("released the leader Lease"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "failed to release the leader Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "the lease manager stopped abnormally"),
            Err(_) => tracing::warn!(
                "the leader Lease was not released within {RELEASE_WAIT:?}; a standby leads once it expires"
            ),
        }
    }
}
