//! The suite against the Vast.ai adapter and its simulator.

use std::sync::Arc;

use async_trait::async_trait;
use neocloud_cloudsim::{FaultKind, FaultRule, OfferConfig, SimConfig, VastSim};
use neocloud_providers::{ApiKey, Provider, VastConfig, VastProvider};
use serde_json::json;

use crate::harness::{self, Cloud, Ledger, Route};

pub struct VastCloud {
    sim: VastSim,
    provider: Arc<dyn Provider>,
}

fn market() -> Vec<OfferConfig> {
    let offer = |id: u64, gpu: &str, mem: u32, region: &str, price: f64| {
        serde_json::from_value(json!({"id": id, "gpu": gpu, "gpu_memory_gb": mem, "region": region,
            "price_per_hour": price, "spot_price_per_hour": price / 2.0, "capacity": 100, "reliability": 0.97}))
        .unwrap()
    };
    vec![
        offer(5_000_001, "GTX 1070", 8, "Oslo, NO", 0.08),
        offer(5_000_002, "RTX 4090", 24, "Austin, US", 0.40),
    ]
}

pub fn adapter(base_url: String, key: &str) -> Arc<dyn Provider> {
    let mut config = VastConfig::new(ApiKey::new(key));
    config.base_url = base_url;
    config.http = harness::http_config();
    Arc::new(VastProvider::new(config).unwrap())
}

pub async fn start() -> Box<dyn Cloud> {
    let config = SimConfig {
        offers: Some(market()),
        ..SimConfig::fast()
    };
    let sim = VastSim::start(config).await.unwrap();
    let provider = adapter(sim.base_url(), sim.api_key());
    Box::new(VastCloud { sim, provider })
}

#[async_trait]
impl Cloud for VastCloud {
    fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
    }
    fn bad_key_provider(&self) -> Arc<dyn Provider> {
        adapter(self.sim.base_url(), "vast_wrong")
    }
    fn arm(&self, route: Route, fault: FaultKind, count: u32) {
        let path = match route {
            Route::Offers => "POST /api/v0/bundles/",
            Route::Create | Route::SpotCreate => "PUT /api/v0/asks/{id}/",
            Route::List => "GET /api/v1/instances/",
            Route::Get => "GET /api/v0/instances/{id}/",
            Route::Delete => "DELETE /api/v0/instances/{id}/",
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
        self.sim.seed_instances(count, prefix);
    }
    fn recovers_inside_create(&self) -> bool {
        true
    }
    fn reports_retry_after(&self) -> bool {
        true
    }
}

crate::conformance!(start, "123");
crate::spot_conformance!(start);
crate::http_conformance!(start);
