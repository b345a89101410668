//! The broker facade end to end over fake providers: plan and rent, an empty plan, and releasing
//! budget when an instance stops.

mod support;

use chrono::Duration;
use neocloud_broker::{Broker, BrokerError, LadderLimits, Placement, Planner};
use neocloud_core::{GpuModel, ProviderId};
use support::world::{Recorder, World};
use support::{now, offer, workload};

fn broker(cap: Option<f64>) -> Broker {
    let offers = [
        offer(ProviderId::Vast, "v1", "A40", 0.4),
        offer(ProviderId::Lambda, "l1", "A10", 0.6),
    ];
    let world = World::new(&offers, cap, LadderLimits::default());
    Broker {
        planner: Planner::default(),
        renter: world.renter,
    }
}

fn placement<'a>(w: &'a neocloud_core::WorkloadSpec, name: &'a str) -> Placement<'a> {
    Placement {
        binding: name,
        external_name: name,
        workload: w,
        env: &[],
        history: &[],
        boot: None,
        registry_login: None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_workload_is_planned_and_rented_on_the_cheapest_fitting_offer() {
    let broker = broker(None);
    let w = workload();
    let (rental, plan) = broker
        .place(&placement(&w, "ml/a"), &Recorder::default())
        .await
        .unwrap();
    assert_eq!(rental.instance.provider, ProviderId::Vast);
    assert!(
        plan.explanation.starts_with("chose vast offer v1"),
        "{}",
        plan.explanation
    );
    let costs = broker.costs(now());
    assert_eq!((costs.burn_usd_per_hour, costs.bindings.len()), (0.4, 1));
}

#[tokio::test(start_paused = true)]
async fn a_workload_nothing_fits_is_refused_with_the_explanation() {
    let broker = broker(None);
    let mut w = workload();
    w.gpu.accepted = GpuModel::accepted_by_name("H100 SXM");
    let err = broker
        .place(&placement(&w, "ml/a"), &Recorder::default())
        .await
        .unwrap_err();
    let BrokerError::NoCandidates { explanation } = &err else {
        panic!("unexpected {err:?}")
    };
    assert_eq!(
        explanation,
        "no offer fits: 0 considered, none eligible and priced"
    );
    assert_eq!(err.metric_label(), "no-candidates");
}

#[tokio::test(start_paused = true)]
async fn a_stopped_instance_frees_its_budget_for_the_next_workload() {
    let broker = broker(Some(0.5));
    let w = workload();
    broker
        .place(&placement(&w, "ml/a"), &Recorder::default())
        .await
        .unwrap();
    assert!(
        broker
            .place(&placement(&w, "ml/b"), &Recorder::default())
            .await
            .is_err()
    );
    broker.instance_stopped("ml/a", now() + Duration::hours(1));
    let (plan, _) = broker.plan(&placement(&w, "ml/b")).await.unwrap();
    assert_eq!(plan.candidates[0].offer.id, "v1");
    assert_eq!(broker.renter.budget.running_usd_per_hour(), 0.0);
}
