//! The suite against the in-memory fake: the same contract without HTTP. Simulator faults are
//! translated into the fake's injected failure classes.

use std::sync::Arc;

use async_trait::async_trait;
use neocloud_cloudsim::FaultKind;
use neocloud_core::{FailureClass, InstancePhase, Offer, OfferCapacity, ProviderId};
use neocloud_providers::{FakeProvider, Provider};

use crate::harness::{self, Cloud, Ledger, Route};

pub struct FakeCloud {
    fake: Arc<FakeProvider>,
}

fn offer(id: &str, capacity: OfferCapacity, price: f64) -> Offer {
    Offer {
        capacity,
        region: "fake-1".into(),
        ..neocloud_fixtures::offer(ProviderId::Fake, id, "A40", price)
    }
}

pub async fn start() -> Box<dyn Cloud> {
    let fake = FakeProvider::new(ProviderId::Fake);
    let spot = OfferCapacity::Spot {
        min_bid_per_hour: 0.2,
    };
    fake.set_offers(vec![
        offer("a40-od", OfferCapacity::OnDemand, 0.4),
        offer("a40-spot", spot, 0.2),
    ]);
    Box::new(FakeCloud {
        fake: Arc::new(fake),
    })
}

#[async_trait]
impl Cloud for FakeCloud {
    fn provider(&self) -> Arc<dyn Provider> {
        self.fake.clone()
    }
    fn bad_key_provider(&self) -> Arc<dyn Provider> {
        let refused = FakeProvider::new(ProviderId::Fake);
        refused.set_healthy(false);
        Arc::new(refused)
    }
    fn arm(&self, route: Route, fault: FaultKind, count: u32) {
        assert!(
            matches!(route, Route::Create | Route::SpotCreate),
            "the fake injects create faults only"
        );
        let class = match fault {
            FaultKind::CapacityExhausted | FaultKind::OfferVanishes => FailureClass::Capacity,
            FaultKind::RateLimited { .. } => FailureClass::RateLimited,
            FaultKind::ServerError { .. } => FailureClass::Transient,
            FaultKind::LostResponse
            | FaultKind::ErrorAfterCreate { .. }
            | FaultKind::Slow { .. } => FailureClass::Timeout,
            FaultKind::BidTooLow => FailureClass::PriceExceeded,
        };
        let times = if class == FailureClass::Timeout {
            1
        } else {
            count.min(1)
        };
        for _ in 0..times {
            self.fake.fail_next_create(class);
        }
    }
    fn ledger(&self) -> Ledger {
        let entries = self
            .fake
            .instances()
            .into_iter()
            .map(|i| (i.id, i.external_name, true))
            .collect();
        Ledger { entries }
    }
    fn preempt(&self, id: &str) -> bool {
        self.fake.set_phase(id, InstancePhase::Stopped)
    }
    async fn seed(&self, count: usize, prefix: &str) {
        let offer = harness::cheapest(&*self.fake, &harness::on_demand()).await;
        for n in 0..count {
            self.fake
                .create(&harness::request(&format!("{prefix}{n}"), &offer))
                .await
                .unwrap();
        }
    }
    fn recovers_inside_create(&self) -> bool {
        false
    }
    fn reports_retry_after(&self) -> bool {
        false
    }
}

crate::conformance!(start, "fake-999");
crate::spot_conformance!(start);
