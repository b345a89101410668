//! [`CloudSim`]: the three simulators started together from one [`CloudSimConfig`], and
//! [`serve`], which `neocloud-cloudsim --config FILE` calls to run them until Ctrl-C.
//!
//! Not a proxy: each simulator keeps its own port, market, ledger and faults.

use crate::config::CloudSimConfig;
use crate::error::SimError;
use crate::lambda::LambdaSim;
use crate::ledger::LedgerReport;
use crate::runpod::RunpodSim;
use crate::vast::VastSim;

/// All three simulators.
#[derive(Debug)]
pub struct CloudSim {
    /// RunPod (REST v2 + GraphQL).
    pub runpod: RunpodSim,
    /// Lambda Cloud.
    pub lambda: LambdaSim,
    /// Vast.ai.
    pub vast: VastSim,
}

impl CloudSim {
    /// Starts the three simulators.
    pub async fn start(config: CloudSimConfig) -> Result<Self, SimError> {
        let ports = [config.runpod.port, config.lambda.port, config.vast.port];
        let fixed: Vec<u16> = ports.into_iter().filter(|p| *p != 0).collect();
        if (1..fixed.len()).any(|i| fixed[..i].contains(&fixed[i])) {
            return Err(SimError::InvalidConfig(format!(
                "two simulators share a port: {ports:?}"
            )));
        }
        Ok(Self {
            runpod: RunpodSim::start(config.runpod).await?,
            lambda: LambdaSim::start(config.lambda).await?,
            vast: VastSim::start(config.vast).await?,
        })
    }

    /// The three ledgers, concatenated (each entry names its provider).
    pub fn ledger(&self) -> LedgerReport {
        let mut entries = self.runpod.ledger().entries;
        entries.extend(self.lambda.ledger().entries);
        entries.extend(self.vast.ledger().entries);
        LedgerReport { entries }
    }
}

/// Starts the simulators, logs their base URLs, and serves until Ctrl-C or SIGTERM (how
/// `make run-local` stops it); either drops them, and with them the runners they started and
/// whatever those run.
pub async fn serve(config: CloudSimConfig) -> Result<(), SimError> {
    let sim = CloudSim::start(config).await?;
    tracing::info!(
        runpod = %sim.runpod.base_url(),
        lambda = %sim.lambda.base_url(),
        vast = %sim.vast.base_url(),
        "cloud simulators ready"
    );
    let mut terminate = match tokio::signal::unix::signal(
        tokio::signal::unix::SignalKind::terminate(),
    ) {
        Ok(signal) => Some(signal),
        Err(error) => {
            tracing::warn!(%error, "failed to listen for SIGTERM; only ctrl-c stops the simulators");
            None
        }
    };
    let term = async {
        match terminate.as_mut() {
            Some(signal) => signal.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        stopped = tokio::signal::ctrl_c() => if let Err(error) = stopped {
            tracing::warn!(%error, "failed to wait for ctrl-c; stopping simulators");
        },
        _ = term => tracing::info!("SIGTERM; stopping the simulators"),
    }
    drop(sim);
    Ok(())
}
