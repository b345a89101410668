//! The checks of a Wasm guest's answer (`neocloud_policy::wasm::validate`), called directly on
//! decisions built from the input, the way the host calls them after a guest returns; no guest
//! runs.
//!
//! The first byte picks the role (placement scores or order, fallback, pricing, a guest error),
//! the second the number of offers; the rest is read as little-endian numbers or UTF-8 text.
//!
//! Properties, checked against an independent statement of the WIT contract: an answer is
//! accepted exactly when the contract allows it (scores aligned and finite; indices in range and
//! unique; prices finite and not negative; reasons at most `MAX_REASON_BYTES`); a rejection says
//! why; a guest error's message is cut on a character boundary to a prefix of at most
//! `MAX_ERROR_MESSAGE_BYTES` and its code is kept.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neocloud_policy::wasm::bindings::{
    Bid, ErrorCode, FallbackAction, PlacementDecision, PolicyError, PriceDecision,
};
use neocloud_policy::wasm::output_limits::{MAX_ERROR_MESSAGE_BYTES, MAX_REASON_BYTES};
use neocloud_policy::wasm::validate;

fuzz_target!(|data: &[u8]| {
    let [role, offers, rest @ ..] = data else {
        return;
    };
    let count = usize::from(*offers);
    match role % 5 {
        0 => scores(&f64s(rest), count),
        1 => order(&u32s(rest), count),
        2 => fallback(rest),
        3 => pricing(rest),
        _ => guest_error(rest, *offers),
    }
});

fn scores(scores: &[f64], offers: usize) {
    let got = validate::placement(&PlacementDecision::Scores(scores.to_vec()), offers);
    let valid = scores.len() == offers && scores.iter().all(|s| s.is_finite());
    agree(got, valid, "scores");
}

fn order(order: &[u32], offers: usize) {
    let got = validate::placement(&PlacementDecision::Order(order.to_vec()), offers);
    let mut seen = std::collections::BTreeSet::new();
    let valid = order.len() <= offers
        && order
            .iter()
            .all(|&i| (i as usize) < offers && seen.insert(i));
    agree(got, valid, "order");
}

fn fallback(rest: &[u8]) {
    let (tag, text) = rest.split_first().unwrap_or((&0, &[]));
    let reason = String::from_utf8_lossy(text).into_owned();
    let word = u32s(text).first().copied().unwrap_or(0);
    let (action, valid) = match tag % 4 {
        0 => (FallbackAction::RetrySame(word), true),
        1 => (FallbackAction::NextOffer, true),
        2 => (FallbackAction::Wait(word), true),
        _ => {
            let valid = reason.len() <= MAX_REASON_BYTES;
            (FallbackAction::GiveUp(reason), valid)
        }
    };
    agree(validate::fallback(&action), valid, "fallback");
}

fn pricing(rest: &[u8]) {
    let (tag, body) = rest.split_first().unwrap_or((&0, &[]));
    let ok = |p: f64| p.is_finite() && p >= 0.0;
    let (decision, valid) = if tag % 2 == 0 {
        let prices = f64s(body);
        let max = prices.first().copied().unwrap_or(0.0);
        let spot = (tag % 4 == 0).then(|| prices.get(1).copied().unwrap_or(0.0));
        let bid = Bid {
            max_price_per_hour: max,
            spot_bid_per_hour: spot,
        };
        (PriceDecision::Accept(bid), ok(max) && spot.is_none_or(ok))
    } else {
        let reason = String::from_utf8_lossy(body).into_owned();
        let valid = reason.len() <= MAX_REASON_BYTES;
        (PriceDecision::Reject(reason), valid)
    };
    agree(validate::pricing(&decision), valid, "pricing");
}

fn guest_error(rest: &[u8], code: u8) {
    let message = String::from_utf8_lossy(rest).into_owned();
    let code = match code % 3 {
        0 => ErrorCode::InvalidInput,
        1 => ErrorCode::Unsupported,
        _ => ErrorCode::Internal,
    };
    let cut = validate::guest_error(PolicyError {
        code,
        message: message.clone(),
    });
    assert_eq!(cut.code, code);
    assert!(message.starts_with(&cut.message), "not a prefix");
    assert!(cut.message.len() <= MAX_ERROR_MESSAGE_BYTES, "not cut");
    assert!(
        message.len() <= MAX_ERROR_MESSAGE_BYTES && cut.message == message
            || cut.message.len() + 4 > MAX_ERROR_MESSAGE_BYTES,
        "cut more than one character short of the bound"
    );
}

fn agree(got: Result<(), String>, valid: bool, what: &str) {
    match got {
        Ok(()) => assert!(valid, "{what}: an invalid answer was accepted"),
        Err(reason) => {
            assert!(!valid, "{what}: a valid answer was rejected: {reason}");
            assert!(!reason.is_empty(), "{what}: a rejection without a reason");
        }
    }
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}
