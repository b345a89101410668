//! Vast.ai wire shapes: request bodies (with the strict shapes they are checked against), the
//! documented error bodies, and the JSON of offers and instances.
//!
//! Not behaviour: state changes live in `state`, routing in `handlers`.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::schema::{Field, Ty, Violation, opt};
use crate::server::json as json_response;

/// The body of `PUT /api/v0/asks/{id}/`: the fields vast-cli and the docs send.
pub(crate) const CREATE_FIELDS: &[Field] = &[
    opt("client_id", Ty::Str),
    opt("image", Ty::Str),
    opt("disk", Ty::Num),
    opt("label", Ty::Str),
    opt("env", Ty::Any),
    opt("onstart", Ty::Str),
    opt("runtype", Ty::Str),
    opt("args", Ty::StrList),
    opt("args_str", Ty::Str),
    opt("price", Ty::Num),
    opt("target_state", Ty::Str),
    opt("cancel_unavail", Ty::Bool),
    opt("image_login", Ty::Str),
    opt("template_hash_id", Ty::Str),
    opt("user", Ty::Str),
    opt("volume_info", Ty::Any),
    opt("extra", Ty::Str),
    opt("python_utf8", Ty::Bool),
    opt("lang_utf8", Ty::Bool),
    opt("use_jupyter_lab", Ty::Bool),
    opt("jupyter_dir", Ty::Str),
    opt("force", Ty::Bool),
];

/// Values of `runtype`.
pub(crate) const RUNTYPES: &[&str] = &[
    "ssh",
    "jupyter",
    "args",
    "ssh_proxy",
    "ssh_direct",
    "jupyter_proxy",
    "jupyter_direct",
];

/// The longest `onstart` script accepted.
pub(crate) const MAX_ONSTART: usize = 4048;

/// A validated create request.
#[derive(Clone, Default, Deserialize)]
pub(crate) struct CreateRequest {
    pub image: Option<String>,
    pub disk: Option<f64>,
    #[serde(default)]
    pub label: String,
    pub env: Option<Value>,
    #[serde(default)]
    pub onstart: String,
    pub runtype: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    pub price: Option<f64>,
    pub target_state: Option<String>,
    #[serde(default)]
    pub cancel_unavail: bool,
    pub template_hash_id: Option<String>,
    /// `docker login` arguments (`-u USER -p PASS REGISTRY`) for a private image.
    pub image_login: Option<String>,
}

/// `Debug` shows what identifies it only: its env and start command carry the runner's secrets.
impl std::fmt::Debug for CreateRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateRequest")
            .field("image", &self.image)
            .field("label", &self.label)
            .field("runtype", &self.runtype)
            .finish_non_exhaustive()
    }
}

/// The body of `PUT /api/v0/instances/{id}/`.
pub(crate) const UPDATE_FIELDS: &[Field] = &[opt("label", Ty::Str), opt("state", Ty::Str)];

/// The body of `PUT /api/v0/instances/bid_price/{id}/`.
pub(crate) const BID_FIELDS: &[Field] = &[opt("client_id", Ty::Str), opt("price", Ty::Num)];

/// `{"success":false,"error":code,"msg":msg}` with a status.
pub(crate) fn error(status: StatusCode, code: &str, msg: &str) -> Response {
    json_response(
        status,
        &json!({ "success": false, "error": code, "msg": msg }),
    )
}

/// 400 `invalid_args` naming the first violation's field.
pub(crate) fn invalid_args(violation: &Violation, ask_id: Option<u64>) -> Response {
    let msg = match violation {
        Violation::Unknown { name, .. } => format!("error 400/3467: unexpected field '{name}'"),
        Violation::Missing { name, .. } => format!("error 400/3467: missing field '{name}'"),
        Violation::WrongType { want, got, .. } => format!(
            "error 400/3467: field '{}' must be {want}, got {got}",
            violation.field()
        ),
    };
    args_error(&msg, ask_id)
}

/// 400 `invalid_args` with a message.
pub(crate) fn args_error(msg: &str, ask_id: Option<u64>) -> Response {
    let body = json!({ "success": false, "error": "invalid_args", "msg": msg, "ask_id": ask_id });
    json_response(StatusCode::BAD_REQUEST, &body)
}

/// The offer was rented by someone else or never existed (404 `3603`, or 410 `3907` with
/// `cancel_unavail`).
pub(crate) fn no_such_ask(ask_id: u64, cancel_unavail: bool) -> Response {
    if cancel_unavail {
        let msg =
            format!("error 410/3907: no_such_ask Instance type {ask_id} is no longer available.");
        return error(StatusCode::GONE, "no_such_ask", &msg);
    }
    let msg = format!("error 404/3603: no_such_ask Instance type by id {ask_id} is not available.");
    error(StatusCode::NOT_FOUND, "invalid_args", &msg)
}

/// A bid below the minimum: the stopped instance's id is in `new_contract`.
pub(crate) fn bid_too_low(ask_id: u64, new_contract: u64, bid: f64, min_bid: f64) -> Response {
    let msg = format!(
        "error 400/3467: bid price {bid:.4} is below the minimum bid {min_bid:.4}; \
         instance {new_contract} was created in the stopped state"
    );
    let body = json!({
        "success": false, "error": "invalid_price", "msg": msg,
        "ask_id": ask_id, "new_contract": new_contract,
    });
    json_response(StatusCode::BAD_REQUEST, &body)
}

/// `401 auth_error`.
pub(crate) fn unauthorized() -> Response {
    error(StatusCode::UNAUTHORIZED, "auth_error", "Invalid user key")
}

/// The bundles endpoint's answer to a wrong key (404, sic).
pub(crate) fn bundles_unauthorized() -> Response {
    json_response(StatusCode::NOT_FOUND, &json!({ "msg": "Invalid user key" }))
}

/// 400 `invalid_request` for the bundles endpoint.
pub(crate) fn invalid_request(detail: &str) -> Response {
    let msg = format!("Invalid json body: {detail}");
    json_response(
        StatusCode::BAD_REQUEST,
        &json!({ "error": "invalid_request", "msg": msg }),
    )
}

/// 429 with `Retry-After` and the documented `{"detail":…}` body.
pub(crate) fn rate_limited(retry_after_secs: u64) -> Response {
    let body = json!({ "detail": "API requests too frequent endpoint threshold=4.5" });
    let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    response
}

/// A 5xx.
pub(crate) fn server_error(status: u16) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({ "success": false, "error": "server_error", "msg": "Internal server error" });
    (status, axum::Json(body)).into_response()
}
