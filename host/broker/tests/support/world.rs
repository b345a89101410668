//! A renter over three fake providers, and an attempt recorder, for renter tests.

use std::sync::Arc;

use async_trait::async_trait;
use neocloud_broker::{
    AttemptRecorder, BrokerError, BudgetGuard, Catalog, CatalogConfig, CostLedger, Decision,
    DefaultFallback, LadderLimits, Plan, PlanInput, Planner, RentRequest, Rental, Renter, Wait,
};
use neocloud_core::{Attempt, Offer, OfferQuery, ProviderId, WorkloadSpec};
use neocloud_providers::{FakeProvider, Provider};
use parking_lot::Mutex;

use super::{PROVIDERS, now};

#[derive(Debug, Default)]
pub struct Recorder {
    pub attempts: Mutex<Vec<Attempt>>,
    pub decisions: Mutex<Vec<Decision>>,
    pub waits: Mutex<Vec<Wait>>,
    pub fail: bool,
}

#[async_trait]
impl AttemptRecorder for Recorder {
    async fn record(&self, attempt: &Attempt) -> Result<(), String> {
        if self.fail {
            return Err("binding status update conflicted".into());
        }
        self.attempts.lock().push(attempt.clone());
        Ok(())
    }

    async fn decided(&self, decision: &Decision) -> Result<(), String> {
        self.decisions.lock().push(decision.clone());
        Ok(())
    }

    async fn waiting(&self, wait: &Wait) {
        self.waits.lock().push(wait.clone());
    }
}

pub struct World {
    pub renter: Renter,
    pub fakes: Vec<Arc<FakeProvider>>,
}

impl World {
    pub fn new(offers: &[Offer], cap: Option<f64>, limits: LadderLimits) -> World {
        let fakes: Vec<Arc<FakeProvider>> = PROVIDERS
            .iter()
            .map(|p| {
                let fake = Arc::new(FakeProvider::new(*p));
                fake.set_offers(
                    offers
                        .iter()
                        .filter(|o| o.provider == *p)
                        .cloned()
                        .collect(),
                );
                fake
            })
            .collect();
        let providers: Vec<Arc<dyn Provider>> = fakes
            .iter()
            .map(|f| Arc::clone(f) as Arc<dyn Provider>)
            .collect();
        let renter = Renter {
            catalog: Catalog::new(providers, CatalogConfig::default()),
            fallback: Arc::new(DefaultFallback::default()),
            limits,
            budget: BudgetGuard::new(cap),
            ledger: Arc::new(CostLedger::new()),
        };
        World { renter, fakes }
    }

    pub fn fake(&self, id: ProviderId) -> &FakeProvider {
        self.fakes.iter().find(|f| f.id() == id).unwrap()
    }

    pub fn instances(&self) -> usize {
        self.fakes.iter().map(|f| f.instances().len()).sum()
    }

    pub async fn rent(
        &self,
        w: &WorkloadSpec,
        name: &str,
    ) -> (Result<Rental, BrokerError>, Recorder) {
        let view = self
            .renter
            .catalog
            .offers(&OfferQuery::for_workload(w), &[])
            .await;
        let plan = plan(w, &view.offers);
        self.rent_plan(w, name, &plan).await
    }

    /// Rents along a plan made earlier (the market may have moved since).
    pub async fn rent_plan(
        &self,
        w: &WorkloadSpec,
        name: &str,
        plan: &Plan,
    ) -> (Result<Rental, BrokerError>, Recorder) {
        let recorder = Recorder::default();
        let req = RentRequest {
            binding: name,
            external_name: name,
            workload: w,
            env: &[],
            plan,
            history: &[],
            boot: None,
            registry_login: None,
        };
        (self.renter.rent(&req, &recorder).await, recorder)
    }
}

pub fn plan(w: &WorkloadSpec, offers: &[Offer]) -> Plan {
    let input = PlanInput {
        workload: w,
        offers,
        attempts: &[],
        enabled: &[],
        skipped: &[],
        now: now(),
    };
    Planner::default().plan(&input).unwrap()
}
