//! The catalog: concurrent fetches, the TTL cache, stale offers served while refreshing, and a
//! failing provider that does not hide the others.

mod support;

use std::sync::Arc;
use std::time::Duration;

use neocloud_broker::{Catalog, CatalogConfig};
use neocloud_core::{FailureClass, OfferQuery, ProviderId};
use neocloud_providers::{FakeProvider, Provider};
use support::offer;

fn catalog(delay: Duration) -> (Catalog, Vec<Arc<FakeProvider>>) {
    let fakes: Vec<Arc<FakeProvider>> = support::PROVIDERS
        .iter()
        .map(|p| {
            let fake = Arc::new(FakeProvider::new(*p));
            fake.set_offers(vec![offer(*p, &format!("{p}-1"), "A40", 0.5)]);
            fake.set_list_delay(Some(delay));
            fake
        })
        .collect();
    let providers = fakes
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn Provider>)
        .collect();
    let config = CatalogConfig {
        ttl: Duration::from_secs(60),
        fetch_timeout: Duration::from_secs(5),
    };
    (Catalog::new(providers, config), fakes)
}

fn ids(view: &neocloud_broker::CatalogView) -> Vec<String> {
    view.offers.iter().map(|o| o.id.clone()).collect()
}

#[tokio::test(start_paused = true)]
async fn providers_are_asked_concurrently() {
    let (catalog, _) = catalog(Duration::from_secs(2));
    let started = tokio::time::Instant::now();
    let view = catalog.offers(&OfferQuery::default(), &[]).await;
    assert_eq!(ids(&view), vec!["runpod-1", "lambda-1", "vast-1"]);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2),
        "three 2 s fetches took 2 s together"
    );
}

#[tokio::test(start_paused = true)]
async fn fresh_entries_are_served_from_the_cache() {
    let (catalog, fakes) = catalog(Duration::ZERO);
    catalog.offers(&OfferQuery::default(), &[]).await;
    tokio::time::advance(Duration::from_secs(30)).await;
    let view = catalog.offers(&OfferQuery::default(), &[]).await;
    assert!(view.stale.is_empty());
    assert!(fakes.iter().all(|f| f.calls().list_offers == 1));
}

#[tokio::test(start_paused = true)]
async fn stale_offers_are_served_while_one_refresh_runs() {
    let (catalog, fakes) = catalog(Duration::from_secs(1));
    catalog.offers(&OfferQuery::default(), &[]).await;
    fakes[0].set_offers(vec![offer(ProviderId::Runpod, "runpod-2", "A40", 0.4)]);
    tokio::time::advance(Duration::from_secs(61)).await;
    let started = tokio::time::Instant::now();
    let stale = catalog.offers(&OfferQuery::default(), &[]).await;
    let again = catalog.offers(&OfferQuery::default(), &[]).await;
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "stale answers do not wait"
    );
    assert_eq!(ids(&stale)[0], "runpod-1");
    assert_eq!(stale.stale.len(), 3);
    assert_eq!(ids(&again)[0], "runpod-1");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fresh = catalog.offers(&OfferQuery::default(), &[]).await;
    assert_eq!(ids(&fresh)[0], "runpod-2");
    assert!(fresh.stale.is_empty());
    assert_eq!(
        fakes[0].calls().list_offers,
        2,
        "one refresh, not one per caller"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_provider_is_reported_and_the_others_are_still_served() {
    let (catalog, fakes) = catalog(Duration::ZERO);
    fakes[1].fail_next_list_offers(FailureClass::Auth);
    let view = catalog.offers(&OfferQuery::default(), &[]).await;
    assert_eq!(ids(&view), vec!["runpod-1", "vast-1"]);
    assert_eq!(view.errors.len(), 1);
    assert_eq!(
        view.errors[0].to_string(),
        "failed to list offers on lambda: injected failure (code fake-injected)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_does_not_answer_in_time_times_out() {
    let (catalog, _) = catalog(Duration::from_secs(30));
    let view = catalog
        .offers(&OfferQuery::default(), &[ProviderId::Vast])
        .await;
    assert!(view.offers.is_empty());
    assert_eq!(view.errors[0].class, FailureClass::Timeout);
}

#[tokio::test(start_paused = true)]
async fn fresh_data_bypasses_the_cache() {
    let (catalog, fakes) = catalog(Duration::ZERO);
    catalog.offers(&OfferQuery::default(), &[]).await;
    fakes[2].set_price("vast-1", 0.9);
    let fresh = catalog
        .fresh(ProviderId::Vast, &OfferQuery::default())
        .await
        .unwrap();
    assert_eq!(fresh[0].price_per_hour, 0.9);
    let err = catalog
        .fresh(ProviderId::Kube, &OfferQuery::default())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "failed to list offers on kube: provider is not enabled on this node"
    );
}
