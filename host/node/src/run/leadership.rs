//! Leadership of the node: one active replica per node name, through a Lease held with
//! `kube-lease-manager`. A replica waits to lead, notices when it no longer does, and hands the
//! Lease back when it stops on its own, so the Lease shows no holder and a standby takes it
//! without forcing it: the standby reads the Lease every second and, once it sees it handed
//! back, asks for it at once instead of sleeping to the end of the term it last saw.
//!
//! Not here: what the leader does (`run`).

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::RunConfig;

/// How long a stopping replica waits for the Lease to be handed back.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// How often a standby reads the Lease to notice a leader handing it back.
const HANDBACK_POLL: Duration = Duration::from_secs(1);

/// Waits until the lease manager says this replica holds the Lease.
async fn wait_held(held: &mut watch::Receiver<bool>) -> anyhow::Result<()> {
    while !*held.borrow_and_update() {
        held.changed()
            .await
            .context("leader election stopped before this replica led")?;
    }
    Ok(())
}

/// Returns once the Lease, seen held, is seen without a holder: its leader stopped cleanly and
/// handed it back. Reads it by name (no list or watch): one GET per second per standby.
async fn handed_back(leases: &Api<Lease>, name: &str) {
    let mut seen_held = false;
    loop {
        if let Ok(lease) = leases.get_opt(name).await {
            let holder = lease
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty());
            match holder {
                Some(_) => seen_held = true,
                None if seen_held => return,
                None => {}
            }
        }
        tokio::time::sleep(HANDBACK_POLL).await;
    }
}

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
        tracing::info!(lease = %format!("{namespace}/{name}"), %identity, "waiting to lead");
        let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
        loop {
            let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &name)
                .with_namespace(&namespace)
                .with_identity(&identity)
                .with_duration(le.lease_duration_seconds)
                .with_grace(le.renew_grace_seconds)
                .build()
                .await
                .with_context(|| {
                    format!("leaderElection: failed to use Lease {namespace}/{name}")
                })?;
            let (mut held, manager) = manager.watch().await;
            tokio::select! {
                led = wait_held(&mut held) => {
                    led?;
                    return Ok(Leadership {
                        held,
                        manager: Some(manager),
                        _always: None,
                    });
                }
                () = handed_back(&leases, &name) => {
                    // The lease manager sleeps until the end of the term it last saw; a new one
                    // finds the Lease free and takes it now.
                    manager.abort();
                    tracing::info!(lease = %format!("{namespace}/{name}"), "the leader handed the Lease back; taking it");
                }
            }
        }
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
