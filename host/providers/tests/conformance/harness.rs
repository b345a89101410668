//! What the suite needs from each cloud under test: the adapter, a way to inject a fault on one
//! kind of route, the billing ledger, preemption, and seeding many instances.
//!
//! Not assertions: those live in `suite`, written once for every cloud.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use neocloud_cloudsim::FaultKind;
use neocloud_core::{CapacityType, Offer, OfferQuery, WorkloadSpec};
use neocloud_providers::{CreateRequest, HttpConfig, Provider};

/// The kinds of route a fault can be armed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Offer search.
    Offers,
    /// On-demand create.
    Create,
    /// Spot create (RunPod: GraphQL).
    SpotCreate,
    /// The instance list used for lookups by name.
    List,
    /// Get one instance.
    Get,
    /// Delete one instance.
    Delete,
}

/// The ledger reduced to what the suite checks.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// (instance id, name, live) for every instance ever created.
    pub entries: Vec<(String, String, bool)>,
}

impl Ledger {
    /// Live instances carrying `name`.
    pub fn live_named(&self, name: &str) -> usize {
        self.entries
            .iter()
            .filter(|(_, n, live)| *live && n == name)
            .count()
    }

    /// Live instances in total.
    pub fn live(&self) -> usize {
        self.entries.iter().filter(|(_, _, live)| *live).count()
    }
}

/// One cloud under test.
#[async_trait]
pub trait Cloud: Send + Sync {
    /// The adapter.
    fn provider(&self) -> Arc<dyn Provider>;
    /// An adapter with a wrong key (the fake: one whose credentials are refused).
    fn bad_key_provider(&self) -> Arc<dyn Provider>;
    /// Makes the next `count` requests to `route` fail with `fault`.
    fn arm(&self, route: Route, fault: FaultKind, count: u32);
    /// The billing ledger now.
    fn ledger(&self) -> Ledger;
    /// Preempts an instance the provider's way.
    fn preempt(&self, id: &str) -> bool;
    /// Creates `count` instances named `{prefix}{n}`.
    async fn seed(&self, count: usize, prefix: &str);
    /// Whether create itself recovers a lost answer (HTTP adapters) rather than reporting it.
    fn recovers_inside_create(&self) -> bool;
    /// Whether a 429 carries the provider's Retry-After.
    fn reports_retry_after(&self) -> bool;
}

/// The HTTP budget every adapter under test gets: short, so faults are quick.
pub fn http_config() -> HttpConfig {
    HttpConfig {
        timeout_ms: SLOW_TIMEOUT_MS,
        connect_timeout_ms: 1_000,
        max_attempts: 3,
        backoff_ms: 20,
        max_retry_wait_ms: 50,
        ..HttpConfig::default()
    }
}

/// The client timeout of every adapter under test.
pub const SLOW_TIMEOUT_MS: u64 = 2_000;

/// A delay longer than the client timeout.
pub const SLOW_DELAY: Duration = Duration::from_millis(3_000);

/// Any single GPU, on demand.
pub fn on_demand() -> OfferQuery {
    OfferQuery {
        gpu_models: vec![],
        gpu_count: 1,
        capacity: Some(CapacityType::OnDemand),
    }
}

/// Any single GPU, spot.
pub fn spot() -> OfferQuery {
    OfferQuery {
        gpu_models: vec![],
        gpu_count: 1,
        capacity: Some(CapacityType::Spot),
    }
}

/// A small workload.
pub fn workload(gpus: u32) -> WorkloadSpec {
    let mut workload = neocloud_fixtures::workload();
    workload.command = vec!["sh".into(), "-c".into()];
    workload.args = vec!["echo hello && sleep 3600".into()];
    workload.gpu.count = gpus;
    workload
}

/// A create request for `offer` under `name`.
pub fn request(name: &str, offer: &Offer) -> CreateRequest {
    CreateRequest {
        external_name: name.to_owned(),
        offer: offer.clone(),
        workload: workload(offer.gpu_count),
        env: vec![("GREETING".into(), "hello".into())],
        bid_per_hour: None,
        boot: None,
        registry_login: None,
    }
}

/// The cheapest offer for `query`.
pub async fn cheapest(provider: &dyn Provider, query: &OfferQuery) -> Offer {
    let offers = provider
        .list_offers(query)
        .await
        .expect("offers are listed");
    offers
        .into_iter()
        .min_by(|a, b| a.rent_price_per_hour().total_cmp(&b.rent_price_per_hour()))
        .expect("the market has an offer for the query")
}
