//! The renter against fake providers: the default fallback ladder (capacity, quota, rate limits,
//! transient failures, invalid requests, lost answers), the fresh price check, the budget, and
//! attempt recording.

mod support;

use std::sync::Arc;
use std::time::Duration;

use neocloud_broker::{BrokerError, DefaultFallback, LadderLimits, RentRequest};
use neocloud_core::{Attempt, AttemptOutcome, FailureClass, Offer, ProviderId};
use support::world::{Recorder, World, plan};
use support::{offer, workload};

fn outcomes(attempts: &[Attempt]) -> Vec<(String, Option<FailureClass>)> {
    attempts
        .iter()
        .map(|a| (a.offer_id.clone(), a.failure()))
        .collect()
}

fn gave_up(result: Result<neocloud_broker::Rental, BrokerError>) -> (String, Vec<Attempt>) {
    match result {
        Err(BrokerError::GaveUp {
            reason, attempts, ..
        }) => (reason, attempts),
        other => panic!("expected the ladder to give up, got {other:?}"),
    }
}

const V: ProviderId = ProviderId::Vast;
const R: ProviderId = ProviderId::Runpod;

#[tokio::test(start_paused = true)]
async fn a_capacity_failure_moves_to_the_next_offer() {
    let world = World::new(
        &[offer(V, "cheap", "A40", 0.4), offer(R, "next", "L4", 0.5)],
        None,
        LadderLimits::default(),
    );
    world.fake(V).set_capacity("A40", 0);
    let (rental, recorder) = world.rent(&workload(), "nc-1").await;
    let rental = rental.unwrap();
    assert_eq!(
        outcomes(&rental.attempts),
        vec![
            ("cheap".into(), Some(FailureClass::Capacity)),
            ("next".into(), None)
        ]
    );
    assert_eq!(rental.instance.provider, R);
    let recorded: Vec<bool> = recorder
        .attempts
        .lock()
        .iter()
        .map(|a| a.outcome == AttemptOutcome::InFlight)
        .collect();
    assert_eq!(
        recorded,
        vec![true, false, true, false],
        "each create is recorded before and after"
    );
}

#[tokio::test(start_paused = true)]
async fn a_quota_failure_skips_every_offer_of_that_provider() {
    let offers = vec![
        offer(V, "v1", "A40", 0.3),
        offer(V, "v2", "A40", 0.4),
        offer(R, "r1", "A40", 0.5),
    ];
    let world = World::new(&offers, None, LadderLimits::default());
    world.fake(V).fail_next_create(FailureClass::Quota);
    let rental = world.rent(&workload(), "nc-1").await.0.unwrap();
    assert_eq!(
        outcomes(&rental.attempts),
        vec![
            ("v1".into(), Some(FailureClass::Quota)),
            ("r1".into(), None)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_rate_limited_create_waits_and_retries_the_same_offer() {
    let world = World::new(
        &[offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)],
        None,
        LadderLimits::default(),
    );
    world.fake(V).fail_next_create(FailureClass::RateLimited);
    let started = tokio::time::Instant::now();
    let rental = world.rent(&workload(), "nc-1").await.0.unwrap();
    assert_eq!(
        outcomes(&rental.attempts),
        vec![
            ("v1".into(), Some(FailureClass::RateLimited)),
            ("v1".into(), None)
        ]
    );
    assert!(started.elapsed() >= DefaultFallback::default().default_rate_limit_wait);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_with_backoff_then_the_next_offer_is_tried() {
    let world = World::new(
        &[offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)],
        None,
        LadderLimits::default(),
    );
    for _ in 0..4 {
        world.fake(V).fail_next_create(FailureClass::Transient);
    }
    let rental = world.rent(&workload(), "nc-1").await.0.unwrap();
    let t = Some(FailureClass::Transient);
    let expected = vec![
        ("v1".into(), t),
        ("v1".into(), t),
        ("v1".into(), t),
        ("v1".into(), t),
        ("r1".into(), None),
    ];
    assert_eq!(outcomes(&rental.attempts), expected);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_request_gives_up_at_once() {
    let world = World::new(
        &[offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)],
        None,
        LadderLimits::default(),
    );
    world.fake(V).fail_next_create(FailureClass::InvalidRequest);
    let (reason, attempts) = gave_up(world.rent(&workload(), "nc-1").await.0);
    assert_eq!(
        reason,
        "vast rejected the request as invalid; retrying elsewhere would not help"
    );
    assert_eq!(attempts.len(), 1);
    assert_eq!(world.instances(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lost_create_answer_is_recovered_by_name_and_never_rents_twice() {
    let world = World::new(
        &[offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)],
        None,
        LadderLimits::default(),
    );
    world.fake(V).fail_next_create(FailureClass::Timeout);
    let rental = world.rent(&workload(), "nc-1").await.0.unwrap();
    assert!(rental.adopted);
    assert_eq!(world.instances(), 1);
    assert_eq!(world.fake(V).calls().create, 1);
    assert_eq!(world.renter.budget.running_usd_per_hour(), 0.3);
}

#[tokio::test(start_paused = true)]
async fn a_price_that_rose_past_the_max_before_renting_moves_to_the_next_offer() {
    let mut w = workload();
    w.max_price_per_hour = Some(1.0);
    let world = World::new(
        &[offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.9)],
        None,
        LadderLimits::default(),
    );
    let view = world
        .renter
        .catalog
        .offers(&neocloud_core::OfferQuery::for_workload(&w), &[])
        .await;
    let plan = plan(&w, &view.offers);
    world.fake(V).set_price("v1", 1.5);
    let recorder = Recorder::default();
    let req = RentRequest {
        binding: "b",
        external_name: "nc-1",
        workload: &w,
        env: &[],
        plan: &plan,
        history: &[],
        boot: None,
        registry_login: None,
    };
    let rental = world.renter.rent(&req, &recorder).await.unwrap();
    assert_eq!(
        outcomes(&rental.attempts),
        vec![
            ("v1".into(), Some(FailureClass::PriceExceeded)),
            ("r1".into(), None)
        ]
    );
    assert_eq!(world.fake(V).calls().create, 0);
    assert_eq!(rental.instance.price_per_hour, 0.9);
}

#[tokio::test(start_paused = true)]
async fn a_rental_past_the_cluster_budget_is_refused_before_the_provider_is_called() {
    let world = World::new(
        &[offer(V, "v1", "A40", 0.8)],
        Some(0.5),
        LadderLimits::default(),
    );
    let (reason, attempts) = gave_up(world.rent(&workload(), "nc-1").await.0);
    assert_eq!(reason, "no candidates left after 1 attempts");
    match &attempts[0].outcome {
        AttemptOutcome::Failed { code, message, .. } => {
            assert_eq!(code.as_deref(), Some("budget-exceeded"));
            assert!(
                message.starts_with("cluster budget of $0.5000/h would be exceeded"),
                "{message}"
            );
        }
        other => panic!("unexpected outcome {other:?}"),
    }
    assert_eq!(world.fake(V).calls().create, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rentals_never_overrun_the_cluster_budget() {
    let world = Arc::new(World::new(
        &[offer(V, "v1", "A40", 1.0), offer(R, "r1", "A40", 1.0)],
        Some(3.5),
        LadderLimits::default(),
    ));
    let tasks = (0..10).map(|i| {
        let world = Arc::clone(&world);
        tokio::spawn(async move { world.rent(&workload(), &format!("nc-{i}")).await.0.is_ok() })
    });
    let rented = futures::future::join_all(tasks)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().unwrap())
        .count();
    assert_eq!(rented, 3);
    assert_eq!(world.instances(), 3);
    assert_eq!(world.renter.budget.running_usd_per_hour(), 3.0);
    assert_eq!(world.renter.ledger.burn_rate_usd_per_hour(), 3.0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_record_stops_before_the_provider_is_called() {
    let world = World::new(&[offer(V, "v1", "A40", 0.3)], None, LadderLimits::default());
    let w = workload();
    let plan = plan(&w, &[offer(V, "v1", "A40", 0.3)]);
    let recorder = Recorder {
        fail: true,
        ..Recorder::default()
    };
    let req = RentRequest {
        binding: "b",
        external_name: "nc-1",
        workload: &w,
        env: &[],
        plan: &plan,
        history: &[],
        boot: None,
        registry_login: None,
    };
    let err = world.renter.rent(&req, &recorder).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "failed to record attempt 1 for nc-1: binding status update conflicted"
    );
    assert_eq!(world.fake(V).calls().create, 0);
}

#[tokio::test(start_paused = true)]
async fn the_ladder_stops_at_its_attempt_limit() {
    let offers: Vec<Offer> = (0..20)
        .map(|i| offer(V, &format!("v{i:02}"), "A40", 0.3))
        .collect();
    let world = World::new(
        &offers,
        None,
        LadderLimits {
            max_attempts: 3,
            max_total: Duration::from_secs(600),
        },
    );
    world.fake(V).set_capacity("A40", 0);
    let (reason, attempts) = gave_up(world.rent(&workload(), "nc-1").await.0);
    assert_eq!(reason, "reached the limit of 3 attempts");
    assert_eq!(attempts.len(), 3);
}
