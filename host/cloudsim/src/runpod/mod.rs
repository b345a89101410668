//! The RunPod simulator (`provider-apis.md` §1): REST v2 under `/v2` (pods: create → 201, get,
//! list, delete → 204, action; catalog: GPUs with availability, data centers; account SSH keys)
//! with strict 422 validation and RFC 9457 problem bodies, and GraphQL at `/graphql` for
//! interruptible (spot) pods, since v2 has none. [`base_url`](crate::SimHandle::base_url) is the
//! origin (the real one is `https://api.runpod.io`); paths are `/v2/...` and `/graphql`.
//!
//! Statuses: `PROVISIONING` → `STARTING` → `RUNNING`; `EXITED` on stop or preemption (`cost` is 0
//! and billing stops); deleted pods are gone (404). `runtime` and `ssh.direct` are null until
//! `RUNNING`. Capacity errors are 400s recognised only by their `detail` text.
//!
//! Opt-in `run_user_data` runs the pod's start command's runner: when a pod is created (REST
//! `args`, GraphQL `dockerArgs`) with a start command `sh -c SCRIPT` whose last line execs
//! `neocloud-runner …`, that runner is started as a local process with the pod's `env` once the
//! pod is `RUNNING` (again after a start or restart); stopping, preempting, failing or deleting
//! the pod kills it (see `crate::runner`).
//!
//! Registry credentials (`/v2/registries`) are write-only; a pod whose image is on one of
//! `private_registries` and whose `registry` credential does not hold that registry's login is
//! `ERROR` from the start, as a pod whose pull is refused never runs.
//!
//! Not REST v1 (retired 2026-11-15), network volumes, templates, clusters or CPU pods.

mod gql;
mod graphql;
mod handlers;
mod registries;
mod render;
mod state;
mod wire;

use std::ops::Deref;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::{get, post, put};

use crate::auth::{Presented, presented};
use crate::config::{OfferConfig, SimConfig};
use crate::error::SimError;
use crate::server::{Core, Dialect, SimHandle, SimOps};
use state::RunpodState;

/// A running RunPod simulator.
#[derive(Debug)]
pub struct RunpodSim {
    handle: SimHandle,
    state: Arc<RunpodState>,
}

impl Deref for RunpodSim {
    type Target = SimHandle;
    fn deref(&self) -> &SimHandle {
        &self.handle
    }
}

impl RunpodSim {
    /// Starts the simulator on 127.0.0.1 (port from the config; 0 picks one).
    pub async fn start(config: SimConfig) -> Result<Self, SimError> {
        let core = Core::new("runpod", config, default_offers, 1, dialect());
        let state = RunpodState::new(core.clone());
        let ops: Arc<dyn SimOps> = Arc::new(Ops(state.clone()));
        let handle = SimHandle::launch(core, ops, routes(state.clone()), "").await?;
        Ok(Self { handle, state })
    }

    /// The names of the account's registry credentials (`/v2/registries`).
    pub fn registry_names(&self) -> Vec<String> {
        let all = self.state.registries.lock();
        all.values().map(|r| r.name.clone()).collect()
    }
}

impl Drop for RunpodSim {
    /// Kills the runners it started (`run_user_data`).
    fn drop(&mut self) {
        self.state.runners.shutdown();
    }
}

#[derive(Debug)]
struct Ops(Arc<RunpodState>);

impl SimOps for Ops {
    fn preempt(&self, id: &str) -> bool {
        self.0.preempt(id)
    }

    fn fail(&self, id: &str) -> bool {
        self.0.fail(id)
    }
}

fn routes(state: Arc<RunpodState>) -> Router {
    Router::new()
        .route("/v2/pods", get(handlers::list).post(handlers::create))
        .route("/v2/pods/{id}", get(handlers::get).delete(handlers::delete))
        .route("/v2/pods/{id}/action", post(handlers::action))
        .route("/v2/catalog/gpus", get(handlers::catalog))
        .route("/v2/catalog/gpus/{id}", get(handlers::catalog_gpu))
        .route("/v2/catalog/datacenters", get(handlers::data_centers))
        .route("/v2/account/ssh-keys", put(handlers::ssh_keys))
        .route(
            "/v2/registries",
            get(registries::list).post(registries::create),
        )
        .route(
            "/v2/registries/{id}",
            get(registries::get).delete(registries::delete),
        )
        .route("/graphql", post(gql::graphql))
        .with_state(state)
}

fn dialect() -> Dialect {
    Dialect {
        authorize,
        rate_limited: wire::rate_limited,
        server_error: wire::server_error,
        decorate: wire::rate_limit_headers,
    }
}

fn authorize(req: &Request, route: &str, key: &str) -> Result<(), Response> {
    let graphql = route == "/graphql";
    match presented(req, key, false, graphql) {
        Presented::Valid => Ok(()),
        Presented::Nothing => Err(wire::unauthorized("missing bearer token")),
        Presented::Invalid => Err(wire::unauthorized("invalid bearer token")),
    }
}

#[allow(clippy::too_many_arguments)]
fn offer(
    gpu: &str,
    memory: u32,
    dc: &str,
    cloud: &str,
    price: f64,
    spot: f64,
    max: u32,
    capacity: u32,
) -> OfferConfig {
    OfferConfig {
        id: None,
        gpu: gpu.to_string(),
        gpu_count: max,
        gpu_memory_gb: memory,
        region: dc.to_string(),
        price_per_hour: price,
        spot_price_per_hour: Some(spot),
        capacity,
        reliability: 0.99,
        cloud: Some(cloud.to_string()),
        verified: true,
        vcpus: 16,
        ram_gb: 62,
        disk_gb: 200,
    }
}

/// The built-in market: GPU types per data center and cloud, prices per GPU, capacity in GPUs.
pub fn default_offers() -> Vec<OfferConfig> {
    vec![
        offer(
            "NVIDIA GeForce RTX 4090",
            24,
            "US-KS-2",
            "SECURE",
            0.69,
            0.35,
            8,
            8,
        ),
        offer(
            "NVIDIA GeForce RTX 4090",
            24,
            "US-TX-3",
            "COMMUNITY",
            0.34,
            0.20,
            4,
            4,
        ),
        offer("NVIDIA A40", 48, "CA-MTL-1", "SECURE", 0.40, 0.20, 8, 6),
        offer("NVIDIA A40", 48, "EU-SE-1", "SECURE", 0.40, 0.20, 8, 2),
        offer(
            "NVIDIA A100 80GB PCIe",
            80,
            "US-KS-2",
            "SECURE",
            1.64,
            0.82,
            8,
            4,
        ),
        offer(
            "NVIDIA H100 80GB HBM3",
            80,
            "EU-RO-1",
            "SECURE",
            2.99,
            1.75,
            8,
            8,
        ),
        offer("NVIDIA L4", 24, "US-OR-1", "COMMUNITY", 0.43, 0.22, 4, 0),
    ]
}
