//! The price guarantee under moving prices: nothing is rented above the Pod's max price.

mod support;

use neocloud_broker::{LadderLimits, RentRequest};
use neocloud_core::{FailureClass, Offer, ProviderId};
use proptest::prelude::*;
use support::world::{Recorder, World, plan};
use support::{offer, workload};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Prices move between planning and renting; whatever happens, nothing is rented above
    /// the Pod's max price.
    #[test]
    fn no_rental_is_above_the_max_price_even_when_prices_move(
        prices in prop::collection::vec(10u32..300, 1..12),
        moves in prop::collection::vec(prop::option::of(10u32..400), 1..12),
        max_cents in 50u32..250,
        failures in prop::collection::vec(0usize..FailureClass::ALL.len(), 0..4),
    ) {
        runtime().block_on(async {
            let offers: Vec<Offer> = prices.iter().enumerate()
                .map(|(i, c)| offer(support::PROVIDERS[i % 3], &format!("o{i}"), "A40", f64::from(*c) / 100.0))
                .collect();
            let world = World::new(&offers, None, LadderLimits::default());
            let mut w = workload();
            let max = f64::from(max_cents) / 100.0;
            w.max_price_per_hour = Some(max);
            let plan = plan(&w, &offers);
            for (o, m) in offers.iter().zip(moves.iter().cycle()) {
                if let Some(c) = m {
                    world.fake(o.provider).set_price(&o.id, f64::from(*c) / 100.0);
                }
            }
            for f in &failures {
                world.fake(ProviderId::Vast).fail_next_create(FailureClass::ALL[*f]);
            }
            let recorder = Recorder::default();
            let req = RentRequest { binding: "b", external_name: "nc-1", workload: &w, env: &[], plan: &plan, history: &[], boot: None, registry_login: None };
            if let Ok(rental) = world.renter.rent(&req, &recorder).await {
                assert!(rental.instance.price_per_hour <= max, "rented at {} above {max}", rental.instance.price_per_hour);
            }
            for f in &world.fakes {
                for i in f.instances() {
                    assert!(i.price_per_hour <= max, "instance at {} above {max}", i.price_per_hour);
                }
            }
            assert!(world.instances() <= 1, "more than one instance for one workload");
        });
    }
}

/// Vast.ai lists one ask twice under one id: on-demand, and as spot with a minimum bid. A Pod
/// planned onto the spot listing is rented as spot at the bid, never on-demand at the full
/// price because the fresh listing of the same id was looked up by id alone.
#[tokio::test(start_paused = true)]
async fn a_spot_listing_sharing_an_id_with_an_on_demand_one_is_rented_as_spot() {
    let on_demand = offer(ProviderId::Vast, "ask-7", "A40", 0.50);
    let spot = Offer {
        capacity: neocloud_core::OfferCapacity::Spot {
            min_bid_per_hour: 0.20,
        },
        ..on_demand.clone()
    };
    let offers = [on_demand, spot];
    let world = World::new(&offers, None, LadderLimits::default());
    let mut w = workload();
    w.capacity_type = neocloud_core::CapacityType::Any;
    let (rental, _) = world.rent(&w, "nc-spot").await;
    let rental = rental.unwrap();
    assert!(rental.instance.interruptible, "{:?}", rental.instance);
    assert_eq!(rental.instance.price_per_hour, 0.20);
}
