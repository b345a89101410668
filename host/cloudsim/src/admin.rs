//! The admin HTTP API served beside every provider API under `/_admin`: arm and clear faults,
//! read the billing ledger, inspect and change the market, preempt or break instances.
//!
//! Not authenticated and not part of any provider's API; the fault middleware never applies here.
//!
//! | Method and path | Body | Answer |
//! |---|---|---|
//! | `GET /_admin/faults` | | armed faults with remaining counts |
//! | `POST /_admin/faults` | [`FaultRule`] | 201 `{"id":N}` |
//! | `DELETE /_admin/faults` | | 204, all disarmed |
//! | `GET /_admin/ledger` | | [`LedgerSummary`] |
//! | `GET /_admin/offers` | | market offers with remaining capacity |
//! | `PUT /_admin/offers/{id}` | `{"available":N}` | 204, or 404 |
//! | `DELETE /_admin/offers/{id}` | | 204 (the offer vanishes), or 404 |
//! | `POST /_admin/instances/{id}/preempt` | | 204, or 404 |
//! | `POST /_admin/instances/{id}/fail` | | 204, or 404 (it will never become ready) |

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::faults::FaultRule;
use crate::ledger::{LedgerEntry, LedgerReport};
use crate::server::{Core, SimOps, json};

#[derive(Debug, Clone)]
struct Admin {
    core: Arc<Core>,
    ops: Arc<dyn SimOps>,
}

/// The ledger as the admin API returns it.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerSummary {
    /// Every instance ever created.
    pub entries: Vec<LedgerEntry>,
    /// How many are not terminated.
    pub live: usize,
    /// Names held by more than one live instance.
    pub duplicate_live_names: Vec<String>,
    /// Total USD accrued.
    pub total_cost_usd: f64,
}

impl From<LedgerReport> for LedgerSummary {
    fn from(report: LedgerReport) -> Self {
        Self {
            live: report.live().len(),
            duplicate_live_names: report.duplicate_live_names(),
            total_cost_usd: report.total_cost_usd(),
            entries: report.entries,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapacityBody {
    available: u32,
}

pub(crate) fn router(core: Arc<Core>, ops: Arc<dyn SimOps>) -> Router {
    Router::new()
        .route(
            "/_admin/faults",
            get(list_faults).post(add_fault).delete(clear_faults),
        )
        .route("/_admin/ledger", get(ledger))
        .route("/_admin/offers", get(offers))
        .route(
            "/_admin/offers/{id}",
            put(set_capacity).delete(remove_offer),
        )
        .route("/_admin/instances/{id}/preempt", post(preempt))
        .route("/_admin/instances/{id}/fail", post(fail))
        .with_state(Admin { core, ops })
}

async fn list_faults(State(admin): State<Admin>) -> Response {
    json(StatusCode::OK, &admin.core.faults.lock().list())
}

async fn add_fault(State(admin): State<Admin>, Json(rule): Json<FaultRule>) -> Response {
    let id = admin.core.faults.lock().add(rule);
    json(StatusCode::CREATED, &serde_json::json!({ "id": id }))
}

async fn clear_faults(State(admin): State<Admin>) -> StatusCode {
    admin.core.faults.lock().clear();
    StatusCode::NO_CONTENT
}

async fn ledger(State(admin): State<Admin>) -> Response {
    let report = admin.core.ledger.lock().report();
    json(StatusCode::OK, &LedgerSummary::from(report))
}

async fn offers(State(admin): State<Admin>) -> Response {
    json(StatusCode::OK, &admin.core.market.lock().offers())
}

async fn set_capacity(
    State(admin): State<Admin>,
    Path(id): Path<u64>,
    Json(body): Json<CapacityBody>,
) -> StatusCode {
    found(admin.core.market.lock().set_capacity(id, body.available))
}

async fn remove_offer(State(admin): State<Admin>, Path(id): Path<u64>) -> StatusCode {
    found(admin.core.market.lock().remove(id))
}

async fn preempt(State(admin): State<Admin>, Path(id): Path<String>) -> impl IntoResponse {
    found(admin.ops.preempt(&id))
}

async fn fail(State(admin): State<Admin>, Path(id): Path<String>) -> StatusCode {
    found(admin.ops.fail(&id))
}

fn found(done: bool) -> StatusCode {
    if done {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}
