//! The suite against the Lambda Cloud adapter and its simulator.

use std::sync::Arc;

use async_trait::async_trait;
use neocloud_cloudsim::{FaultKind, FaultRule, LambdaSim, OfferConfig, SimConfig};
use neocloud_providers::{ApiKey, LambdaConfig, LambdaProvider, Provider};
use serde_json::json;

use crate::harness::{self, Cloud, Ledger, Route};

pub struct LambdaCloud {
    sim: LambdaSim,
    provider: Arc<dyn Provider>,
}

fn market() -> Vec<OfferConfig> {
    vec![
        serde_json::from_value(
            json!({"gpu": "gpu_1x_a10", "gpu_count": 1, "gpu_memory_gb": 24,
            "region": "us-east-1", "price_per_hour": 0.75, "capacity": 100}),
        )
        .unwrap(),
    ]
}

fn adapter(sim: &LambdaSim, key: &str) -> Arc<dyn Provider> {
    let mut config =
        LambdaConfig::new(ApiKey::new(key), neocloud_cloudsim::config::DEFAULT_SSH_KEY);
    config.base_url = sim.base_url();
    config.http = harness::http_config();
    config.launch_interval_ms = 0;
    config.user_data = Some("#cloud-config\nruncmd: [echo hello]\n".into());
    Arc::new(LambdaProvider::new(config).unwrap())
}

pub async fn start() -> Box<dyn Cloud> {
    let config = SimConfig {
        offers: Some(market()),
        ..SimConfig::fast()
    };
    let sim = LambdaSim::start(config).await.unwrap();
    let provider = adapter(&sim, sim.api_key());
    Box::new(LambdaCloud { sim, provider })
}

#[async_trait]
impl Cloud for LambdaCloud {
    fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
    }
    fn bad_key_provider(&self) -> Arc<dyn Provider> {
        adapter(&self.sim, "secret_wrong")
    }
    fn arm(&self, route: Route, fault: FaultKind, count: u32) {
        let path = match route {
            Route::Offers => "GET /api/v1/instance-types",
            Route::Create | Route::SpotCreate => "POST /api/v1/instance-operations/launch",
            Route::List => "GET /api/v1/instances",
            Route::Get => "GET /api/v1/instances/{id}",
            Route::Delete => "POST /api/v1/instance-operations/terminate",
        };
        self.sim.add_fault(FaultRule::next(path, count, fault));
    }
    fn ledger(&self) -> Ledger {
        let entries = self
            .sim
            .ledger()
            .entries
            .into_iter()
            .map(|e| (e.instance_id.clone(), e.name.clone(), e.is_live()))
            .collect();
        Ledger { entries }
    }
    fn preempt(&self, id: &str) -> bool {
        self.sim.preempt(id)
    }
    async fn seed(&self, count: usize, prefix: &str) {
        let offer = harness::cheapest(&*self.provider, &harness::on_demand()).await;
        for n in 0..count {
            self.provider
                .create(&harness::request(&format!("{prefix}{n}"), &offer))
                .await
                .unwrap();
        }
    }
    fn recovers_inside_create(&self) -> bool {
        true
    }
    fn reports_retry_after(&self) -> bool {
        true
    }
}

crate::conformance!(start, "0000000000000000000000000000dead");
crate::http_conformance!(start);
