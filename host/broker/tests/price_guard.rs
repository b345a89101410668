//! The price guard just before renting, against fresh offer data.

mod support;

use neocloud_broker::Candidate;
use neocloud_broker::price_guard::confirm;
use neocloud_core::{FailureClass, OfferCapacity, ProviderId};
use support::offer;

fn spot_candidate(min_bid: f64, bid: f64, max: f64) -> Candidate {
    let mut o = offer(ProviderId::Vast, "42", "A40", 1.0);
    o.capacity = OfferCapacity::Spot {
        min_bid_per_hour: min_bid,
    };
    Candidate {
        offer: o,
        score: 0.0,
        max_price_per_hour: max,
        bid_per_hour: Some(bid),
    }
}

#[test]
fn an_on_demand_offer_is_confirmed_at_its_fresh_price_within_the_ceiling() {
    let c = Candidate {
        offer: offer(ProviderId::Vast, "42", "A40", 0.5),
        score: 0.0,
        max_price_per_hour: 0.6,
        bid_per_hour: None,
    };
    let cheaper = offer(ProviderId::Vast, "42", "A40", 0.45);
    assert_eq!(confirm(&c, Some(&cheaper)).unwrap().usd_per_hour, 0.45);
    let dearer = offer(ProviderId::Vast, "42", "A40", 0.61);
    let refused = confirm(&c, Some(&dearer)).unwrap_err();
    assert_eq!(refused.class, FailureClass::PriceExceeded);
    assert_eq!(
        refused.message,
        "offer 42 on vast now costs $0.6100/h, above the maximum $0.6000/h"
    );
}

#[test]
fn a_vanished_offer_was_taken_by_another_renter() {
    let c = spot_candidate(0.2, 0.2, 1.0);
    let refused = confirm(&c, None).unwrap_err();
    assert_eq!(
        (refused.class, refused.message.as_str()),
        (
            FailureClass::OfferTaken,
            "offer 42 no longer available on vast"
        )
    );
}

#[test]
fn a_spot_bid_is_raised_to_a_higher_fresh_minimum_only_within_the_ceiling() {
    let c = spot_candidate(0.2, 0.2, 0.5);
    let mut fresh = c.offer.clone();
    fresh.capacity = OfferCapacity::Spot {
        min_bid_per_hour: 0.3,
    };
    let confirmed = confirm(&c, Some(&fresh)).unwrap();
    assert_eq!(
        (confirmed.usd_per_hour, confirmed.bid_per_hour),
        (0.3, Some(0.3))
    );
    fresh.capacity = OfferCapacity::Spot {
        min_bid_per_hour: 0.55,
    };
    assert_eq!(
        confirm(&c, Some(&fresh)).unwrap_err().class,
        FailureClass::PriceExceeded
    );
}
