//! RunPod REST v2 registry credentials (`/v2/registries`): create → 201 `{id, name}`, list, get,
//! delete → 204 (404 if unknown). Credentials are write-only: no answer carries the username
//! or password. A name already taken is a 409 (names are unique per account).
//!
//! Not the pull itself: a pod names a credential by id in `registry` (GraphQL
//! `containerRegistryAuthId`), and `state` checks its login against `private_registries`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use super::handlers::checked;
use super::state::{RunpodState, SavedRegistry};
use super::wire;
use crate::schema::{Field, Ty, req};
use crate::server::json as respond;

type Shared = State<Arc<RunpodState>>;

/// The body of `POST /v2/registries`.
const CREATE_FIELDS: &[Field] = &[
    req("name", Ty::Str),
    req("username", Ty::Str),
    req("password", Ty::Str),
];

fn render(id: &str, saved: &SavedRegistry) -> Value {
    json!({ "id": id, "name": saved.name })
}

fn not_found(id: &str) -> Response {
    let detail = format!("registry credential {id} not found");
    wire::problem(StatusCode::NOT_FOUND, &detail, None)
}

/// `POST /v2/registries` → 201.
pub(crate) async fn create(State(sim): Shared, body: Bytes) -> Response {
    let value = match checked(&body, CREATE_FIELDS) {
        Ok(value) => value,
        Err(response) => return response,
    };
    let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
    let saved = SavedRegistry {
        name: text("name"),
        username: text("username"),
        password: text("password"),
    };
    if saved.name.is_empty() {
        return wire::unprocessable(vec!["$.name: minLength: got 0, want 1".to_owned()]);
    }
    let mut all = sim.registries.lock();
    if all.values().any(|r| r.name == saved.name) {
        let detail = format!("a registry credential named {} already exists", saved.name);
        return wire::problem(StatusCode::CONFLICT, &detail, None);
    }
    let id = uuid::Uuid::new_v4().simple().to_string()[..20].to_string();
    let answer = render(&id, &saved);
    all.insert(id, saved);
    respond(StatusCode::CREATED, &answer)
}

/// `GET /v2/registries` → every credential, without logins.
pub(crate) async fn list(State(sim): Shared) -> Response {
    let all = sim.registries.lock();
    let listed: Vec<Value> = all.iter().map(|(id, r)| render(id, r)).collect();
    respond(StatusCode::OK, &listed)
}

/// `GET /v2/registries/{id}`.
pub(crate) async fn get(State(sim): Shared, Path(id): Path<String>) -> Response {
    match sim.registries.lock().get(&id) {
        Some(saved) => respond(StatusCode::OK, &render(&id, saved)),
        None => not_found(&id),
    }
}

/// `DELETE /v2/registries/{id}` → 204, 404 if unknown.
pub(crate) async fn delete(State(sim): Shared, Path(id): Path<String>) -> Response {
    match sim.registries.lock().remove(&id) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => not_found(&id),
    }
}
