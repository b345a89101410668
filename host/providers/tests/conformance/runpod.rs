//! The suite against the RunPod adapter and its simulator (REST v2 + GraphQL).

use std::sync::Arc;

use async_trait::async_trait;
use neocloud_cloudsim::{FaultKind, FaultRule, OfferConfig, RunpodSim, SimConfig};
use neocloud_providers::{ApiKey, Provider, RunpodConfig, RunpodProvider};
use serde_json::json;

use crate::harness::{self, Cloud, Ledger, Route};

pub struct RunpodCloud {
    sim: RunpodSim,
    provider: Arc<dyn Provider>,
}

fn market() -> Vec<OfferConfig> {
    let offer = |gpu: &str, dc: &str, cloud: &str, price: f64, spot: f64| {
        serde_json::from_value(
            json!({"gpu": gpu, "gpu_count": 8, "gpu_memory_gb": 48, "region": dc,
            "price_per_hour": price, "spot_price_per_hour": spot, "capacity": 100, "cloud": cloud}),
        )
        .unwrap()
    };
    vec![
        offer("NVIDIA A40", "CA-MTL-1", "SECURE", 0.40, 0.20),
        offer(
            "NVIDIA GeForce RTX 4090",
            "US-TX-3",
            "COMMUNITY",
            0.34,
            0.18,
        ),
    ]
}

fn adapter(sim: &RunpodSim, key: &str) -> Arc<dyn Provider> {
    let mut config = RunpodConfig::new(ApiKey::new(key));
    config.base_url = sim.base_url();
    config.http = harness::http_config();
    Arc::new(RunpodProvider::new(config).unwrap())
}

pub async fn start() -> Box<dyn Cloud> {
    let config = SimConfig {
        offers: Some(market()),
        ..SimConfig::fast()
    };
    let sim = RunpodSim::start(config).await.unwrap();
    let provider = adapter(&sim, sim.api_key());
    Box::new(RunpodCloud { sim, provider })
}

#[async_trait]
impl Cloud for RunpodCloud {
    fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
    }
    fn bad_key_provider(&self) -> Arc<dyn Provider> {
        adapter(&self.sim, "rpa_wrong")
    }
    fn arm(&self, route: Route, fault: FaultKind, count: u32) {
        let path = match route {
            Route::Offers => "GET /v2/catalog/gpus",
            Route::Create => "POST /v2/pods",
            Route::SpotCreate => "POST /graphql",
            Route::List => "GET /v2/pods",
            Route::Get => "GET /v2/pods/{id}",
            Route::Delete => "DELETE /v2/pods/{id}",
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

crate::conformance!(start, "doesnotexist1");
crate::spot_conformance!(start);
crate::http_conformance!(start);

/// RunPod's v2 pods do not say whether they are spot: a stopped on-demand pod must not pass
/// for a reclaim (the adapter asks GraphQL, whose `podType` is `RESERVED` for it).
#[tokio::test]
async fn a_stopped_on_demand_pod_is_no_reclaim() {
    let cloud = start().await;
    let p = cloud.provider();
    let offer = harness::cheapest(&*p, &harness::on_demand()).await;
    let created = p
        .create(&harness::request("nc-stopped", &offer))
        .await
        .unwrap();
    crate::suite::wait_running(&*p, &created.id).await;
    assert!(cloud.preempt(&created.id), "the simulator stops it");
    let seen = p.get(&created.id).await.unwrap().expect("still exists");
    assert_eq!(
        seen.phase,
        neocloud_core::InstancePhase::Stopped,
        "{seen:?}"
    );
    assert!(!seen.reclaimed(), "{seen:?}");
    p.delete(&created.id).await.unwrap();
}
