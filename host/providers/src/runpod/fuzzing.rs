//! RunPod's response decoding for [`crate::fuzzing`]: the pod list, one pod, the GPU catalog
//! with spot prices, the spot rental answer, and the REST and GraphQL errors.

use neocloud_core::OfferQuery;

use super::convert::{self, SpotTable};
use super::errors::{gql_error, rest_error};
use super::wire::{Catalog, GqlResponse, Pod, PodList, Rented, SpotPrices};
use crate::fuzzing::Decoded;
use crate::http::{Call, Http, Reply};
use crate::provider::Operation;

pub(crate) fn decode(http: &Http, reply: &Reply, query: &OfferQuery, out: &mut Decoded) {
    let body = reply.body.as_str();
    let call = Call::new(Operation::Get, None);
    if let Ok(list) = serde_json::from_str::<PodList>(body) {
        out.states.extend(list.pods.iter().map(convert::state));
    }
    if let Ok(pod) = serde_json::from_str::<Pod>(body) {
        out.states.push(convert::state(&pod));
    }
    let spot = serde_json::from_str::<GqlResponse<SpotPrices>>(body).ok();
    if let Some(errors) = spot.as_ref().map(|r| &r.errors).filter(|e| !e.is_empty()) {
        out.errors.push(gql_error(http, call, errors));
    }
    let table: SpotTable = spot
        .and_then(|r| r.data)
        .map(|d| d.gpu_types.into_iter())
        .into_iter()
        .flatten()
        .map(|p| (p.id, (p.secure_spot_price, p.community_spot_price)))
        .collect();
    if let Ok(catalog) = serde_json::from_str::<Catalog>(body) {
        for gpu in &catalog.gpus {
            for cloud in ["SECURE", "COMMUNITY"] {
                let offers = convert::catalog_offers(gpu, cloud, query, (true, true), &table);
                out.offers.extend(offers);
            }
        }
    }
    if let Ok(rented) = serde_json::from_str::<GqlResponse<Rented>>(body)
        && !rented.errors.is_empty()
    {
        out.errors.push(gql_error(http, call, &rented.errors));
    }
    out.errors.push(rest_error(http, call, reply));
}
