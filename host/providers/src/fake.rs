//! An in-memory, deterministic cloud for tests and the default deployment: offers you set,
//! capacity per GPU model, injected failures, and instances that keep the Provider contract
//! (idempotent create by name, idempotent delete, paginated listing).
//!
//! It runs nothing: an instance's workload runs until the instance is deleted, or, with a
//! workload run time ([`FakeProvider::set_workload_run_time`]), ends that long after it started
//! with exit code 0, as a command that completed would.
//!
//! Not a simulator of any real API's wire format (that is `neocloud-cloudsim`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use async_trait::async_trait;
use neocloud_core::{
    FailureClass, GpuModel, InstancePhase, InstanceState, Offer, OfferCapacity, OfferQuery,
    ProviderId,
};
use parking_lot::Mutex;

use crate::provider::{CreateRequest, Operation, Provider, ProviderError};

/// How many instances one internal page of `list_ours` holds, so the paging loop is exercised.
const PAGE_SIZE: usize = 3;

/// The fake cloud. Cheap to share behind an `Arc`; every method is safe to call concurrently.
#[derive(Debug)]
pub struct FakeProvider {
    id: ProviderId,
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    offers: Vec<Offer>,
    capacity: HashMap<String, u32>,
    create_failures: VecDeque<FailureClass>,
    list_failures: VecDeque<FailureClass>,
    list_delay: Option<Duration>,
    /// How long each workload runs before it ends with exit code 0; `None`: until deleted.
    workload_run_time: Option<Duration>,
    /// When each instance's workload ends, by instance number (with a run time set).
    ends_at: HashMap<u64, tokio::time::Instant>,
    healthy: bool,
    instances: BTreeMap<u64, InstanceState>,
    next_id: u64,
    calls: FakeCalls,
}

/// How often each method was called, for tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FakeCalls {
    /// `list_offers` calls.
    pub list_offers: u32,
    /// `create` calls (including ones that failed or returned an existing instance).
    pub create: u32,
    /// `delete` calls.
    pub delete: u32,
}

impl FakeProvider {
    /// A healthy fake named `id` with no offers and unlimited capacity.
    pub fn new(id: ProviderId) -> FakeProvider {
        let state = FakeState {
            healthy: true,
            next_id: 1,
            ..FakeState::default()
        };
        FakeProvider {
            id,
            state: Mutex::new(state),
        }
    }

    /// The fake that `provider: fake` deployments and `provider smoke --provider fake` use: a
    /// healthy fake named `fake` offering an A40, an A10 and a GTX 1070 on demand and the
    /// GTX 1070 as spot, all in region `fake-1`.
    pub fn sample_market() -> FakeProvider {
        let fake = FakeProvider::new(ProviderId::Fake);
        let offer = |id: &str, gpu: &str, price: f64, capacity| Offer {
            provider: ProviderId::Fake,
            id: id.to_owned(),
            gpu: GpuModel::from_provider(gpu, None),
            gpu_count: 1,
            price_per_hour: price,
            capacity,
            region: "fake-1".to_owned(),
            reliability: Some(0.99),
            verified: true,
            disk_gib: Some(100),
            machine_id: None,
            runpod_cloud: None,
            expires_at: None,
        };
        let spot = OfferCapacity::Spot {
            min_bid_per_hour: 0.05,
        };
        fake.set_offers(vec![
            offer("fake-a40", "A40", 0.40, OfferCapacity::OnDemand),
            offer("fake-a10", "A10", 0.60, OfferCapacity::OnDemand),
            offer("fake-gtx1070", "GTX 1070", 0.08, OfferCapacity::OnDemand),
            offer("fake-gtx1070-spot", "GTX 1070", 0.05, spot),
        ]);
        fake
    }

    /// Replaces the offers `list_offers` returns (and `create` accepts).
    pub fn set_offers(&self, offers: Vec<Offer>) {
        self.state.lock().offers = offers;
    }

    /// Changes one offer's price, as a market would between planning and renting.
    pub fn set_price(&self, offer_id: &str, price_per_hour: f64) {
        let mut state = self.state.lock();
        for offer in state.offers.iter_mut().filter(|o| o.id == offer_id) {
            offer.price_per_hour = price_per_hour;
        }
    }

    /// Limits how many more instances of a GPU model (canonical name) can be created; a model
    /// never limited has unlimited capacity.
    pub fn set_capacity(&self, gpu_model: &str, instances: u32) {
        self.state
            .lock()
            .capacity
            .insert(gpu_model.to_owned(), instances);
    }

    /// Makes the next `create` fail with `class`. Queued failures are used in order. A `Timeout`
    /// really creates the instance and then loses the answer, like a dropped response.
    pub fn fail_next_create(&self, class: FailureClass) {
        self.state.lock().create_failures.push_back(class);
    }

    /// Makes the next `list_offers` fail with `class`.
    pub fn fail_next_list_offers(&self, class: FailureClass) {
        self.state.lock().list_failures.push_back(class);
    }

    /// Makes every `list_offers` take this long (tokio time), to test concurrency and staleness.
    pub fn set_list_delay(&self, delay: Option<Duration>) {
        self.state.lock().list_delay = delay;
    }

    /// Makes the workload of every instance created from now on end `run_time` after it
    /// started, with exit code 0: the instance is then `Stopped` with that exit code, as a
    /// cloud reports a container whose command completed. `None` (the default): workloads run
    /// until their instance is deleted.
    pub fn set_workload_run_time(&self, run_time: Option<Duration>) {
        self.state.lock().workload_run_time = run_time;
    }

    /// Makes `health` fail with an auth error when `false`.
    pub fn set_healthy(&self, healthy: bool) {
        self.state.lock().healthy = healthy;
    }

    /// Sets an instance's phase (e.g. `Stopped` for a spot eviction). Returns whether it exists.
    pub fn set_phase(&self, id: &str, phase: InstancePhase) -> bool {
        let mut state = self.state.lock();
        let found = parse_id(id).and_then(|n| state.instances.get_mut(&n));
        found.map(|i| i.phase = phase).is_some()
    }

    /// Every live instance, oldest first.
    pub fn instances(&self) -> Vec<InstanceState> {
        self.state.lock().instances.values().cloned().collect()
    }

    /// Call counters.
    pub fn calls(&self) -> FakeCalls {
        self.state.lock().calls
    }

    fn error(
        &self,
        op: Operation,
        class: FailureClass,
        message: impl Into<String>,
    ) -> ProviderError {
        ProviderError::new(self.id, op, class, message)
    }
}

fn parse_id(id: &str) -> Option<u64> {
    id.rsplit('-').next()?.parse().ok()
}

fn matches_query(offer: &Offer, q: &OfferQuery) -> bool {
    let model_ok = q.gpu_models.is_empty() || q.gpu_models.iter().any(|m| m == offer.gpu.name());
    let count_ok = q.gpu_count == 0 || offer.gpu_count == q.gpu_count;
    model_ok && count_ok
}

impl FakeState {
    fn find_live(&self, name: &str) -> Option<&InstanceState> {
        self.instances
            .values()
            .find(|i| i.external_name == name && !i.phase.is_terminal())
    }

    fn insert(&mut self, provider: ProviderId, request: &CreateRequest) -> InstanceState {
        let n = self.next_id;
        self.next_id += 1;
        let offer = &request.offer;
        let instance = InstanceState {
            provider,
            id: format!("{provider}-{n}"),
            external_name: request.external_name.clone(),
            phase: InstancePhase::Running,
            provider_status: "running".to_owned(),
            message: None,
            gpu: offer.gpu.clone(),
            gpu_count: offer.gpu_count,
            price_per_hour: request.bid_per_hour.unwrap_or(offer.price_per_hour),
            region: offer.region.clone(),
            endpoints: Vec::new(),
            public_ip: None,
            created_at: None,
            interruptible: offer.capacity.is_spot() || request.bid_per_hour.is_some(),
            exit_code: None,
            ready: None,
        };
        self.instances.insert(n, instance.clone());
        if let Some(run_time) = self.workload_run_time {
            self.ends_at
                .insert(n, tokio::time::Instant::now() + run_time);
        }
        instance
    }

    /// Ends the workloads whose run time has passed: their instances stop with exit code 0.
    fn end_workloads(&mut self) {
        if self.ends_at.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        let ended: Vec<u64> = self
            .ends_at
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(n, _)| *n)
            .collect();
        for n in ended {
            self.ends_at.remove(&n);
            if let Some(instance) = self.instances.get_mut(&n)
                && instance.phase == InstancePhase::Running
            {
                instance.phase = InstancePhase::Stopped;
                instance.provider_status = "exited".to_owned();
                instance.exit_code = Some(0);
            }
        }
    }

    /// One page of our instances after id `after`.
    fn page(&self, prefix: &str, after: u64) -> (Vec<InstanceState>, Option<u64>) {
        let mut items: Vec<(u64, InstanceState)> = self
            .instances
            .range(after + 1..)
            .filter(|(_, i)| i.external_name.starts_with(prefix) && !i.phase.is_terminal())
            .take(PAGE_SIZE + 1)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let next = (items.len() > PAGE_SIZE).then(|| items[PAGE_SIZE - 1].0);
        items.truncate(PAGE_SIZE);
        (items.into_iter().map(|(_, v)| v).collect(), next)
    }
}

#[async_trait]
impl Provider for FakeProvider {
    fn id(&self) -> ProviderId {
        self.id
    }

    async fn list_offers(&self, query: &OfferQuery) -> Result<Vec<Offer>, ProviderError> {
        let delay = self.state.lock().list_delay;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let mut state = self.state.lock();
        state.calls.list_offers += 1;
        if let Some(class) = state.list_failures.pop_front() {
            return Err(self
                .error(Operation::ListOffers, class, "injected failure")
                .with_code("fake-injected"));
        }
        Ok(state
            .offers
            .iter()
            .filter(|o| matches_query(o, query))
            .cloned()
            .collect())
    }

    async fn create(&self, request: &CreateRequest) -> Result<InstanceState, ProviderError> {
        let name = &request.external_name;
        let mut state = self.state.lock();
        state.calls.create += 1;
        if let Some(existing) = state.find_live(name) {
            return Ok(existing.clone());
        }
        let err = |class, message: String| {
            self.error(Operation::Create, class, message)
                .with_subject(name.clone())
        };
        if let Some(class) = state.create_failures.pop_front() {
            if class == FailureClass::Timeout {
                state.insert(self.id, request);
            }
            return Err(err(class, "injected failure".to_owned()).with_code("fake-injected"));
        }
        let offer_id = &request.offer.id;
        let Some(offer) = state.offers.iter().find(|o| &o.id == offer_id) else {
            return Err(err(
                FailureClass::Capacity,
                format!("offer {offer_id} no longer available"),
            ));
        };
        let model = offer.gpu.name().to_owned();
        if let Some(left) = state.capacity.get_mut(&model) {
            if *left == 0 {
                return Err(err(
                    FailureClass::Capacity,
                    format!("no {model} capacity left for offer {offer_id}"),
                ));
            }
            *left -= 1;
        }
        Ok(state.insert(self.id, request))
    }

    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError> {
        let mut state = self.state.lock();
        state.end_workloads();
        Ok(parse_id(id)
            .and_then(|n| state.instances.get(&n))
            .filter(|i| i.id == id)
            .cloned())
    }

    async fn find_by_name(
        &self,
        external_name: &str,
    ) -> Result<Option<InstanceState>, ProviderError> {
        let mut state = self.state.lock();
        state.end_workloads();
        Ok(state.find_live(external_name).cloned())
    }

    async fn list_ours(&self, prefix: &str) -> Result<Vec<InstanceState>, ProviderError> {
        let mut all = Vec::new();
        let mut after = 0;
        self.state.lock().end_workloads();
        loop {
            let (page, next) = self.state.lock().page(prefix, after);
            all.extend(page);
            match next {
                Some(n) => after = n,
                None => return Ok(all),
            }
        }
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let mut state = self.state.lock();
        state.calls.delete += 1;
        let Some(n) = parse_id(id) else { return Ok(()) };
        state.ends_at.remove(&n);
        if let Some(instance) = state.instances.remove(&n)
            && let Some(left) = state.capacity.get_mut(instance.gpu.name())
        {
            *left += 1;
        }
        Ok(())
    }

    async fn health(&self) -> Result<(), ProviderError> {
        if self.state.lock().healthy {
            Ok(())
        } else {
            Err(self
                .error(Operation::Health, FailureClass::Auth, "credentials refused")
                .with_code("fake-unhealthy"))
        }
    }
}
