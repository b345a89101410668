//! The fake provider keeps the Provider contract: idempotent create by name (also under
//! concurrency), idempotent delete, listing across pages, capacity, injected failures, and
//! errors that never carry a key.

use std::sync::Arc;

use neocloud_core::{FailureClass, Offer, OfferQuery, ProviderId};
use neocloud_providers::{CreateRequest, FakeProvider, Operation, Provider, ProviderError};

fn offer(id: &str, gpu: &str) -> Offer {
    neocloud_fixtures::offer(ProviderId::Fake, id, gpu, 0.5)
}

fn request(name: &str, offer: &Offer) -> CreateRequest {
    CreateRequest {
        external_name: name.to_owned(),
        offer: offer.clone(),
        workload: neocloud_fixtures::workload(),
        env: vec![("TOKEN".into(), "s3cret-value".into())],
        bid_per_hour: None,
        boot: None,
        registry_login: None,
    }
}

fn fake_with(offers: Vec<Offer>) -> FakeProvider {
    let fake = FakeProvider::new(ProviderId::Fake);
    fake.set_offers(offers);
    fake
}

#[tokio::test]
async fn creating_twice_under_one_name_returns_the_same_instance() {
    let fake = fake_with(vec![offer("o1", "A40")]);
    let first = fake
        .create(&request("nc-1", &offer("o1", "A40")))
        .await
        .unwrap();
    let second = fake
        .create(&request("nc-1", &offer("o1", "A40")))
        .await
        .unwrap();
    assert_eq!(first.id, second.id);
    assert_eq!(fake.instances().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_under_one_name_rent_one_instance() {
    let fake = Arc::new(fake_with(vec![offer("o1", "A40")]));
    let tasks = (0..16).map(|_| {
        let fake = Arc::clone(&fake);
        tokio::spawn(async move {
            fake.create(&request("nc-1", &offer("o1", "A40")))
                .await
                .unwrap()
                .id
        })
    });
    let ids: Vec<String> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(ids.iter().all(|id| id == &ids[0]));
    assert_eq!(fake.instances().len(), 1);
}

#[tokio::test]
async fn deleting_an_instance_that_is_already_gone_succeeds() {
    let fake = fake_with(vec![offer("o1", "A40")]);
    let i = fake
        .create(&request("nc-1", &offer("o1", "A40")))
        .await
        .unwrap();
    fake.delete(&i.id).await.unwrap();
    fake.delete(&i.id).await.unwrap();
    fake.delete("fake-999").await.unwrap();
    assert_eq!(fake.get(&i.id).await.unwrap(), None);
    assert_eq!(fake.find_by_name("nc-1").await.unwrap(), None);
}

#[tokio::test]
async fn listing_ours_returns_every_page_and_only_our_prefix() {
    let fake = fake_with(vec![offer("o1", "A40")]);
    for n in 0..8 {
        fake.create(&request(&format!("nc-{n}"), &offer("o1", "A40")))
            .await
            .unwrap();
    }
    fake.create(&request("other-1", &offer("o1", "A40")))
        .await
        .unwrap();
    let ours = fake.list_ours("nc-").await.unwrap();
    let names: Vec<&str> = ours.iter().map(|i| i.external_name.as_str()).collect();
    assert_eq!(names, (0..8).map(|n| format!("nc-{n}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn capacity_runs_out_per_gpu_model_and_returns_on_delete() {
    let fake = fake_with(vec![offer("o1", "A40"), offer("o2", "A10")]);
    fake.set_capacity("A40", 1);
    let first = fake
        .create(&request("nc-1", &offer("o1", "A40")))
        .await
        .unwrap();
    let err = fake
        .create(&request("nc-2", &offer("o1", "A40")))
        .await
        .unwrap_err();
    assert_eq!(err.class, FailureClass::Capacity);
    assert_eq!(
        err.to_string(),
        "failed to create instance nc-2 on fake: no A40 capacity left for offer o1"
    );
    fake.create(&request("nc-3", &offer("o2", "A10")))
        .await
        .unwrap();
    fake.delete(&first.id).await.unwrap();
    fake.create(&request("nc-2", &offer("o1", "A40")))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_vanished_offer_is_a_capacity_failure_naming_the_offer() {
    let fake = fake_with(vec![]);
    let err = fake
        .create(&request("nc-1", &offer("123", "A40")))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "failed to create instance nc-1 on fake: offer 123 no longer available"
    );
}

#[tokio::test]
async fn an_injected_failure_fails_only_the_next_create() {
    let fake = fake_with(vec![offer("o1", "A40")]);
    fake.fail_next_create(FailureClass::Quota);
    let err = fake
        .create(&request("nc-1", &offer("o1", "A40")))
        .await
        .unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (FailureClass::Quota, Some("fake-injected"))
    );
    assert!(fake.instances().is_empty());
    fake.create(&request("nc-1", &offer("o1", "A40")))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_injected_timeout_creates_the_instance_and_loses_the_answer() {
    let fake = fake_with(vec![offer("o1", "A40")]);
    fake.fail_next_create(FailureClass::Timeout);
    let err = fake
        .create(&request("nc-1", &offer("o1", "A40")))
        .await
        .unwrap_err();
    assert_eq!(err.class, FailureClass::Timeout);
    let found = fake
        .find_by_name("nc-1")
        .await
        .unwrap()
        .expect("the instance exists");
    let again = fake
        .create(&request("nc-1", &offer("o1", "A40")))
        .await
        .unwrap();
    assert_eq!(found.id, again.id);
}

#[tokio::test]
async fn offers_are_filtered_by_model_and_count_and_failures_can_be_injected() {
    let fake = fake_with(vec![offer("o1", "A40"), offer("o2", "A10")]);
    let query = OfferQuery {
        gpu_models: vec!["A10".into()],
        gpu_count: 1,
        capacity: None,
    };
    let ids: Vec<String> = fake
        .list_offers(&query)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(ids, vec!["o2"]);
    fake.fail_next_list_offers(FailureClass::RateLimited);
    let err = fake.list_offers(&query).await.unwrap_err();
    assert_eq!(err.class, FailureClass::RateLimited);
    assert_eq!(fake.calls().list_offers, 2);
}

#[tokio::test]
async fn health_reports_refused_credentials_as_auth() {
    let fake = fake_with(vec![]);
    fake.health().await.unwrap();
    fake.set_healthy(false);
    assert_eq!(fake.health().await.unwrap_err().class, FailureClass::Auth);
}

#[test]
fn a_redacted_error_never_shows_the_api_key() {
    let key = "rpa_SECRETKEY123";
    let err = ProviderError::new(
        ProviderId::Runpod,
        Operation::Create,
        FailureClass::Auth,
        format!("bad key {key}"),
    )
    .with_code(format!("auth {key}"))
    .redact(key);
    let text = format!("{err} {err:?}");
    assert!(!text.contains(key), "{text}");
    assert_eq!(
        err.to_string(),
        "failed to create instance on runpod: bad key [redacted] (code auth [redacted])"
    );
}

#[test]
fn a_create_request_debug_shows_env_names_but_never_values() {
    let text = format!("{:?}", request("nc-1", &offer("o1", "A40")));
    assert!(
        text.contains("TOKEN") && !text.contains("s3cret-value"),
        "{text}"
    );
}

#[tokio::test]
async fn the_sample_market_offers_four_single_gpu_offers_in_fake_1() {
    let fake = FakeProvider::sample_market();
    let query = OfferQuery {
        gpu_models: vec![],
        gpu_count: 1,
        capacity: None,
    };
    let mut ids: Vec<_> = fake
        .list_offers(&query)
        .await
        .unwrap()
        .into_iter()
        .inspect(|o| assert_eq!((o.region.as_str(), o.gpu_count), ("fake-1", 1)))
        .map(|o| o.id)
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["fake-a10", "fake-a40", "fake-gtx1070", "fake-gtx1070-spot"]
    );
    assert_eq!(fake.id(), ProviderId::Fake);
}

#[tokio::test]
async fn with_a_run_time_a_workload_ends_with_exit_code_0_and_without_one_it_runs_on() {
    use neocloud_core::InstancePhase;
    use std::time::Duration;
    let fake = fake_with(vec![offer("o1", "A40")]);
    let create = async |name: &str| {
        let created = fake.create(&request(name, &offer("o1", "A40"))).await;
        created.unwrap().id
    };
    let state = async |id: &str| {
        let got = fake.get(id).await.unwrap().expect("the instance exists");
        (got.phase, got.exit_code)
    };
    let forever = create("nc-0").await;
    fake.set_workload_run_time(Some(Duration::from_secs(3600)));
    let long = create("nc-1").await;
    fake.set_workload_run_time(Some(Duration::ZERO));
    let done = create("nc-2").await;
    assert_eq!(state(&done).await, (InstancePhase::Stopped, Some(0)));
    let listed = fake.list_ours("nc-").await.unwrap();
    let ended = listed.iter().find(|i| i.id == done).expect("still listed");
    assert_eq!(
        (ended.provider_status.as_str(), ended.exit_code),
        ("exited", Some(0))
    );
    // Within its run time, and without one (created before it was set), it runs.
    assert_eq!(state(&long).await, (InstancePhase::Running, None));
    assert_eq!(state(&forever).await, (InstancePhase::Running, None));
    fake.delete(&done).await.unwrap();
    assert!(fake.get(&done).await.unwrap().is_none());
}
