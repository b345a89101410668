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
pub mod config_reference;
mod kubelet_api;
mod leadership;
mod listener;
mod node;
mod role;
mod startup;
mod supervise;
mod vm;

pub use capacity::{advertised_gpus, bound_gpus, gpus_within_budget};
pub use cluster::IDENTITY_NAMESPACE;
pub use config::{
    FakeSettings, LeaderElection, ProvisioningSettings, ReconcilerSettings, RunConfig,
};
pub use kubelet_api::KubeletApiSettings;
pub use role::LEADER_LABEL;
pub use supervise::{FAULT_VAR, TaskEnded};
pub use vm::RunnerSettings;

pub use startup::providers_from_env;

use leadership::Leadership;

/// Runs the node until it fails, one of its tasks ends, or it loses leadership: starts (see
/// `startup`), waits to lead (`leadership`), starts what the leader runs (`node`), then waits
/// for whichever ends first.
pub async fn run(cfg: RunConfig) -> anyhow::Result<()> {
    // Registered first: in a container the node is PID 1, which the kernel gives no default
    // action for SIGTERM, so without a handler the kubelet's SIGTERM would be ignored until its
    // SIGKILL, and a deleted leader would never hand its Lease back.
    let mut stop = Stop::new()?;
    let mut started = startup::start(&cfg).await?;
    // A standby is ready (healthy and able to take over); the leader once its caches are synced.
    role::standing_by(&started.client).await;
    started.ready.send_replace(true);
    let mut leadership = tokio::select! {
        led = Leadership::acquire(&started.client, &cfg) => led?,
        ended = started.tasks.ended() => return Err(ended.into()),
        signal = stop.requested() => {
            tracing::info!(signal, "stopping before leading");
            started.tasks.stop().await;
            return Ok(());
        }
    };
    started.ready.send_replace(false);
    tracing::info!(node = %cfg.node.name, cluster = %started.cluster, providers = ?started.ids, "leading; starting the node");
    role::leading(&started.client).await;
    node::lead(&cfg, &mut started).await?;
    let mut tasks = started.tasks;
    let outcome = tokio::select! {
        () = leadership.lost() => {
            return Err(anyhow::anyhow!("lost leadership of node {}; exiting so a replica can take over", cfg.node.name));
        }
        ended = tasks.ended() => Err(ended.into()),
        signal = stop.requested() => {
            tracing::info!(signal, "stopping; handing the Lease back");
            Ok(())
        }
    };
    tasks.stop().await;
    leadership.release().await;
    outcome
}

/// Resolves at SIGTERM or SIGINT, for commands other than `run` (the relay), which in a
/// container are PID 1 and would otherwise ignore the kubelet's SIGTERM.
pub async fn terminated() {
    match Stop::new() {
        Ok(mut stop) => {
            let signal = stop.requested().await;
            tracing::info!(signal, "stopping");
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGTERM; running until killed");
            std::future::pending::<()>().await;
        }
    }
}

/// SIGTERM (what the kubelet sends a deleted Pod) or SIGINT (Ctrl-C).
struct Stop {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Stop {
    fn new() -> anyhow::Result<Stop> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Stop {
            term: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Returns the signal's name once one arrives.
    async fn requested(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}
