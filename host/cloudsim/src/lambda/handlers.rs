//! Lambda Cloud HTTP handlers: instance types, regions, launch (validated strictly, rate
//! limited), get, list, rename, terminate, restart and SSH keys.
//!
//! Not state: every change goes through [`LambdaState`].

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::Response;
use bytes::Bytes;
use http::{Extensions, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::render;
use super::state::{Instance, LambdaState, LaunchError};
use super::wire::{self, IdsRequest, LaunchRequest};
use crate::faults::FaultKind;
use crate::schema::{self, Field};
use crate::server::handler_fault;

type Shared = State<Arc<LambdaState>>;

fn parse<T: DeserializeOwned>(body: &Bytes, shape: &'static [Field]) -> Result<T, Response> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        wire::invalid(&format!(
            "Invalid request data: body is not valid JSON: {e}."
        ))
    })?;
    if !value.is_object() {
        return Err(wire::invalid(
            "Invalid request data: body must be a JSON object.",
        ));
    }
    if let Some(violation) = schema::check(&value, shape).first() {
        return Err(wire::invalid_field(violation));
    }
    serde_json::from_value(value).map_err(|e| wire::invalid(&format!("Invalid request data: {e}.")))
}

fn render_all(sim: &LambdaState, instances: &[Instance]) -> Vec<Value> {
    let now = sim.core.clock.now();
    instances
        .iter()
        .map(|i| render::instance(i, &sim.core, now))
        .collect()
}

/// `GET /instance-types`.
pub(crate) async fn instance_types(State(sim): Shared) -> Response {
    wire::data(&render::instance_types(sim.core.market.lock().offers()))
}

/// `GET /regions`.
pub(crate) async fn regions(State(sim): Shared) -> Response {
    wire::data(&render::regions(sim.core.market.lock().offers()))
}

/// `POST /instance-operations/launch`.
pub(crate) async fn launch(State(sim): Shared, ext: Extensions, body: Bytes) -> Response {
    if let Err(wait) = sim.admit_launch() {
        return wire::rate_limited(wait);
    }
    let request: LaunchRequest = match parse(&body, wire::LAUNCH_FIELDS) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let quantity = match check_launch(&sim, &request) {
        Ok(quantity) => quantity,
        Err(response) => return response,
    };
    if matches!(
        handler_fault(&ext),
        Some(FaultKind::CapacityExhausted | FaultKind::OfferVanishes)
    ) {
        return wire::insufficient_capacity();
    }
    match sim.launch(&request, quantity) {
        Ok(ids) => {
            sim.start_runners(&ids, &request);
            wire::data(&json!({ "instance_ids": ids }))
        }
        Err(LaunchError::NoCapacity) => wire::insufficient_capacity(),
        Err(LaunchError::QuotaExceeded) => wire::quota_exceeded(),
        Err(LaunchError::UnknownType) => wire::invalid(&format!(
            "Invalid request data: field 'instance_type_name': unknown instance type '{}'.",
            request.instance_type_name
        )),
        Err(LaunchError::UnknownRegion) => wire::invalid(&format!(
            "Invalid request data: field 'region_name': unknown region '{}'.",
            request.region_name
        )),
    }
}

/// The launch rules beyond the body's shape; returns the quantity.
fn check_launch(sim: &LambdaState, request: &LaunchRequest) -> Result<u32, Response> {
    if let Some(message) = broken_rule(request) {
        return Err(wire::invalid(&format!("Invalid request data: {message}")));
    }
    let key = &request.ssh_key_names[0];
    if !sim.has_key(key) {
        let what = format!("SSH key '{key}'");
        return Err(wire::not_found(StatusCode::BAD_REQUEST, &what));
    }
    if let Some(fs) = request.file_system_names.first() {
        let what = format!("file system '{fs}'");
        return Err(wire::not_found(StatusCode::BAD_REQUEST, &what));
    }
    Ok(request.quantity.unwrap_or(1) as u32)
}

/// The first documented field rule the request breaks, as a message naming the field.
fn broken_rule(r: &LaunchRequest) -> Option<String> {
    let bad_tag = r.tags.iter().find(|t| !valid_tag_key(&t.key));
    let rules = [
        (
            r.ssh_key_names.len() != 1,
            "field 'ssh_key_names': currently, exactly one SSH key must be specified.",
        ),
        (
            r.name.as_ref().is_some_and(|n| n.chars().count() > 64),
            "field 'name' must be at most 64 characters.",
        ),
        (
            r.hostname.as_deref().is_some_and(|h| !valid_hostname(h)),
            "field 'hostname' must match ^[a-z0-9][0-9a-z-]{0,62}$.",
        ),
        (
            r.user_data
                .as_ref()
                .is_some_and(|u| u.len() > wire::MAX_USER_DATA),
            "field 'user_data' must be at most 1 MB.",
        ),
        (
            bad_tag.is_some(),
            "field 'tags': keys must match ^[a-z][a-z0-9-:]+$.",
        ),
        (
            r.image
                .as_ref()
                .is_some_and(|i| i.as_object().is_none_or(|o| o.len() != 1)),
            "field 'image' must have exactly one of 'family' or 'id'.",
        ),
        (
            !(1..=8).contains(&r.quantity.unwrap_or(1)),
            "field 'quantity' must be between 1 and 8.",
        ),
    ];
    rules
        .into_iter()
        .find(|(broken, _)| *broken)
        .map(|(_, message)| message.to_string())
}

fn valid_hostname(host: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut chars = host.chars();
    chars.next().is_some_and(ok) && host.len() <= 63 && chars.all(|c| ok(c) || c == '-')
}

fn valid_tag_key(key: &str) -> bool {
    let mut chars = key.chars();
    let rest_ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == ':';
    key.len() >= 2 && chars.next().is_some_and(|c| c.is_ascii_lowercase()) && chars.all(rest_ok)
}

/// `GET /instances`.
pub(crate) async fn list(State(sim): Shared) -> Response {
    wire::data(&render_all(&sim, &sim.list()))
}

/// `GET /instances/{id}`.
pub(crate) async fn get(State(sim): Shared, Path(id): Path<String>) -> Response {
    match sim.get(&id) {
        Some(instance) => wire::data(&render_all(&sim, &[instance])[0]),
        None => wire::not_found(StatusCode::NOT_FOUND, "instance"),
    }
}

/// `POST /instances/{id}`: rename.
pub(crate) async fn rename(State(sim): Shared, Path(id): Path<String>, body: Bytes) -> Response {
    let value: Value = match parse(&body, wire::RENAME_FIELDS) {
        Ok(value) => value,
        Err(response) => return response,
    };
    let name = value["name"].as_str().unwrap_or_default();
    match sim.rename(&id, name) {
        Some(instance) => wire::data(&render_all(&sim, &[instance])[0]),
        None => wire::not_found(StatusCode::NOT_FOUND, "instance"),
    }
}

/// `POST /instance-operations/terminate`.
pub(crate) async fn terminate(State(sim): Shared, body: Bytes) -> Response {
    let request: IdsRequest = match parse(&body, wire::IDS_FIELDS) {
        Ok(request) => request,
        Err(response) => return response,
    };
    match sim.terminate(&request.instance_ids) {
        Ok(done) => wire::data(&json!({ "terminated_instances": render_all(&sim, &done) })),
        Err(id) => wire::not_found(StatusCode::NOT_FOUND, &format!("instance '{id}'")),
    }
}

/// `POST /instance-operations/restart`.
pub(crate) async fn restart(State(sim): Shared, body: Bytes) -> Response {
    let request: IdsRequest = match parse(&body, wire::IDS_FIELDS) {
        Ok(request) => request,
        Err(response) => return response,
    };
    match sim.restart(&request.instance_ids) {
        Ok(done) => wire::data(&json!({ "restarted_instances": render_all(&sim, &done) })),
        Err(id) => wire::not_found(StatusCode::NOT_FOUND, &format!("instance '{id}'")),
    }
}

/// `GET /ssh-keys`.
pub(crate) async fn list_keys(State(sim): Shared) -> Response {
    wire::data(&sim.keys())
}

/// `POST /ssh-keys`: omitting `public_key` returns a generated `private_key`.
pub(crate) async fn add_key(State(sim): Shared, body: Bytes) -> Response {
    let value: Value = match parse(&body, wire::SSH_KEY_FIELDS) {
        Ok(value) => value,
        Err(response) => return response,
    };
    let name = value["name"].as_str().unwrap_or_default();
    let public_key = value["public_key"].as_str().unwrap_or_default();
    let Some(key) = sim.add_key(name, public_key) else {
        return wire::error(
            StatusCode::BAD_REQUEST,
            "global/duplicate",
            "SSH key name already in use.",
            None,
        );
    };
    let mut out = json!(key);
    if public_key.is_empty() {
        out["private_key"] =
            json!("-----BEGIN OPENSSH PRIVATE KEY-----\nsim\n-----END OPENSSH PRIVATE KEY-----\n");
    }
    wire::data(&out)
}

/// `DELETE /ssh-keys/{id}`.
pub(crate) async fn delete_key(State(sim): Shared, Path(id): Path<String>) -> Response {
    if sim.delete_key(&id) {
        return wire::data(&json!({}));
    }
    wire::not_found(StatusCode::NOT_FOUND, "SSH key")
}
