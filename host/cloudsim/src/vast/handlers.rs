//! Vast.ai HTTP handlers: offer search, rental, get, label/state/bid changes, destroy and the
//! paginated list, with the documented status codes and error bodies.
//!
//! Not state: every change goes through [`VastState`].

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::Response;
use bytes::Bytes;
use http::{Extensions, StatusCode};
use serde_json::{Map, Value, json};

use super::listing::ListRequest;
use super::render::{self, OFFER_COLUMNS};
use super::state::{self, Rental, VastState};
use super::wire::{self, CreateRequest};
use crate::faults::FaultKind;
use crate::schema::{self, Field};
use crate::server::{handler_fault, json as respond};

type Shared = State<Arc<VastState>>;

const SEARCH_OPTIONS: &[&str] = &[
    "order",
    "type",
    "limit",
    "allocated_storage",
    "disable_bundling",
];

fn ok() -> Response {
    respond(StatusCode::OK, &json!({ "success": true }))
}

fn parse_object(body: &Bytes) -> Result<Map<String, Value>, String> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("body must be a JSON object".to_string()),
        Err(error) => Err(error.to_string()),
    }
}

fn checked(body: &Bytes, shape: &'static [Field], ask: Option<u64>) -> Result<Value, Response> {
    let map =
        parse_object(body).map_err(|e| wire::args_error(&format!("error 400/3467: {e}"), ask))?;
    let value = Value::Object(map);
    match schema::check(&value, shape).first() {
        Some(violation) => Err(wire::invalid_args(violation, ask)),
        None => Ok(value),
    }
}

/// `POST /api/v0/bundles/`.
pub(crate) async fn search(State(sim): Shared, body: Bytes) -> Response {
    let query = match parse_object(&body) {
        Ok(query) => query,
        Err(detail) => return wire::invalid_request(&detail),
    };
    let filters = match super::query::parse(&query, OFFER_COLUMNS, SEARCH_OPTIONS) {
        Ok(filters) => filters,
        Err(detail) => return wire::invalid_request(&detail),
    };
    let bid = match query.get("type").map(|t| t.as_str()) {
        None | Some(Some("on-demand" | "ondemand" | "reserved")) => false,
        Some(Some("bid" | "interruptible")) => true,
        Some(_) => return wire::invalid_request("field 'type' must be on-demand, bid or reserved"),
    };
    let market = sim.core.market.lock();
    let mut offers: Vec<Value> = market
        .offers()
        .iter()
        .filter(|offer| offer.available > 0)
        .map(|offer| render::offer(offer, bid))
        .filter(|row| super::query::matches(row, &filters))
        .collect();
    drop(market);
    if let Err(detail) = sort_offers(&mut offers, query.get("order")) {
        return wire::invalid_request(&detail);
    }
    if let Some(limit) = query.get("limit").and_then(Value::as_u64) {
        offers.truncate(limit as usize);
    }
    respond(StatusCode::OK, &json!({ "offers": offers }))
}

fn sort_offers(offers: &mut [Value], order: Option<&Value>) -> Result<(), String> {
    let default = json!([["score", "desc"]]);
    let order = order.unwrap_or(&default);
    let keys = order.as_array().ok_or("field 'order' must be a list")?;
    for key in keys.iter().rev() {
        let column = key
            .get(0)
            .and_then(Value::as_str)
            .ok_or("field 'order' has a bad entry")?;
        if !OFFER_COLUMNS.contains(&column) {
            return Err(format!("unknown field '{column}' in 'order'"));
        }
        let desc = key.get(1).and_then(Value::as_str) == Some("desc");
        offers.sort_by(|a, b| {
            let (x, y) = (
                a[column].as_f64().unwrap_or(0.0),
                b[column].as_f64().unwrap_or(0.0),
            );
            let ord = x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal);
            if desc { ord.reverse() } else { ord }
        });
    }
    Ok(())
}

/// `PUT /api/v0/asks/{id}/`.
pub(crate) async fn rent(
    State(sim): Shared,
    Path(ask): Path<u64>,
    ext: Extensions,
    body: Bytes,
) -> Response {
    let request = match create_request(&body, ask) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let fault = handler_fault(&ext);
    if matches!(fault, Some(FaultKind::OfferVanishes)) {
        sim.core.market.lock().remove(ask);
    }
    if matches!(fault, Some(FaultKind::CapacityExhausted)) {
        return wire::no_such_ask(ask, request.cancel_unavail);
    }
    let low = matches!(fault, Some(FaultKind::BidTooLow));
    match sim.rent(ask, &request, low) {
        Rental::Created(id) => respond(
            StatusCode::OK,
            &json!({ "success": true, "new_contract": id, "instance_api_key": format!("ik-{id}") }),
        ),
        Rental::NoSuchAsk => wire::no_such_ask(ask, request.cancel_unavail),
        Rental::BidTooLow { id, min_bid } => {
            wire::bid_too_low(ask, id, request.price.unwrap_or_default(), min_bid)
        }
        Rental::QuotaExceeded => {
            wire::args_error("error 400/3467: instance limit reached", Some(ask))
        }
    }
}

fn create_request(body: &Bytes, ask: u64) -> Result<CreateRequest, Response> {
    let value = checked(body, wire::CREATE_FIELDS, Some(ask))?;
    let request: CreateRequest = serde_json::from_value(value)
        .map_err(|e| wire::args_error(&format!("error 400/3467: {e}"), Some(ask)))?;
    if let Some(message) = broken_rule(&request) {
        return Err(wire::args_error(
            &format!("error 400/3467: {message}"),
            Some(ask),
        ));
    }
    if request.price.is_some_and(|price| price <= 0.0) {
        let msg = "error 400/3467: field 'price' must be positive";
        let body = json!({"success": false, "error": "invalid_price", "msg": msg, "ask_id": ask});
        return Err(respond(StatusCode::BAD_REQUEST, &body));
    }
    Ok(request)
}

/// The first field rule a create request breaks, as a message naming the field.
fn broken_rule(r: &CreateRequest) -> Option<&'static str> {
    let runtype = r.runtype.as_deref();
    let state = r.target_state.as_deref();
    let rules = [
        (
            r.image.is_none() && r.template_hash_id.is_none(),
            "missing field 'image' (or 'template_hash_id')",
        ),
        (
            r.onstart.len() > wire::MAX_ONSTART,
            "field 'onstart' is longer than 4048 characters",
        ),
        (
            runtype.is_some_and(|t| !wire::RUNTYPES.contains(&t)),
            "field 'runtype' must be one of ssh, jupyter, args, ssh_proxy, ssh_direct, jupyter_proxy, jupyter_direct",
        ),
        (
            state.is_some_and(|s| s != "running" && s != "stopped"),
            "field 'target_state' must be running or stopped",
        ),
        (
            r.env
                .as_ref()
                .is_some_and(|e| !(e.is_object() || e.is_string())),
            "field 'env' must be an object or a string",
        ),
    ];
    rules
        .into_iter()
        .find(|(broken, _)| *broken)
        .map(|(_, message)| message)
}

/// Parses `env` in its dict form (`{"K":"V","-p 8080:8080":"1"}`) or docker-flag string form
/// (`"-e K=V -p 8080:8080"`) into environment pairs; port flags are not environment.
pub(crate) fn parse_env(env: Option<&Value>) -> Vec<(String, String)> {
    match env {
        Some(Value::Object(map)) => map
            .iter()
            .filter(|(key, _)| !key.starts_with('-'))
            .map(|(key, value)| (key.clone(), value.as_str().unwrap_or_default().to_string()))
            .collect(),
        Some(Value::String(flags)) => {
            let words: Vec<&str> = flags.split_whitespace().collect();
            words
                .windows(2)
                .filter(|pair| pair[0] == "-e")
                .filter_map(|pair| pair[1].split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// `GET /api/v0/instances/{id}/`: `{"instances": {...}}`, or `{"instances": null}` if unknown.
pub(crate) async fn get(State(sim): Shared, Path(id): Path<u64>) -> Response {
    respond(StatusCode::OK, &json!({ "instances": sim.get(id) }))
}

/// `DELETE /api/v0/instances/{id}/`.
pub(crate) async fn destroy(State(sim): Shared, Path(id): Path<u64>) -> Response {
    if sim.destroy(id) {
        return ok();
    }
    wire::error(StatusCode::NOT_FOUND, "not_found", "Instance not found")
}

/// `PUT /api/v0/instances/{id}/` with `{"label":…}` and/or `{"state":"stopped"|"running"}`.
pub(crate) async fn update(State(sim): Shared, Path(id): Path<u64>, body: Bytes) -> Response {
    let value = match checked(&body, wire::UPDATE_FIELDS, None) {
        Ok(value) => value,
        Err(response) => return response,
    };
    let label = value
        .get("label")
        .and_then(Value::as_str)
        .map(str::to_string);
    if !sim.update(id, label, None) {
        return wire::error(StatusCode::NOT_FOUND, "not_found", "Instance not found");
    }
    let changed = match value.get("state").and_then(Value::as_str) {
        None => true,
        Some("stopped") => {
            sim.stop(id);
            true
        }
        Some("running") => sim.start(id),
        Some(_) => {
            return wire::args_error(
                "error 400/3467: field 'state' must be running or stopped",
                None,
            );
        }
    };
    if changed {
        ok()
    } else {
        wire::args_error("error 400/3467: bid is below the minimum bid", None)
    }
}

/// `PUT /api/v0/instances/bid_price/{id}/`: a bid at or above the minimum restarts an outbid
/// instance.
pub(crate) async fn change_bid(State(sim): Shared, Path(id): Path<u64>, body: Bytes) -> Response {
    let value = match checked(&body, wire::BID_FIELDS, None) {
        Ok(value) => value,
        Err(response) => return response,
    };
    let Some(price) = value
        .get("price")
        .and_then(Value::as_f64)
        .filter(|p| *p > 0.0)
    else {
        return wire::error(
            StatusCode::BAD_REQUEST,
            "invalid_price",
            "error 400/3467: field 'price' must be positive",
        );
    };
    if !sim.update(id, None, Some(price)) {
        return wire::error(StatusCode::NOT_FOUND, "not_found", "Instance not found");
    }
    sim.start(id);
    ok()
}

/// `GET /api/v1/instances/`: keyset pagination with `limit` (max 25; ≤0 means 5),
/// `after_token`, `select_filters` and `order_by` on `id`; each parameter JSON-encoded.
pub(crate) async fn list(
    State(sim): Shared,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let request = match ListRequest::parse(&params) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let page = sim.page(&request.filters, request.after, request.limit, request.desc);
    let body = json!({
        "success": true,
        "instances_found": page.found,
        "total_instances": page.total,
        "label_counts": page.label_counts,
        "next_token": page.next_after.map(state::token),
        "instances": page.instances,
    });
    respond(StatusCode::OK, &body)
}
