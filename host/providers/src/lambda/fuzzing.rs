//! Lambda Cloud's response decoding for [`crate::fuzzing`]: the instance types with their
//! regions, the instance list, one instance, the launch answer, and the error envelope.

use neocloud_core::OfferQuery;

use super::convert;
use super::errors;
use super::wire::{Data, Instance, InstanceTypes, Launched};
use crate::fuzzing::Decoded;
use crate::http::{Call, Http, Reply};
use crate::provider::Operation;

pub(crate) fn decode(http: &Http, reply: &Reply, query: &OfferQuery, out: &mut Decoded) {
    let body = reply.body.as_str();
    if let Ok(types) = serde_json::from_str::<Data<InstanceTypes>>(body) {
        for entry in types.data.values() {
            out.offers.extend(convert::offers(entry, query));
        }
    }
    if let Ok(all) = serde_json::from_str::<Data<Vec<Instance>>>(body) {
        out.states.extend(all.data.iter().map(convert::state));
    }
    if let Ok(one) = serde_json::from_str::<Data<Instance>>(body) {
        out.states.push(convert::state(&one.data));
    }
    drop(serde_json::from_str::<Data<Launched>>(body));
    out.errors.push(errors::error(
        http,
        Call::new(Operation::Create, None),
        reply,
    ));
}
