//! Each cloud's response decoding (`neocloud_providers::fuzzing::decode`): the body is decoded as
//! every response the RunPod, Lambda or Vast adapter reads, converted to offers and instance
//! states, and classified as an error reply.
//!
//! The first byte picks the cloud (0 RunPod, 1 Lambda, 2 Vast, by remainder), the second the
//! HTTP status of the error reply; the rest is the body.
//!
//! Properties: no panic; every offer and state is of the cloud that answered; an offer has an
//! id, at least one GPU and a finite price that is not negative (a negative or infinite price
//! would rank first and pass every price limit); every error names the cloud and never contains
//! the API key in any case, even when the body echoes it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neocloud_core::ProviderId;
use neocloud_providers::fuzzing::{API_KEY, decode};

const STATUSES: [u16; 12] = [200, 400, 401, 402, 403, 404, 408, 409, 422, 429, 500, 503];

fuzz_target!(|data: &[u8]| {
    let [cloud, status, body @ ..] = data else {
        return;
    };
    let Ok(body) = std::str::from_utf8(body) else {
        return;
    };
    let provider =
        [ProviderId::Runpod, ProviderId::Lambda, ProviderId::Vast][usize::from(*cloud % 3)];
    let status = STATUSES[usize::from(*status) % STATUSES.len()];
    let decoded = decode(provider, status, body);
    for offer in &decoded.offers {
        assert_eq!(offer.provider, provider);
        assert!(!offer.id.is_empty(), "an offer without an id");
        assert!(offer.gpu_count >= 1, "an offer of {} GPUs", offer.gpu_count);
        let price = offer.price_per_hour;
        assert!(
            price.is_finite() && price >= 0.0,
            "an offer at {price} per hour"
        );
    }
    for state in &decoded.states {
        assert_eq!(state.provider, provider);
    }
    assert!(!decoded.errors.is_empty(), "no error for a reply");
    for error in &decoded.errors {
        assert_eq!(error.provider, provider);
        // In any case: adapters lower-case provider messages.
        let shown = format!("{error} {error:?}").to_ascii_lowercase();
        let key = API_KEY.to_ascii_lowercase();
        assert!(!shown.contains(&key), "the API key leaked: {shown}");
    }
});
