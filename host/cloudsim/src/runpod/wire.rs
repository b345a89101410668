//! RunPod wire shapes: the strict REST v2 request shapes, RFC 9457 problem bodies
//! (`application/problem+json`), the capacity text, and GraphQL error envelopes.
//!
//! Not behaviour: state changes live in `state`, routing in `handlers` and `gql`.

use std::collections::BTreeMap;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::schema::{Field, Ty, Violation, opt, req};

const GPU: &[Field] = &[
    req("id", Ty::Str),
    opt("count", Ty::Int),
    opt("allowedCudaVersions", Ty::StrList),
    opt("minCudaVersion", Ty::Str),
];
const CPU: &[Field] = &[
    req("id", Ty::Str),
    opt("vcpuCount", Ty::Int),
    opt("memory", Ty::Int),
];
const NETWORK_MOUNT: &[Field] = &[req("volumeId", Ty::Str), req("path", Ty::Str)];
const PERSISTENT_MOUNT: &[Field] = &[req("size", Ty::Int), req("path", Ty::Str)];
const MOUNTS: &[Field] = &[
    opt("network", Ty::ObjList(NETWORK_MOUNT)),
    opt("persistent", Ty::Obj(PERSISTENT_MOUNT)),
];

/// `POST /v2/pods` (`unevaluatedProperties: false`).
pub(crate) const CREATE_FIELDS: &[Field] = &[
    req("name", Ty::Str),
    opt("image", Ty::Str),
    opt("gpu", Ty::Obj(GPU)),
    opt("cpu", Ty::Obj(CPU)),
    opt("cloud", Ty::Str),
    opt("dataCenterIds", Ty::StrList),
    opt("disk", Ty::Int),
    opt("env", Ty::StrMap),
    opt("ports", Ty::StrList),
    opt("args", Ty::Str),
    opt("mounts", Ty::Obj(MOUNTS)),
    opt("startSsh", Ty::Bool),
    opt("startJupyter", Ty::Bool),
    opt("templateId", Ty::Str),
    opt("registry", Ty::Str),
    opt("globalNetworking", Ty::Bool),
];

/// `POST /v2/pods/{id}/action`.
pub(crate) const ACTION_FIELDS: &[Field] = &[req("action", Ty::Str)];

/// `PUT /v2/account/ssh-keys`.
pub(crate) const SSH_KEYS_FIELDS: &[Field] = &[req("keys", Ty::StrList)];

/// The capacity message (400 on REST, an `errors` entry on GraphQL).
pub(crate) const NO_CAPACITY: &str = "There are no longer any instances available with the requested specifications. Please refresh and try again.";

/// A `gpu` object of a create request.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct GpuRequest {
    pub id: String,
    pub count: Option<i64>,
}

/// A validated `POST /v2/pods` body (the fields the simulator acts on).
#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreatePod {
    pub name: String,
    pub image: Option<String>,
    pub gpu: Option<GpuRequest>,
    pub cpu: Option<Value>,
    pub cloud: Option<String>,
    #[serde(default)]
    pub data_center_ids: Vec<String>,
    pub disk: Option<i64>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub ports: Vec<String>,
    pub args: Option<String>,
    pub mounts: Option<Value>,
    pub template_id: Option<String>,
    pub registry: Option<String>,
}

/// `Debug` shows what identifies it only: its env carries the runner's secrets.
impl std::fmt::Debug for CreatePod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatePod")
            .field("name", &self.name)
            .field("image", &self.image)
            .finish_non_exhaustive()
    }
}

/// An RFC 9457 problem response.
pub(crate) fn problem(status: StatusCode, detail: &str, errors: Option<Vec<String>>) -> Response {
    let mut body = json!({
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(errors) = errors {
        body["errors"] = json!(errors);
    }
    let mut response = (status, axum::Json(body)).into_response();
    let problem_json = HeaderValue::from_static("application/problem+json");
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, problem_json);
    response
}

/// 422 listing JSON-Schema-style messages (`$: additional properties 'bogus' not allowed`).
pub(crate) fn unprocessable(errors: Vec<String>) -> Response {
    problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation failed",
        Some(errors),
    )
}

/// The message a violation gets in a 422.
pub(crate) fn violation_message(violation: &Violation) -> String {
    match violation {
        Violation::Unknown { path, name } => {
            format!("{path}: additional properties '{name}' not allowed")
        }
        Violation::Missing { path, name } => format!("{path}: missing property '{name}'"),
        Violation::WrongType { path, want, got } => format!("{path}: got {got}, want {want}"),
    }
}

/// 400 with only the human-readable capacity `detail`.
pub(crate) fn no_capacity() -> Response {
    problem(StatusCode::BAD_REQUEST, NO_CAPACITY, None)
}

/// 401.
pub(crate) fn unauthorized(detail: &str) -> Response {
    problem(StatusCode::UNAUTHORIZED, detail, None)
}

/// 404 for an unknown pod.
pub(crate) fn pod_not_found(id: &str) -> Response {
    problem(StatusCode::NOT_FOUND, &format!("pod {id} not found"), None)
}

/// 429 with `Retry-After` and the documented `RateLimit` headers.
pub(crate) fn rate_limited(retry_after_secs: u64) -> Response {
    let detail = "rate limit exceeded for the minute window";
    let mut response = problem(StatusCode::TOO_MANY_REQUESTS, detail, None);
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    let limit = format!("\"minute\";r=0;t={retry_after_secs}");
    if let Ok(value) = HeaderValue::from_str(&limit) {
        headers.insert("ratelimit", value);
    }
    response
}

/// The `RateLimit` and `RateLimit-Policy` headers of every authenticated response (a quota the
/// simulator never exhausts; 429s come from faults).
pub(crate) fn rate_limit_headers(response: &mut Response) {
    let headers = response.headers_mut();
    if !headers.contains_key("ratelimit") {
        let limit = "\"minute\";r=59;t=60, \"hour\";r=2999;t=3600, \"day\";r=49999;t=86400";
        headers.insert("ratelimit", HeaderValue::from_static(limit));
    }
    headers.insert("ratelimit-policy", HeaderValue::from_static(POLICY));
}

const POLICY: &str = "\"minute\";q=60;w=60, \"hour\";q=3000;w=3600, \"day\";q=50000;w=86400";

/// A 5xx.
pub(crate) fn server_error(status: u16) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    problem(
        status,
        "Something went wrong. Please try again later or contact support.",
        None,
    )
}

/// A resolver error: HTTP 200 with `errors` and `data.{field}: null`.
pub(crate) fn gql_error(field: &str, message: &str) -> Response {
    let body = json!({
        "errors": [{ "message": message, "path": [field], "extensions": { "code": "RUNPOD" } }],
        "data": { field: null },
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// A document that does not parse or validate: HTTP 400 with `errors` and no `data`.
pub(crate) fn gql_invalid(message: &str, code: &str) -> Response {
    let body = json!({ "errors": [{ "message": message, "extensions": { "code": code } }] });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// `{"data": data}` with 200.
pub(crate) fn gql_data(data: &Value) -> Response {
    (StatusCode::OK, axum::Json(json!({ "data": data }))).into_response()
}
