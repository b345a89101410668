//! The `provider smoke` command's logic (`host/node/src/cli/smoke.rs`, compiled here because it only
//! needs this crate) against each simulator with the specification's defaults, as CI runs it,
//! plus the Lambda A10 → A100 fallback, the RunPod capacity-classification check, and a provider
//! that leaves an instance behind.

#[path = "../../../node/src/cli/smoke.rs"]
#[allow(dead_code)]
mod smoke;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use neocloud_cloudsim::{
    FaultKind, FaultRule, LambdaSim, OfferConfig, RunpodSim, SimConfig, VastSim,
};
use neocloud_core::{CapacityType, InstanceState, Offer, OfferQuery, ProviderId, RunpodCloudType};
use neocloud_providers::{
    ApiKey, CreateRequest, LambdaConfig, LambdaProvider, Provider, ProviderError, RunpodConfig,
    RunpodProvider, VastConfig, VastProvider,
};
use smoke::{SmokeOptions, run_smoke};

fn options(provider: ProviderId) -> SmokeOptions {
    let mut opts = SmokeOptions::defaults_for(provider);
    opts.name = format!("nc-smoke-{provider}");
    opts.poll_interval = Duration::from_millis(50);
    opts.ready_timeout = Duration::from_secs(10);
    opts
}

fn runpod(sim: &RunpodSim) -> RunpodProvider {
    let mut config = RunpodConfig::new(ApiKey::new(sim.api_key()));
    config.base_url = sim.base_url();
    RunpodProvider::new(config).unwrap()
}

fn lambda(sim: &LambdaSim) -> LambdaProvider {
    let mut config = LambdaConfig::new(
        ApiKey::new(sim.api_key()),
        neocloud_cloudsim::config::DEFAULT_SSH_KEY,
    );
    config.base_url = sim.base_url();
    config.launch_interval_ms = 0;
    LambdaProvider::new(config).unwrap()
}

#[tokio::test]
async fn the_smoke_test_passes_against_the_runpod_simulator_and_leaves_nothing() {
    let sim = RunpodSim::start(SimConfig::fast()).await.unwrap();
    let report = run_smoke(&runpod(&sim), &options(ProviderId::Runpod))
        .await
        .unwrap();
    assert_eq!(report.offer.unwrap().gpu.name(), "A40");
    assert!(sim.ledger().live().is_empty());
    assert_eq!(sim.ledger().named("nc-smoke-runpod").len(), 1);
}

#[tokio::test]
async fn the_smoke_test_passes_against_the_vast_simulator_with_the_specification_defaults() {
    let sim = VastSim::start(SimConfig::fast()).await.unwrap();
    let mut config = VastConfig::new(ApiKey::new(sim.api_key()));
    config.base_url = sim.base_url();
    let report = run_smoke(
        &VastProvider::new(config).unwrap(),
        &options(ProviderId::Vast),
    )
    .await
    .unwrap();
    let offer = report.offer.unwrap();
    assert_eq!(offer.gpu.name(), "GTX 1070");
    assert!(offer.price_per_hour <= 0.10 && offer.reliability.unwrap() >= 0.95 && offer.verified);
    assert!(sim.ledger().live().is_empty());
}

#[tokio::test]
async fn the_lambda_smoke_test_falls_back_to_an_a100_only_when_a10s_have_no_capacity() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    let launch = "POST /api/v1/instance-operations/launch";
    sim.add_fault(FaultRule::next(launch, 2, FaultKind::CapacityExhausted));
    let report = run_smoke(&lambda(&sim), &options(ProviderId::Lambda))
        .await
        .unwrap();
    assert_eq!(
        report.capacity_refusals.len(),
        2,
        "both A10 regions refused: {report:?}"
    );
    assert!(report.offer.unwrap().id.starts_with("gpu_1x_a100"));
    assert!(sim.ledger().live().is_empty());
}

#[tokio::test]
async fn the_lambda_smoke_test_rents_an_a10_when_there_is_capacity() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    let report = run_smoke(&lambda(&sim), &options(ProviderId::Lambda))
        .await
        .unwrap();
    assert_eq!(report.offer.unwrap().gpu.name(), "A10");
    assert!(report.capacity_refusals.is_empty());
}

#[tokio::test]
async fn the_runpod_capacity_check_accepts_a_refusal_classified_as_capacity() {
    let a40: OfferConfig = serde_json::from_value(serde_json::json!({"gpu": "NVIDIA A40", "gpu_count": 8,
        "gpu_memory_gb": 48, "region": "US-TX-3", "price_per_hour": 0.35, "spot_price_per_hour": 0.2,
        "capacity": 4, "cloud": "COMMUNITY"}))
    .unwrap();
    let sim = RunpodSim::start(SimConfig {
        offers: Some(vec![a40]),
        ..SimConfig::fast()
    })
    .await
    .unwrap();
    sim.add_fault(FaultRule::next(
        "POST /graphql",
        5,
        FaultKind::CapacityExhausted,
    ));
    let mut opts = options(ProviderId::Runpod);
    (
        opts.capacity,
        opts.runpod_cloud,
        opts.accept_capacity_refusal,
    ) = (CapacityType::Spot, Some(RunpodCloudType::Community), true);
    let report = run_smoke(&runpod(&sim), &opts).await.unwrap();
    assert!(report.instance_id.is_none());
    assert_eq!(report.capacity_refusals.len(), 1, "{report:?}");
    opts.accept_capacity_refusal = false;
    sim.add_fault(FaultRule::next(
        "POST /graphql",
        5,
        FaultKind::CapacityExhausted,
    ));
    assert!(run_smoke(&runpod(&sim), &opts).await.is_err());
}

#[tokio::test]
async fn the_smoke_test_passes_against_the_fake() {
    let provider = smoke::provider_from_env(ProviderId::Fake, &options(ProviderId::Fake)).unwrap();
    let report = run_smoke(&*provider, &options(ProviderId::Fake))
        .await
        .unwrap();
    assert!(report.steps.iter().any(|(step, _)| *step == "delete"));
    assert!(provider.list_ours("nc-smoke").await.unwrap().is_empty());
}

/// A provider whose delete says yes and does nothing.
#[derive(Debug)]
struct DeleteDoesNothing(Arc<dyn Provider>);

#[async_trait]
impl Provider for DeleteDoesNothing {
    fn id(&self) -> ProviderId {
        self.0.id()
    }
    async fn list_offers(&self, q: &OfferQuery) -> Result<Vec<Offer>, ProviderError> {
        self.0.list_offers(q).await
    }
    async fn create(&self, r: &CreateRequest) -> Result<InstanceState, ProviderError> {
        self.0.create(r).await
    }
    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError> {
        self.0.get(id).await
    }
    async fn find_by_name(&self, n: &str) -> Result<Option<InstanceState>, ProviderError> {
        self.0.find_by_name(n).await
    }
    async fn list_ours(&self, p: &str) -> Result<Vec<InstanceState>, ProviderError> {
        self.0.list_ours(p).await
    }
    async fn delete(&self, _id: &str) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn health(&self) -> Result<(), ProviderError> {
        self.0.health().await
    }
}

#[tokio::test]
async fn an_instance_left_behind_fails_the_smoke_test_and_is_named() {
    let fake = smoke::provider_from_env(ProviderId::Fake, &options(ProviderId::Fake)).unwrap();
    let mut opts = options(ProviderId::Fake);
    opts.ready_timeout = Duration::from_millis(300);
    let error = run_smoke(&DeleteDoesNothing(fake.clone()), &opts)
        .await
        .expect_err("a leftover is an error");
    let text = format!("{error:#}");
    assert!(
        text.contains("still exists after delete") && text.contains("leftovers: [\"fake-1\"]"),
        "{text}"
    );
}
