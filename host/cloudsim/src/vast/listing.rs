//! The query parameters of `GET /api/v1/instances/`: each JSON-encoded (vast-cli sends
//! `limit=25`, `after_token="…"`, `select_filters={"label":{"eq":"…"}}`,
//! `order_by=[{"col":"id","dir":"asc"}]`), with the documented limits.
//!
//! Not the listing itself (see `state::VastState::page`).

use std::collections::HashMap;

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::query::{self, Condition};
use super::render::INSTANCE_COLUMNS;
use super::state::{self, MAX_PAGE, SMALL_PAGE};
use super::wire;
use crate::server::json as respond;

const PARAMS: &[&str] = &[
    "limit",
    "after_token",
    "select_filters",
    "order_by",
    "select_cols",
    "owner",
];

/// A parsed list request.
#[derive(Debug)]
pub(crate) struct ListRequest {
    pub filters: Vec<Condition>,
    pub after: Option<u64>,
    pub limit: usize,
    pub desc: bool,
}

impl ListRequest {
    /// Parses the query; unknown parameters and bad values are 400 `invalid_args`, bad tokens
    /// 400 `invalid_token`.
    pub fn parse(params: &HashMap<String, String>) -> Result<Self, Response> {
        let bad = |msg: String| wire::args_error(&msg, None);
        if let Some(unknown) = params.keys().find(|k| !PARAMS.contains(&k.as_str())) {
            return Err(bad(format!("unknown query parameter '{unknown}'")));
        }
        Ok(Self {
            limit: limit(params.get("limit")).map_err(bad)?,
            after: after(params.get("after_token"))?,
            filters: filters(params.get("select_filters")).map_err(bad)?,
            desc: order_desc(params.get("order_by")).map_err(bad)?,
        })
    }
}

/// A JSON-encoded query parameter, or the raw text as a string if it is not JSON.
fn decode(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

/// At most 25; zero or negative means 5; absent means 25.
fn limit(raw: Option<&String>) -> Result<usize, String> {
    let Some(raw) = raw else {
        return Ok(MAX_PAGE);
    };
    match decode(raw).as_i64() {
        Some(n) if n <= 0 => Ok(SMALL_PAGE),
        Some(n) => Ok((n as usize).min(MAX_PAGE)),
        None => Err("query parameter 'limit' must be an integer".to_string()),
    }
}

fn after(raw: Option<&String>) -> Result<Option<u64>, Response> {
    let invalid = || {
        respond(
            StatusCode::BAD_REQUEST,
            &json!({ "error": "invalid_token" }),
        )
    };
    match raw.map(|t| decode(t)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(token)) => state::parse_token(&token).map(Some).ok_or_else(invalid),
        Some(_) => Err(invalid()),
    }
}

fn filters(raw: Option<&String>) -> Result<Vec<Condition>, String> {
    match raw.map(|f| decode(f)) {
        None => Ok(Vec::new()),
        Some(Value::Object(map)) => query::parse(&map, INSTANCE_COLUMNS, &[]),
        Some(_) => Err("query parameter 'select_filters' must be a JSON object".to_string()),
    }
}

fn order_desc(raw: Option<&String>) -> Result<bool, String> {
    let Some(raw) = raw else {
        return Ok(false);
    };
    let value = decode(raw);
    let first = value
        .as_array()
        .and_then(|keys| keys.first())
        .cloned()
        .unwrap_or(Value::Null);
    match (
        first.get("col").and_then(Value::as_str),
        first.get("dir").and_then(Value::as_str),
    ) {
        (Some("id"), Some("desc")) => Ok(true),
        (Some("id"), None | Some("asc")) => Ok(false),
        _ => Err(
            "query parameter 'order_by' supports only [{\"col\":\"id\",\"dir\":\"asc|desc\"}]"
                .into(),
        ),
    }
}
