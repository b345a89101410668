//! The conformance suite, written once: every function takes a [`Cloud`] and proves one part of
//! the Provider contract, checking the simulator's ledger for leaked or duplicate instances.
//! The macros in `macros` instantiate it for one cloud.
//!
//! Not provider-specific expectations: a case that only some clouds can express (spot bids,
//! HTTP retries) has its own macro, invoked only for those clouds.

use std::time::Duration;

use neocloud_cloudsim::FaultKind;
use neocloud_core::{FailureClass, InstancePhase};
use neocloud_providers::{Provider, ProviderError};

use crate::harness::{self, Cloud, Route, SLOW_DELAY};

/// Polls `get` until the instance runs (or 10 s pass).
pub async fn wait_running(provider: &dyn Provider, id: &str) -> InstancePhase {
    let mut phase = InstancePhase::Unknown;
    for _ in 0..200 {
        phase = provider
            .get(id)
            .await
            .unwrap()
            .expect("the instance exists")
            .phase;
        if phase == InstancePhase::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    phase
}

fn assert_clean(cloud: &dyn Cloud, name: &str, live: usize) {
    let ledger = cloud.ledger();
    assert_eq!(
        ledger.live_named(name),
        live,
        "live instances named {name}: {ledger:?}"
    );
}

async fn delete_all(cloud: &dyn Cloud, name: &str) {
    let provider = cloud.provider();
    while let Some(found) = provider.find_by_name(name).await.unwrap() {
        provider.delete(&found.id).await.unwrap();
    }
    assert_clean(cloud, name, 0);
}

pub async fn lifecycle(cloud: &dyn Cloud) {
    let p = cloud.provider();
    p.health().await.unwrap();
    let offer = harness::cheapest(&*p, &harness::on_demand()).await;
    let created = p
        .create(&harness::request("nc-life-1", &offer))
        .await
        .unwrap();
    assert_eq!(created.external_name, "nc-life-1");
    assert_eq!(wait_running(&*p, &created.id).await, InstancePhase::Running);
    let found = p
        .find_by_name("nc-life-1")
        .await
        .unwrap()
        .expect("found by name");
    assert_eq!(found.id, created.id);
    let ours = p.list_ours("nc-life-").await.unwrap();
    assert_eq!(
        ours.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        [created.id.as_str()]
    );
    assert_clean(cloud, "nc-life-1", 1);
    p.delete(&created.id).await.unwrap();
    assert!(p.find_by_name("nc-life-1").await.unwrap().is_none());
    assert!(p.list_ours("nc-life-").await.unwrap().is_empty());
    let after = p.get(&created.id).await.unwrap();
    assert!(
        after
            .as_ref()
            .is_none_or(|s| s.phase.is_terminal() || s.phase == InstancePhase::Terminating),
        "{after:?}"
    );
    assert_clean(cloud, "nc-life-1", 0);
}

pub async fn idempotent_create(cloud: &dyn Cloud) {
    let p = cloud.provider();
    let offer = harness::cheapest(&*p, &harness::on_demand()).await;
    let first = p
        .create(&harness::request("nc-idem-1", &offer))
        .await
        .unwrap();
    let second = p
        .create(&harness::request("nc-idem-1", &offer))
        .await
        .unwrap();
    assert_eq!(first.id, second.id);
    let request = harness::request("nc-idem-2", &offer);
    let (a, b) = tokio::join!(p.create(&request), p.create(&request));
    assert_eq!(
        a.unwrap().id,
        b.unwrap().id,
        "concurrent creates of one name rent once"
    );
    assert_clean(cloud, "nc-idem-1", 1);
    assert_clean(cloud, "nc-idem-2", 1);
    delete_all(cloud, "nc-idem-1").await;
    delete_all(cloud, "nc-idem-2").await;
}

/// A create whose answer is lost leaves exactly one instance, whether the adapter recovers it
/// itself or reports an unknown outcome that the next create resolves.
pub async fn lost_answer(cloud: &dyn Cloud, fault: FaultKind, name: &str) {
    let p = cloud.provider();
    let offer = harness::cheapest(&*p, &harness::on_demand()).await;
    cloud.arm(Route::Create, fault, 1);
    let first = p.create(&harness::request(name, &offer)).await;
    match &first {
        Ok(state) => assert_eq!(state.external_name, name),
        Err(e) => {
            assert!(
                !cloud.recovers_inside_create(),
                "the adapter should have recovered: {e}"
            );
            assert!(e.class.outcome_unknown(), "{e}");
        }
    }
    let second = p.create(&harness::request(name, &offer)).await.unwrap();
    if let Ok(first) = first {
        assert_eq!(first.id, second.id);
    }
    assert_clean(cloud, name, 1);
    assert_eq!(
        cloud
            .ledger()
            .entries
            .iter()
            .filter(|(_, n, _)| n == name)
            .count(),
        1,
        "rented once"
    );
    delete_all(cloud, name).await;
}

/// An injected create fault yields `class`, and nothing is left rented.
pub async fn create_fault(
    cloud: &dyn Cloud,
    route: Route,
    fault: FaultKind,
    count: u32,
    class: FailureClass,
    name: &str,
) -> ProviderError {
    let p = cloud.provider();
    let query = if route == Route::SpotCreate {
        harness::spot()
    } else {
        harness::on_demand()
    };
    let offer = harness::cheapest(&*p, &query).await;
    cloud.arm(route, fault, count);
    let error = p
        .create(&harness::request(name, &offer))
        .await
        .expect_err("the fault makes create fail");
    assert_eq!(error.class, class, "{error}");
    assert!(
        error
            .message
            .chars()
            .next()
            .is_some_and(|c| !c.is_uppercase()),
        "lower-case message: {error}"
    );
    assert_clean(cloud, name, 0);
    assert_eq!(
        cloud.ledger().live(),
        0,
        "nothing leaked: {:?}",
        cloud.ledger()
    );
    error
}

pub async fn rate_limited_create(cloud: &dyn Cloud) {
    let fault = FaultKind::RateLimited {
        retry_after_secs: 1,
    };
    let error = create_fault(
        cloud,
        Route::Create,
        fault,
        10,
        FailureClass::RateLimited,
        "nc-429",
    )
    .await;
    if cloud.reports_retry_after() {
        assert_eq!(error.retry_after, Some(Duration::from_secs(1)), "{error:?}");
    }
}

/// A create that times out while the provider is still working reports a timeout; once the
/// provider has caught up, the next create returns that instance rather than renting again.
pub async fn slow_create(cloud: &dyn Cloud) {
    let fault = FaultKind::Slow {
        delay_ms: SLOW_DELAY.as_millis() as u64,
    };
    let p = cloud.provider();
    let offer = harness::cheapest(&*p, &harness::on_demand()).await;
    cloud.arm(Route::Create, fault, 1);
    let error = p
        .create(&harness::request("nc-slow", &offer))
        .await
        .expect_err("the create times out");
    assert_eq!(error.class, FailureClass::Timeout, "{error}");
    tokio::time::sleep(SLOW_DELAY).await;
    p.create(&harness::request("nc-slow", &offer))
        .await
        .unwrap();
    assert_clean(cloud, "nc-slow", 1);
    delete_all(cloud, "nc-slow").await;
}

pub async fn auth(cloud: &dyn Cloud) {
    let error = cloud
        .bad_key_provider()
        .health()
        .await
        .expect_err("a wrong key is refused");
    assert_eq!(error.class, FailureClass::Auth, "{error}");
}

pub async fn preemption(cloud: &dyn Cloud) {
    let p = cloud.provider();
    let offer = harness::cheapest(&*p, &harness::on_demand()).await;
    let created = p.create(&harness::request("nc-pre", &offer)).await.unwrap();
    wait_running(&*p, &created.id).await;
    assert!(cloud.preempt(&created.id));
    let seen = p
        .get(&created.id)
        .await
        .unwrap()
        .expect("a preempted instance still exists");
    assert_eq!(seen.phase, InstancePhase::Stopped, "{seen:?}");
    delete_all(cloud, "nc-pre").await;
}

/// A reclaimed spot instance is reported stopped and `reclaimed()` by `get` and `list_ours`
/// (the node counts it as a preemption). RunPod's v2 pods do not say whether they are spot:
/// the adapter asks GraphQL for the pod type.
pub async fn spot_reclaim(cloud: &dyn Cloud) {
    let p = cloud.provider();
    let spot = harness::cheapest(&*p, &harness::spot()).await;
    let created = p
        .create(&harness::request("nc-reclaim", &spot))
        .await
        .unwrap();
    wait_running(&*p, &created.id).await;
    assert!(cloud.preempt(&created.id));
    let seen = p.get(&created.id).await.unwrap().expect("still exists");
    assert_eq!(seen.phase, InstancePhase::Stopped, "{seen:?}");
    assert!(seen.reclaimed(), "a reclaimed spot instance: {seen:?}");
    let listed = p.list_ours("nc-reclaim").await.unwrap();
    assert!(
        listed.iter().any(|i| i.id == created.id && i.reclaimed()),
        "{listed:?}"
    );
    delete_all(cloud, "nc-reclaim").await;
}

pub async fn pagination(cloud: &dyn Cloud) {
    cloud.seed(30, "nc-page-").await;
    cloud.seed(2, "other-").await;
    let mut ours: Vec<String> = cloud
        .provider()
        .list_ours("nc-page-")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.external_name)
        .collect();
    ours.sort();
    ours.dedup();
    let mut expected: Vec<String> = (0..30).map(|n| format!("nc-page-{n}")).collect();
    expected.sort();
    assert_eq!(ours, expected);
    assert_eq!(cloud.ledger().live(), 32);
}

pub async fn double_delete(cloud: &dyn Cloud, unknown_id: &str) {
    let p = cloud.provider();
    let offer = harness::cheapest(&*p, &harness::on_demand()).await;
    let a = p
        .create(&harness::request("nc-del-1", &offer))
        .await
        .unwrap();
    p.delete(&a.id).await.unwrap();
    p.delete(&a.id).await.unwrap();
    p.delete(unknown_id).await.unwrap();
    assert!(p.get(unknown_id).await.unwrap().is_none());
    let b = p
        .create(&harness::request("nc-del-2", &offer))
        .await
        .unwrap();
    let (x, y) = tokio::join!(p.delete(&b.id), p.delete(&b.id));
    x.unwrap();
    y.unwrap();
    assert_eq!(cloud.ledger().live(), 0);
}
