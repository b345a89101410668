//! What the renter reports besides attempts: each fallback decision with the action and what
//! follows, offers taken by other renters (classed apart, outside the policy's attempt budget),
//! and prices or GPU counts a provider leaves out of its answer.

mod support;

use neocloud_broker::{BrokerError, LadderLimits, NextStep, fill_unreported};
use neocloud_core::{FailureClass, FallbackAction, InstancePhase, InstanceState, ProviderId};
use support::world::{World, plan};
use support::{offer, workload};

const V: ProviderId = ProviderId::Vast;
const R: ProviderId = ProviderId::Runpod;

#[tokio::test(start_paused = true)]
async fn each_failure_is_answered_by_a_reported_decision_naming_what_comes_next() {
    let world = World::new(
        &[offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)],
        None,
        LadderLimits::default(),
    );
    world.fake(V).fail_next_create(FailureClass::Quota);
    let (rental, recorder) = world.rent(&workload(), "nc-d").await;
    assert_eq!(
        rental.unwrap().candidate,
        Some(1),
        "the second offer was rented"
    );
    let decisions = recorder.decisions.lock().clone();
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    let d = &decisions[0];
    assert_eq!(
        (d.attempt, d.class, d.by_policy),
        (1, FailureClass::Quota, true)
    );
    assert_eq!(d.action, FallbackAction::SkipProvider { provider: V });
    match &d.next {
        NextStep::Try {
            offer, same_offer, ..
        } => assert_eq!((offer.id.as_str(), *same_offer), ("r1", false)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        d.describe(),
        "skip provider vast: next is runpod offer r1 at once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_give_up_is_reported_as_the_last_decision() {
    let world = World::new(&[offer(V, "v1", "A40", 0.3)], None, LadderLimits::default());
    world.fake(V).fail_next_create(FailureClass::InvalidRequest);
    let (rental, recorder) = world.rent(&workload(), "nc-g").await;
    assert!(matches!(rental, Err(BrokerError::GaveUp { .. })));
    let decisions = recorder.decisions.lock().clone();
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].action_label(), "give-up");
    assert!(matches!(decisions[0].next, NextStep::Stop { .. }));
}

#[tokio::test(start_paused = true)]
async fn an_offer_taken_since_planning_moves_on_without_spending_an_attempt() {
    let offers = [offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)];
    // One attempt allowed: the taken offer must not use it.
    let limits = LadderLimits {
        max_attempts: 1,
        ..LadderLimits::default()
    };
    let world = World::new(&offers, None, limits);
    let w = workload();
    let planned = plan(&w, &offers);
    world.fake(V).set_offers(Vec::new());
    let (rental, recorder) = world.rent_plan(&w, "nc-t", &planned).await;
    let rental = rental.unwrap();
    assert_eq!(rental.instance.provider, R);
    assert_eq!(rental.attempts[0].failure(), Some(FailureClass::OfferTaken));
    let decisions = recorder.decisions.lock().clone();
    assert_eq!(decisions.len(), 1);
    assert!(!decisions[0].by_policy, "the policy was not asked");
    assert_eq!(decisions[0].action, FallbackAction::NextOffer);
    assert_eq!(world.instances(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_create_refused_for_an_offer_gone_from_fresh_data_is_classed_as_taken() {
    let offers = [offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)];
    let world = World::new(&offers, None, LadderLimits::default());
    // The capacity is gone at create, and the fresh list no longer has the offer.
    world.fake(V).set_capacity("A40", 0);
    let w = workload();
    let planned = plan(&w, &offers);
    let (rental, _) = world.rent_plan(&w, "nc-c", &planned).await;
    let rental = rental.unwrap();
    // The offer is still listed: a real capacity failure, the policy's to answer.
    assert_eq!(rental.attempts[0].failure(), Some(FailureClass::Capacity));
}

#[tokio::test(start_paused = true)]
async fn when_every_planned_offer_was_taken_the_renter_asks_to_plan_again() {
    let offers = [offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)];
    let world = World::new(&offers, None, LadderLimits::default());
    let w = workload();
    let planned = plan(&w, &offers);
    world.fake(V).set_offers(Vec::new());
    world.fake(R).set_offers(Vec::new());
    let (rental, _) = world.rent_plan(&w, "nc-all", &planned).await;
    match rental {
        Err(BrokerError::OffersTaken { attempts, .. }) => {
            assert_eq!(attempts.len(), 2);
            assert!(
                attempts
                    .iter()
                    .all(|a| a.failure() == Some(FailureClass::OfferTaken))
            );
        }
        other => panic!("expected a re-plan, got {other:?}"),
    }
    assert_eq!(world.instances(), 0);
}

#[test]
fn a_price_or_gpu_count_the_provider_leaves_out_comes_from_what_was_rented() {
    let mut i = InstanceState {
        provider: R,
        id: "p1".into(),
        external_name: "nc-1".into(),
        phase: InstancePhase::Starting,
        provider_status: "CREATED".into(),
        message: None,
        gpu: neocloud_core::GpuModel::Known {
            name: "A40".into(),
            memory_gib: 48,
        },
        gpu_count: 0,
        price_per_hour: 0.0,
        region: "US".into(),
        endpoints: Vec::new(),
        public_ip: None,
        created_at: None,
        interruptible: false,
        exit_code: None,
        ready: None,
    };
    fill_unreported(&mut i, 0.44, Some(2));
    assert_eq!((i.price_per_hour, i.gpu_count), (0.44, 2));
    i.price_per_hour = 0.5;
    fill_unreported(&mut i, 0.44, Some(4));
    assert_eq!(
        (i.price_per_hour, i.gpu_count),
        (0.5, 2),
        "reported values stay"
    );
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_answered_429_is_called_by_no_pod_until_its_back_off_ends() {
    let world = World::new(
        &[offer(V, "v1", "A40", 0.3), offer(R, "r1", "A40", 0.5)],
        None,
        LadderLimits::default(),
    );
    world.fake(V).fail_next_create(FailureClass::RateLimited);
    let (first, _) = world.rent(&workload(), "nc-first").await;
    // The first workload waited out the back-off and rented on Vast.
    assert_eq!(first.unwrap().instance.provider, V);
    let creates = world.fake(V).calls().create;
    world.fake(V).fail_next_create(FailureClass::RateLimited);
    // A 429 to one workload...
    let (second, _) = world.rent(&workload(), "nc-second").await;
    assert_eq!(second.unwrap().instance.provider, V);
    assert_eq!(world.fake(V).calls().create, creates + 2);
    world.fake(V).fail_next_create(FailureClass::RateLimited);
    let limited = world
        .renter
        .catalog
        .backoff()
        .failed(V, FailureClass::RateLimited, None);
    assert!(limited.is_some());
    let before = world.fake(V).calls().create;
    // ...keeps every other workload off that provider while it backs off: the refusal is a
    // rate limit with the time left, never a call.
    let (third, recorder) = world.rent(&workload(), "nc-third").await;
    let third = third.unwrap();
    let attempts = recorder.attempts.lock().clone();
    let refused = attempts
        .iter()
        .find(|a| a.failure() == Some(FailureClass::RateLimited))
        .expect("a refusal while backing off");
    match &refused.outcome {
        neocloud_core::AttemptOutcome::Failed { code, message, .. } => {
            assert_eq!(code.as_deref(), Some("provider-backoff"));
            assert!(message.contains("vast is not called for"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // After the wait the provider was called again.
    assert_eq!(third.instance.provider, V);
    assert!(world.fake(V).calls().create > before);
}
