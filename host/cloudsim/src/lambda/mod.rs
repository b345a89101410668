//! The Lambda Cloud simulator (OpenAPI 1.10.0, `provider-apis.md` §2): `/instance-types` with
//! capacity per region, `/regions`, launch with name, tags, exactly one existing SSH key name and
//! `user_data` (rate limited: 1 per 12 s by default), get, list, rename, terminate, restart and SSH
//! keys, in the `{"data"}` / `{"error":{code,message,suggestion}}` envelopes.
//! [`base_url`](crate::SimHandle::base_url) ends in `/api/v1`, like
//! `https://cloud.lambda.ai/api/v1`.
//!
//! Statuses: `booting` → `active`; `terminating` → gone (404) after the terminating delay;
//! `preempted` via the admin API. Auth: Bearer or Basic (`KEY:`).
//!
//! Opt-in `run_user_data` starts the `neocloud-runner` command of a launch's cloud-init
//! `user_data` as a local process once the instance is active (see `runner`).
//!
//! Not file systems (naming one at launch is `global/object-does-not-exist`), firewall rules or
//! images beyond accepting their shape.

mod handlers;
mod render;
mod runner;
mod state;
mod wire;

use std::ops::Deref;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::{delete, get, post};

use crate::auth::{Presented, presented};
use crate::config::{OfferConfig, SimConfig};
use crate::error::SimError;
use crate::server::{Core, Dialect, SimHandle, SimOps, plain};
use state::LambdaState;

/// A running Lambda Cloud simulator.
#[derive(Debug)]
pub struct LambdaSim {
    handle: SimHandle,
    state: Arc<LambdaState>,
}

impl Deref for LambdaSim {
    type Target = SimHandle;
    fn deref(&self) -> &SimHandle {
        &self.handle
    }
}

impl LambdaSim {
    /// Starts the simulator on 127.0.0.1 (port from the config; 0 picks one).
    pub async fn start(config: SimConfig) -> Result<Self, SimError> {
        let core = Core::new("lambda", config, default_offers, 1, dialect());
        let state = Arc::new(LambdaState::new(core.clone()));
        let ops: Arc<dyn SimOps> = Arc::new(Ops(state.clone()));
        let handle = SimHandle::launch(core, ops, routes(state.clone()), "/api/v1").await?;
        Ok(Self { handle, state })
    }

    /// How many launches the simulated rate limit refused with a 429, as Lambda counts them
    /// when they arrive.
    pub fn refused_launches(&self) -> u64 {
        self.state.refused_launches()
    }
}

impl Drop for LambdaSim {
    /// Kills the runners it started (`run_user_data`).
    fn drop(&mut self) {
        self.state.runners.shutdown();
    }
}

#[derive(Debug)]
struct Ops(Arc<LambdaState>);

impl SimOps for Ops {
    fn preempt(&self, id: &str) -> bool {
        self.0.preempt(id)
    }

    fn fail(&self, id: &str) -> bool {
        self.0.fail(id)
    }
}

fn routes(state: Arc<LambdaState>) -> Router {
    Router::new()
        .route("/api/v1/instance-types", get(handlers::instance_types))
        .route("/api/v1/regions", get(handlers::regions))
        .route("/api/v1/instance-operations/launch", post(handlers::launch))
        .route(
            "/api/v1/instance-operations/terminate",
            post(handlers::terminate),
        )
        .route(
            "/api/v1/instance-operations/restart",
            post(handlers::restart),
        )
        .route("/api/v1/instances", get(handlers::list))
        .route(
            "/api/v1/instances/{id}",
            get(handlers::get).post(handlers::rename),
        )
        .route(
            "/api/v1/ssh-keys",
            get(handlers::list_keys).post(handlers::add_key),
        )
        .route("/api/v1/ssh-keys/{id}", delete(handlers::delete_key))
        .with_state(state)
}

fn dialect() -> Dialect {
    Dialect {
        authorize,
        rate_limited: wire::rate_limited,
        server_error: wire::server_error,
        decorate: plain,
    }
}

fn authorize(req: &Request, _route: &str, key: &str) -> Result<(), Response> {
    match presented(req, key, true, false) {
        Presented::Valid => Ok(()),
        _ => Err(wire::unauthorized()),
    }
}

fn offer(
    name: &str,
    gpus: u32,
    memory: u32,
    region: &str,
    price: f64,
    capacity: u32,
) -> OfferConfig {
    OfferConfig {
        id: None,
        gpu: name.to_string(),
        gpu_count: gpus,
        gpu_memory_gb: memory,
        region: region.to_string(),
        price_per_hour: price,
        spot_price_per_hour: None,
        capacity,
        reliability: 0.999,
        cloud: None,
        verified: true,
        vcpus: 30 * gpus,
        ram_gb: 200 * gpus,
        disk_gb: 512 * gpus,
    }
}

/// The built-in market: instance types per region with a few instances of capacity each.
pub fn default_offers() -> Vec<OfferConfig> {
    vec![
        offer("gpu_1x_a10", 1, 24, "us-east-1", 0.75, 3),
        offer("gpu_1x_a10", 1, 24, "us-west-1", 0.75, 2),
        offer("gpu_1x_a100", 1, 40, "us-east-1", 1.29, 2),
        offer("gpu_1x_a100_sxm4", 1, 40, "us-west-2", 1.29, 1),
        offer("gpu_1x_h100_sxm5", 1, 80, "us-east-1", 3.29, 1),
        offer("gpu_8x_h100_sxm5", 8, 80, "us-west-3", 23.92, 1),
        offer("gpu_1x_gh200", 1, 96, "us-east-3", 1.49, 0),
    ]
}
