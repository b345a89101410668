//! Vast.ai's response decoding for [`crate::fuzzing`]: the offer search (on-demand and as bids),
//! an instance page, one instance, the rental outcome, and the error classification.

use neocloud_core::OfferQuery;

use super::convert;
use super::errors;
use super::wire::{Offers, One, Outcome, Page};
use crate::fuzzing::Decoded;
use crate::http::{Call, Http, Reply};
use crate::provider::Operation;

pub(crate) fn decode(http: &Http, reply: &Reply, query: &OfferQuery, out: &mut Decoded) {
    let body = reply.body.as_str();
    if let Ok(offers) = serde_json::from_str::<Offers>(body) {
        for bid in [false, true] {
            let converted = offers
                .offers
                .iter()
                .filter_map(|o| convert::offer(o, query, bid));
            out.offers.extend(converted);
        }
    }
    if let Ok(page) = serde_json::from_str::<Page>(body) {
        out.states.extend(page.instances.iter().map(convert::state));
    }
    if let Ok(one) = serde_json::from_str::<One>(body) {
        out.states
            .extend(one.instances.as_ref().map(convert::state));
    }
    let outcome: Outcome = serde_json::from_str(body).unwrap_or_default();
    let _ = errors::class(reply.status.as_u16(), &outcome);
    out.errors.push(errors::error(
        http,
        Call::new(Operation::Create, None),
        reply,
    ));
}
