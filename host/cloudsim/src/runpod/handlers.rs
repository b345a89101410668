//! RunPod REST v2 handlers: pods (create, get, list, delete, action), the GPU and data-center
//! catalog, and account SSH keys, validated as strictly as the v2 OpenAPI spec
//! (`unevaluatedProperties: false` → 422).
//!
//! Not GraphQL (see `gql`) and not state (see `state`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{Extensions, StatusCode};
use serde_json::{Value, json};

use super::render;
use super::state::{ActionError, CreateError, NewPod, Placement, Pod, RunpodState};
use super::wire::{self, CreatePod};
use crate::faults::FaultKind;
use crate::schema::{self, Field};
use crate::server::{handler_fault, json as respond};

type Shared = State<Arc<RunpodState>>;

const CLOUDS: &[&str] = &["SECURE", "COMMUNITY"];
const ACTIONS: &[&str] = &["start", "stop", "restart", "terminate"];

pub(crate) fn checked(body: &Bytes, shape: &'static [Field]) -> Result<Value, Response> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        wire::problem(
            StatusCode::BAD_REQUEST,
            &format!("invalid JSON body: {e}"),
            None,
        )
    })?;
    if !value.is_object() {
        return Err(wire::unprocessable(vec![
            "$: got non-object, want object".to_string(),
        ]));
    }
    let violations = schema::check(&value, shape);
    if violations.is_empty() {
        return Ok(value);
    }
    Err(wire::unprocessable(
        violations.iter().map(wire::violation_message).collect(),
    ))
}

fn render_pod(sim: &RunpodState, pod: &Pod) -> Value {
    render::pod_v2(pod, &sim.core, sim.core.clock.now())
}

/// `POST /v2/pods` → 201 with the pod.
pub(crate) async fn create(State(sim): Shared, ext: Extensions, body: Bytes) -> Response {
    let spec = match checked(&body, wire::CREATE_FIELDS).and_then(|v| new_pod(&sim, v)) {
        Ok(spec) => spec,
        Err(response) => return response,
    };
    if matches!(
        handler_fault(&ext),
        Some(FaultKind::CapacityExhausted | FaultKind::OfferVanishes)
    ) {
        return wire::no_capacity();
    }
    match sim.create(spec, false) {
        Ok(pod) => respond(StatusCode::CREATED, &render_pod(&sim, &pod)),
        Err(CreateError::UnknownGpu) => wire::unprocessable(vec![
            "$.gpu.id: value is not a known GPU type id".to_string(),
        ]),
        Err(CreateError::NoCapacity | CreateError::BidTooLow { .. }) => wire::no_capacity(),
        Err(CreateError::Quota) => wire::problem(
            StatusCode::PAYMENT_REQUIRED,
            "insufficient balance to deploy this pod",
            None,
        ),
    }
}

/// Applies the cross-field rules and turns a checked body into a [`NewPod`].
fn new_pod(sim: &RunpodState, value: Value) -> Result<NewPod, Response> {
    let body: CreatePod =
        serde_json::from_value(value).map_err(|e| wire::unprocessable(vec![format!("$: {e}")]))?;
    let mut errors = schema_rules(&body);
    errors.extend(unknown_data_centers(sim, &body.data_center_ids));
    if !errors.is_empty() {
        return Err(wire::unprocessable(errors));
    }
    cross_field(&body)?;
    let gpu = body.gpu.clone().ok_or_else(wire::no_capacity)?;
    let placement = Placement {
        gpu_id: gpu.id,
        count: gpu.count.unwrap_or(1) as u32,
        cloud: Some(body.cloud.clone().unwrap_or_else(|| "SECURE".to_string())),
        data_centers: body.data_center_ids.clone(),
        country: None,
    };
    let (name, image, env, ports, args) = (body.name, body.image, body.env, body.ports, body.args);
    let image = image.unwrap_or_default();
    let disk_gb = body.disk.unwrap_or(50);
    Ok(NewPod {
        name,
        image,
        placement,
        disk_gb,
        volume_gb: 0,
        env,
        ports,
        args,
        bid_per_gpu: None,
        registry: body.registry,
    })
}

/// The v2 schema's value rules (minLength, enums, minimum, patterns) as 422 messages.
fn schema_rules(body: &CreatePod) -> Vec<String> {
    let count = body.gpu.as_ref().and_then(|g| g.count);
    let rules = [
        (body.name.is_empty(), "$.name: minLength: got 0, want 1"),
        (
            body.image.is_none() && body.template_id.is_none(),
            "$: missing property 'image'",
        ),
        (
            body.cloud.as_deref().is_some_and(|c| !CLOUDS.contains(&c)),
            "$.cloud: value must be one of 'SECURE', 'COMMUNITY'",
        ),
        (
            count.is_some_and(|count| count < 1),
            "$.gpu.count: minimum: got < 1, want 1",
        ),
    ];
    let mut errors: Vec<String> = rules
        .into_iter()
        .filter(|(broken, _)| *broken)
        .map(|(_, m)| m.to_string())
        .collect();
    let ports = body
        .ports
        .iter()
        .enumerate()
        .filter(|(_, p)| !valid_port(p));
    errors.extend(
        ports.map(|(i, _)| format!("$.ports[{i}]: does not match pattern '^[0-9]+/(tcp|http)$'")),
    );
    errors
}

/// 400s for rules that span fields: exactly one of `gpu`/`cpu`, one kind of mount.
fn cross_field(body: &CreatePod) -> Result<(), Response> {
    let bad = |detail: &str| Err(wire::problem(StatusCode::BAD_REQUEST, detail, None));
    if body.gpu.is_some() == body.cpu.is_some() {
        return bad("exactly one of 'gpu' or 'cpu' must be set");
    }
    if body.cpu.is_some() {
        return bad("cpu pods are not available in this region");
    }
    let mounts = body.mounts.as_ref();
    if mounts.is_some_and(|m| m.get("network").is_some() && m.get("persistent").is_some()) {
        return bad("mounts: 'network' and 'persistent' are mutually exclusive");
    }
    if mounts
        .and_then(|m| m.pointer("/persistent/size"))
        .and_then(Value::as_i64)
        .is_some_and(|s| s < 10)
    {
        return bad("mounts.persistent.size must be at least 10");
    }
    Ok(())
}

fn valid_port(port: &str) -> bool {
    port.split_once('/').is_some_and(|(n, kind)| {
        !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) && matches!(kind, "tcp" | "http")
    })
}

fn unknown_data_centers(sim: &RunpodState, ids: &[String]) -> Vec<String> {
    let market = sim.core.market.lock();
    let known = |id: &str| market.offers().iter().any(|o| o.config.region == id);
    ids.iter()
        .enumerate()
        .filter(|(_, id)| !known(id))
        .map(|(i, id)| format!("$.dataCenterIds[{i}]: value '{id}' is not a known data center id"))
        .collect()
}

/// `GET /v2/pods`.
pub(crate) async fn list(State(sim): Shared) -> Response {
    let pods: Vec<Value> = sim.list().iter().map(|pod| render_pod(&sim, pod)).collect();
    respond(StatusCode::OK, &json!({ "pods": pods }))
}

/// `GET /v2/pods/{id}`.
pub(crate) async fn get(State(sim): Shared, Path(id): Path<String>) -> Response {
    match sim.get(&id) {
        Some(pod) => respond(StatusCode::OK, &render_pod(&sim, &pod)),
        None => wire::pod_not_found(&id),
    }
}

/// `DELETE /v2/pods/{id}` → 204, 404 if unknown.
pub(crate) async fn delete(State(sim): Shared, Path(id): Path<String>) -> Response {
    if sim.terminate(&id) {
        return StatusCode::NO_CONTENT.into_response();
    }
    wire::pod_not_found(&id)
}

/// `POST /v2/pods/{id}/action` → 200 with the pod, 204 for terminate, 409 if invalid now.
pub(crate) async fn action(State(sim): Shared, Path(id): Path<String>, body: Bytes) -> Response {
    let value = match checked(&body, wire::ACTION_FIELDS) {
        Ok(value) => value,
        Err(response) => return response,
    };
    let action = value["action"].as_str().unwrap_or_default();
    if !ACTIONS.contains(&action) {
        return wire::unprocessable(vec![
            "$.action: value must be one of 'start', 'stop', 'restart', 'terminate'".into(),
        ]);
    }
    let result = match action {
        "terminate" => return delete(State(sim), Path(id)).await,
        "start" => sim.start(&id, None),
        "stop" => sim.stop(&id),
        _ => sim.restart(&id),
    };
    match result {
        Ok(pod) => respond(StatusCode::OK, &render_pod(&sim, &pod)),
        Err(ActionError::NotFound) => wire::pod_not_found(&id),
        Err(ActionError::Conflict) => {
            let detail =
                format!("action '{action}' is not valid for pod {id} in its current state");
            wire::problem(StatusCode::CONFLICT, &detail, None)
        }
    }
}

/// `GET /v2/catalog/gpus`: `product` is required with `include=AVAILABILITY` and valid only
/// with it.
pub(crate) async fn catalog(
    State(sim): Shared,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let with_availability = q
        .get("include")
        .is_some_and(|i| i.split(',').any(|x| x == "AVAILABILITY"));
    if with_availability != q.contains_key("product") {
        let detail = "'product' is required with include=AVAILABILITY and valid only with it";
        return wire::problem(StatusCode::BAD_REQUEST, detail, None);
    }
    let market = sim.core.market.lock();
    let cloud = q.get("cloud").cloned();
    let gpus: Vec<Value> = render::by_gpu(market.offers())
        .into_iter()
        .map(|(id, offers)| {
            let offers: Vec<_> = offers
                .into_iter()
                .filter(|o| {
                    cloud
                        .as_ref()
                        .is_none_or(|c| o.config.cloud.as_deref().unwrap_or("SECURE") == c)
                })
                .collect();
            render::catalog_gpu(&id, &offers)
        })
        .collect();
    respond(StatusCode::OK, &json!({ "gpus": gpus }))
}

/// `GET /v2/catalog/gpus/{id}`.
pub(crate) async fn catalog_gpu(State(sim): Shared, Path(id): Path<String>) -> Response {
    let market = sim.core.market.lock();
    match render::by_gpu(market.offers()).get(&id) {
        Some(offers) => respond(StatusCode::OK, &render::catalog_gpu(&id, offers)),
        None => wire::problem(
            StatusCode::NOT_FOUND,
            &format!("gpu type {id} not found"),
            None,
        ),
    }
}

/// `GET /v2/catalog/datacenters`.
pub(crate) async fn data_centers(State(sim): Shared) -> Response {
    respond(
        StatusCode::OK,
        &render::data_centers(sim.core.market.lock().offers()),
    )
}

/// `PUT /v2/account/ssh-keys`.
pub(crate) async fn ssh_keys(State(sim): Shared, body: Bytes) -> Response {
    let value = match checked(&body, wire::SSH_KEYS_FIELDS) {
        Ok(value) => value,
        Err(response) => return response,
    };
    let keys: Vec<String> = serde_json::from_value(value["keys"].clone()).unwrap_or_default();
    *sim.ssh_keys.lock() = keys.clone();
    respond(StatusCode::OK, &json!({ "keys": keys }))
}
