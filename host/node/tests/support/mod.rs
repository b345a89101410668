//! What the node's integration tests share: the three cloud simulators with fast timings, and
//! the real provider adapters pointed at them.

#![allow(dead_code)] // each test binary uses a different part

use std::sync::Arc;

use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};
use neocloud_providers::{
    ApiKey, HttpConfig, LambdaConfig, LambdaProvider, RunpodConfig, RunpodProvider, VastConfig,
    VastProvider,
};

/// RunPod, Lambda and Vast simulators whose instances change state within milliseconds.
pub async fn fast_sims() -> CloudSim {
    CloudSim::start(CloudSimConfig {
        runpod: SimConfig::fast(),
        lambda: SimConfig::fast(),
        vast: SimConfig::fast(),
    })
    .await
    .unwrap()
}

/// The adapters, one per simulator.
pub struct SimProviders {
    pub runpod: Arc<RunpodProvider>,
    pub lambda: Arc<LambdaProvider>,
    pub vast: Arc<VastProvider>,
}

/// Adapters for `sims`, with `http` (timeouts and retries) when given.
pub fn sim_providers(sims: &CloudSim, http: Option<HttpConfig>) -> SimProviders {
    let mut runpod = RunpodConfig::new(ApiKey::new(sims.runpod.api_key()));
    runpod.base_url = sims.runpod.base_url();
    let mut lambda = LambdaConfig::new(
        ApiKey::new(sims.lambda.api_key()),
        neocloud_cloudsim::config::DEFAULT_SSH_KEY,
    );
    lambda.base_url = sims.lambda.base_url();
    lambda.launch_interval_ms = 0;
    let mut vast = VastConfig::new(ApiKey::new(sims.vast.api_key()));
    vast.base_url = sims.vast.base_url();
    if let Some(http) = http {
        runpod.http = http.clone();
        lambda.http = http.clone();
        vast.http = http;
    }
    SimProviders {
        runpod: Arc::new(RunpodProvider::new(runpod).unwrap()),
        lambda: Arc::new(LambdaProvider::new(lambda).unwrap()),
        vast: Arc::new(VastProvider::new(vast).unwrap()),
    }
}
