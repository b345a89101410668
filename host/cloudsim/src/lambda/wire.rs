//! Lambda Cloud wire shapes: the strict request shapes, the `{"data": …}` envelope and the
//! `{"error": {code, message, suggestion}}` error objects with their documented codes.
//!
//! Not behaviour: state changes live in `state`, routing in `handlers`.

use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::schema::{Field, Ty, Violation, opt, req};
use crate::server::json as respond;

const TAG: &[Field] = &[req("key", Ty::Str), req("value", Ty::Str)];
const MOUNT: &[Field] = &[req("mount_point", Ty::Str), req("file_system_id", Ty::Str)];
const IMAGE: &[Field] = &[opt("family", Ty::Str), opt("id", Ty::Str)];
const RULESET: &[Field] = &[req("id", Ty::Str)];

/// `POST /instance-operations/launch` (OpenAPI 1.10.0, plus the older `quantity`).
pub(crate) const LAUNCH_FIELDS: &[Field] = &[
    req("region_name", Ty::Str),
    req("instance_type_name", Ty::Str),
    req("ssh_key_names", Ty::StrList),
    opt("name", Ty::Str),
    opt("hostname", Ty::Str),
    opt("user_data", Ty::Str),
    opt("tags", Ty::ObjList(TAG)),
    opt("file_system_names", Ty::StrList),
    opt("file_system_mounts", Ty::ObjList(MOUNT)),
    opt("image", Ty::Obj(IMAGE)),
    opt("firewall_rulesets", Ty::ObjList(RULESET)),
    opt("quantity", Ty::Int),
];

/// `POST /instance-operations/terminate` and `/restart`.
pub(crate) const IDS_FIELDS: &[Field] = &[req("instance_ids", Ty::StrList)];

/// `POST /instances/{id}` (rename).
pub(crate) const RENAME_FIELDS: &[Field] = &[req("name", Ty::Str)];

/// `POST /ssh-keys`.
pub(crate) const SSH_KEY_FIELDS: &[Field] = &[req("name", Ty::Str), opt("public_key", Ty::Str)];

/// The longest `user_data` accepted (1 MB).
pub(crate) const MAX_USER_DATA: usize = 1_000_000;

/// A key/value tag.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Tag {
    pub key: String,
    pub value: String,
}

/// A validated launch request.
#[derive(Clone, Deserialize)]
pub(crate) struct LaunchRequest {
    pub region_name: String,
    pub instance_type_name: String,
    pub ssh_key_names: Vec<String>,
    pub name: Option<String>,
    pub hostname: Option<String>,
    pub user_data: Option<String>,
    #[serde(default)]
    pub tags: Vec<Tag>,
    #[serde(default)]
    pub file_system_names: Vec<String>,
    pub image: Option<Value>,
    pub quantity: Option<i64>,
}

/// `Debug` shows what identifies it only: its user_data carries the runner's secrets.
impl std::fmt::Debug for LaunchRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchRequest")
            .field("region_name", &self.region_name)
            .field("instance_type_name", &self.instance_type_name)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A list of instance ids.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct IdsRequest {
    pub instance_ids: Vec<String>,
}

/// `{"data": payload}` with 200.
pub(crate) fn data(payload: &impl Serialize) -> Response {
    respond(StatusCode::OK, &json!({ "data": payload }))
}

/// `{"error": {"code", "message", "suggestion"?}}` with a status.
pub(crate) fn error(
    status: StatusCode,
    code: &str,
    message: &str,
    suggestion: Option<&str>,
) -> Response {
    let mut object = json!({ "code": code, "message": message });
    if let Some(suggestion) = suggestion {
        object["suggestion"] = json!(suggestion);
    }
    respond(status, &json!({ "error": object }))
}

/// 400 `global/invalid-parameters`.
pub(crate) fn invalid(message: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "global/invalid-parameters",
        message,
        None,
    )
}

/// 400 `global/invalid-parameters` naming a violation's field.
pub(crate) fn invalid_field(violation: &Violation) -> Response {
    let field = violation.field();
    let message = match violation {
        Violation::Unknown { .. } => format!("Invalid request data: unknown field '{field}'."),
        Violation::Missing { .. } => format!("Invalid request data: field '{field}' is required."),
        Violation::WrongType { want, got, .. } => {
            format!("Invalid request data: field '{field}' must be {want}, got {got}.")
        }
    };
    invalid(&message)
}

/// `global/object-does-not-exist` with a status (400 at launch, 404 elsewhere).
pub(crate) fn not_found(status: StatusCode, what: &str) -> Response {
    error(
        status,
        "global/object-does-not-exist",
        &format!("Specified {what} does not exist."),
        None,
    )
}

/// 400 `instance-operations/launch/insufficient-capacity`.
pub(crate) fn insufficient_capacity() -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "instance-operations/launch/insufficient-capacity",
        "Not enough capacity to fulfill launch request.",
        Some("Choose an instance type with more availability, or try again later."),
    )
}

/// 400 `global/quota-exceeded`.
pub(crate) fn quota_exceeded() -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "global/quota-exceeded",
        "Quota exceeded.",
        Some("Contact Support to increase your quota."),
    )
}

/// 401 `global/invalid-api-key`.
pub(crate) fn unauthorized() -> Response {
    error(
        StatusCode::UNAUTHORIZED,
        "global/invalid-api-key",
        "API key was invalid, expired, or deleted.",
        Some("Check your API key or create a new one, then try again."),
    )
}

/// 429 with `Retry-After`. The spec defines no body; this one uses the error envelope.
pub(crate) fn rate_limited(retry_after_secs: u64) -> Response {
    let mut response = error(
        StatusCode::TOO_MANY_REQUESTS,
        "global/rate-limited",
        "Too many requests.",
        Some("Wait before retrying."),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    response
}

/// A 5xx with `global/internal-error` (or `provider/internal-unavailable` for 503).
pub(crate) fn server_error(status: u16) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match status {
        StatusCode::SERVICE_UNAVAILABLE => error(
            status,
            "provider/internal-unavailable",
            "Provider is temporarily unavailable.",
            Some("Try again shortly."),
        ),
        _ => error(status, "global/internal-error", "Internal error.", None),
    }
}
