//! Every cloud's response decoding in one call, for the fuzz targets in `fuzz/` only: a body is
//! decoded as each response type its adapter reads and converted as the adapter converts it
//! (offers, instance states), and classified as the error of a non-2xx reply.
//!
//! Not used by the adapters and not an API: it only reaches the crate-private wire types and
//! conversions without a server.

use std::sync::OnceLock;

use neocloud_core::{InstanceState, Offer, OfferQuery, ProviderId};
use reqwest::StatusCode;

use crate::http::{ApiKey, Http, HttpConfig, Reply};
use crate::provider::ProviderError;

/// The API key of the clients used here: no error message may contain it.
pub const API_KEY: &str = "Fuzz-Secret-API-key-7F3a";

/// What one body decoded to, by every decoder of one cloud.
#[derive(Debug, Default)]
pub struct Decoded {
    /// Offers converted from every offer listing the body decoded as.
    pub offers: Vec<Offer>,
    /// Instance states converted from every instance shape the body decoded as.
    pub states: Vec<InstanceState>,
    /// The classified errors of the body, as a non-2xx reply and as a GraphQL answer.
    pub errors: Vec<ProviderError>,
}

/// Decodes `body` as every response of `provider` (RunPod, Lambda or Vast; others decode
/// nothing) and classifies it as an error reply with `status`.
pub fn decode(provider: ProviderId, status: u16, body: &str) -> Decoded {
    let mut out = Decoded::default();
    let Ok(status) = StatusCode::from_u16(status) else {
        return out;
    };
    let reply = Reply {
        status,
        retry_after: None,
        body: body.to_owned(),
    };
    let query = OfferQuery::default();
    match provider {
        ProviderId::Runpod => {
            crate::runpod::fuzzing::decode(http(0, provider), &reply, &query, &mut out)
        }
        ProviderId::Lambda => {
            crate::lambda::fuzzing::decode(http(1, provider), &reply, &query, &mut out)
        }
        ProviderId::Vast => {
            crate::vast::fuzzing::decode(http(2, provider), &reply, &query, &mut out)
        }
        _ => {}
    }
    out
}

/// One client per cloud, built once (building one sets up TLS).
fn http(slot: usize, provider: ProviderId) -> &'static Http {
    static CLIENTS: [OnceLock<Http>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    CLIENTS[slot].get_or_init(|| {
        Http::new(
            provider,
            "http://127.0.0.1:9",
            ApiKey::new(API_KEY),
            HttpConfig::default(),
        )
        .expect("a client without TLS roots to load")
    })
}
