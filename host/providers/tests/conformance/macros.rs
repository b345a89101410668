//! The macros that instantiate the suite for one cloud: `conformance!` (every cloud),
//! `spot_conformance!` (clouds that rent spot) and `http_conformance!` (the HTTP adapters' safe
//! retries). Each generated test starts a fresh cloud.
//!
//! Not assertions: the test bodies live in `suite`.

/// Instantiates the suite for one cloud: `conformance!(start, "an unknown instance id")`.
#[macro_export]
macro_rules! conformance {
    ($start:path, $unknown:expr) => {
        #[tokio::test]
        async fn an_instance_goes_from_offer_to_running_to_gone() {
            $crate::suite::lifecycle(&*$start().await).await
        }
        #[tokio::test]
        async fn creating_one_name_twice_or_concurrently_rents_once() {
            $crate::suite::idempotent_create(&*$start().await).await
        }
        #[tokio::test]
        async fn a_lost_create_response_does_not_rent_twice() {
            $crate::suite::lost_answer(
                &*$start().await,
                ::neocloud_cloudsim::FaultKind::LostResponse,
                "nc-lost",
            )
            .await
        }
        #[tokio::test]
        async fn a_5xx_after_the_create_happened_does_not_rent_twice() {
            $crate::suite::lost_answer(
                &*$start().await,
                ::neocloud_cloudsim::FaultKind::ErrorAfterCreate { status: 500 },
                "nc-500-after",
            )
            .await
        }
        #[tokio::test]
        async fn a_timed_out_create_is_a_timeout_and_is_not_rented_twice() {
            $crate::suite::slow_create(&*$start().await).await
        }
        #[tokio::test]
        async fn exhausted_capacity_is_classified_as_capacity_and_rents_nothing() {
            $crate::suite::create_fault(
                &*$start().await,
                $crate::harness::Route::Create,
                ::neocloud_cloudsim::FaultKind::CapacityExhausted,
                1,
                ::neocloud_core::FailureClass::Capacity,
                "nc-cap",
            )
            .await;
        }
        #[tokio::test]
        async fn an_offer_that_vanished_is_classified_as_capacity_and_rents_nothing() {
            $crate::suite::create_fault(
                &*$start().await,
                $crate::harness::Route::Create,
                ::neocloud_cloudsim::FaultKind::OfferVanishes,
                1,
                ::neocloud_core::FailureClass::Capacity,
                "nc-gone",
            )
            .await;
        }
        #[tokio::test]
        async fn a_5xx_on_create_is_transient_and_rents_nothing() {
            $crate::suite::create_fault(
                &*$start().await,
                $crate::harness::Route::Create,
                ::neocloud_cloudsim::FaultKind::ServerError { status: 503 },
                1,
                ::neocloud_core::FailureClass::Transient,
                "nc-503",
            )
            .await;
        }
        #[tokio::test]
        async fn a_create_refused_with_429_is_rate_limited_and_rents_nothing() {
            $crate::suite::rate_limited_create(&*$start().await).await
        }
        #[tokio::test]
        async fn a_wrong_key_is_classified_as_auth() {
            $crate::suite::auth(&*$start().await).await
        }
        #[tokio::test]
        async fn a_preempted_instance_is_reported_stopped_and_can_be_deleted() {
            $crate::suite::preemption(&*$start().await).await
        }
        #[tokio::test]
        async fn listing_ours_follows_every_page_and_filters_by_prefix() {
            $crate::suite::pagination(&*$start().await).await
        }
        #[tokio::test]
        async fn deleting_twice_concurrently_or_unknown_ids_succeeds() {
            $crate::suite::double_delete(&*$start().await, $unknown).await
        }
    };
}

/// The spot cases, for clouds that rent spot: `spot_conformance!(start)`.
#[macro_export]
macro_rules! spot_conformance {
    ($start:path) => {
        #[tokio::test]
        async fn a_spot_bid_below_the_minimum_is_price_exceeded_and_leaves_nothing_rented() {
            $crate::suite::create_fault(
                &*$start().await,
                $crate::harness::Route::SpotCreate,
                ::neocloud_cloudsim::FaultKind::BidTooLow,
                1,
                ::neocloud_core::FailureClass::PriceExceeded,
                "nc-bid",
            )
            .await;
        }
        #[tokio::test]
        async fn a_spot_instance_is_rented_at_its_bid_and_deleted() {
            let cloud = $start().await;
            let p = cloud.provider();
            let offer = $crate::harness::cheapest(&*p, &$crate::harness::spot()).await;
            assert!(offer.capacity.is_spot());
            let created = p
                .create(&$crate::harness::request("nc-spot", &offer))
                .await
                .unwrap();
            assert_eq!(created.external_name, "nc-spot");
            p.delete(&created.id).await.unwrap();
            assert_eq!(cloud.ledger().live(), 0);
        }
        #[tokio::test]
        async fn a_reclaimed_spot_instance_is_told_apart_from_a_stopped_on_demand_one() {
            $crate::suite::spot_reclaim(&*$start().await).await
        }
    };
}

/// The HTTP cases (safe retries), for the three HTTP adapters: `http_conformance!(start)`.
#[macro_export]
macro_rules! http_conformance {
    ($start:path) => {
        #[tokio::test]
        async fn a_single_429_on_create_is_retried_and_rents_once() {
            let cloud = $start().await;
            let p = cloud.provider();
            let offer = $crate::harness::cheapest(&*p, &$crate::harness::on_demand()).await;
            cloud.arm(
                $crate::harness::Route::Create,
                ::neocloud_cloudsim::FaultKind::RateLimited {
                    retry_after_secs: 1,
                },
                1,
            );
            p.create(&$crate::harness::request("nc-429-once", &offer))
                .await
                .unwrap();
            assert_eq!(cloud.ledger().live_named("nc-429-once"), 1);
        }
        #[tokio::test]
        async fn a_5xx_on_a_read_is_retried_transparently() {
            let cloud = $start().await;
            cloud.seed(2, "nc-read-").await;
            cloud.arm(
                $crate::harness::Route::List,
                ::neocloud_cloudsim::FaultKind::ServerError { status: 502 },
                2,
            );
            assert_eq!(
                cloud.provider().list_ours("nc-read-").await.unwrap().len(),
                2
            );
        }
        #[tokio::test]
        async fn a_read_that_keeps_failing_is_transient() {
            let cloud = $start().await;
            cloud.arm(
                $crate::harness::Route::List,
                ::neocloud_cloudsim::FaultKind::ServerError { status: 500 },
                10,
            );
            let error = cloud
                .provider()
                .list_ours("nc-")
                .await
                .expect_err("every attempt fails");
            assert_eq!(
                error.class,
                ::neocloud_core::FailureClass::Transient,
                "{error}"
            );
        }
        #[tokio::test]
        async fn a_delete_answered_with_429_is_retried_until_done() {
            let cloud = $start().await;
            cloud.seed(1, "nc-del429-").await;
            let id = cloud
                .provider()
                .find_by_name("nc-del429-0")
                .await
                .unwrap()
                .unwrap()
                .id;
            cloud.arm(
                $crate::harness::Route::Delete,
                ::neocloud_cloudsim::FaultKind::RateLimited {
                    retry_after_secs: 1,
                },
                2,
            );
            cloud.provider().delete(&id).await.unwrap();
            assert_eq!(cloud.ledger().live(), 0);
        }
        #[tokio::test]
        async fn a_get_slower_than_the_timeout_is_retried() {
            let cloud = $start().await;
            cloud.seed(1, "nc-slowget-").await;
            let id = cloud
                .provider()
                .find_by_name("nc-slowget-0")
                .await
                .unwrap()
                .unwrap()
                .id;
            let delay = $crate::harness::SLOW_DELAY.as_millis() as u64;
            cloud.arm(
                $crate::harness::Route::Get,
                ::neocloud_cloudsim::FaultKind::Slow { delay_ms: delay },
                1,
            );
            assert_eq!(cloud.provider().get(&id).await.unwrap().unwrap().id, id);
        }
        #[tokio::test]
        async fn an_offer_search_answered_with_429_is_retried() {
            let cloud = $start().await;
            cloud.arm(
                $crate::harness::Route::Offers,
                ::neocloud_cloudsim::FaultKind::RateLimited {
                    retry_after_secs: 1,
                },
                1,
            );
            assert!(
                !cloud
                    .provider()
                    .list_offers(&$crate::harness::on_demand())
                    .await
                    .unwrap()
                    .is_empty()
            );
        }
    };
}
