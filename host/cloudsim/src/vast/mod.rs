//! The Vast.ai simulator: offer search (`POST /api/v0/bundles/`), rental (`PUT /api/v0/asks/{id}/`
//! → `new_contract`), get (`GET /api/v0/instances/{id}/`), label and state changes, bid changes,
//! destroy, and the keyset-paginated list (`GET /api/v1/instances/`), as documented in
//! `provider-apis.md` §3. Every path is served with and without its trailing slash.
//! [`base_url`](crate::SimHandle::base_url) is the origin (the real one is
//! `https://console.vast.ai`).
//!
//! Statuses: `actual_status` goes `null` → `loading` → `running`; preemption and low bids give
//! `stopped` in all of `actual_status`, `intended_status`, `cur_state` and `next_state`.
//!
//! Opt-in `run_user_data` runs the instance's start command's runner: when an ask is rented
//! with `runtype: "args"` and `args` `["sh", "-c", SCRIPT]` whose last line execs
//! `neocloud-runner …`, that runner is started as a local process with the request's `env`
//! (not its `-p …` port keys) once the instance is `running` (again after a start); stopping
//! (preemption, outbid), failing or destroying the instance kills it (see `crate::runner`).
//!
//! Not the CLI's query-string language, volumes, templates, SSH-key registration or the bulk
//! destroy.

mod handlers;
mod listing;
mod query;
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
use crate::server::{Core, Dialect, SimHandle, SimOps, plain};
use state::VastState;

const BUNDLES: &str = "/api/v0/bundles/";

/// A running Vast.ai simulator.
#[derive(Debug)]
pub struct VastSim {
    handle: SimHandle,
    state: Arc<VastState>,
}

impl Deref for VastSim {
    type Target = SimHandle;
    fn deref(&self) -> &SimHandle {
        &self.handle
    }
}

impl VastSim {
    /// Starts the simulator on 127.0.0.1 (port from the config; 0 picks one).
    pub async fn start(config: SimConfig) -> Result<Self, SimError> {
        let core = Core::new("vast", config, default_offers, 5_000_000, dialect());
        let state = VastState::new(core.clone());
        let ops: Arc<dyn SimOps> = Arc::new(Ops(state.clone()));
        let handle = SimHandle::launch(core, ops, routes(state.clone()), "").await?;
        Ok(Self { handle, state })
    }

    /// Adds `count` running on-demand instances labelled `{label_prefix}{n}` (rented from the
    /// first offer, outside its capacity), e.g. to benchmark listing 1,000 instances.
    pub fn seed_instances(&self, count: usize, label_prefix: &str) -> Vec<u64> {
        self.state.seed(count, label_prefix)
    }
}

impl Drop for VastSim {
    /// Kills the runners it started (`run_user_data`).
    fn drop(&mut self) {
        self.state.runners.shutdown();
    }
}

#[derive(Debug)]
struct Ops(Arc<VastState>);

impl SimOps for Ops {
    fn preempt(&self, id: &str) -> bool {
        id.parse().is_ok_and(|id| self.0.stop(id))
    }

    fn fail(&self, id: &str) -> bool {
        id.parse().is_ok_and(|id| self.0.fail(id))
    }
}

fn routes(state: Arc<VastState>) -> Router {
    let paths: [(&str, axum::routing::MethodRouter<Arc<VastState>>); 5] = [
        (BUNDLES, post(handlers::search)),
        ("/api/v0/asks/{id}/", put(handlers::rent)),
        (
            "/api/v0/instances/{id}/",
            get(handlers::get)
                .put(handlers::update)
                .delete(handlers::destroy),
        ),
        (
            "/api/v0/instances/bid_price/{id}/",
            put(handlers::change_bid),
        ),
        ("/api/v1/instances/", get(handlers::list)),
    ];
    let mut router = Router::new();
    for (path, method_router) in paths {
        router = router
            .route(path, method_router.clone())
            .route(path.trim_end_matches('/'), method_router);
    }
    router.with_state(state)
}

fn dialect() -> Dialect {
    Dialect {
        authorize,
        rate_limited: wire::rate_limited,
        server_error: wire::server_error,
        decorate: plain,
    }
}

fn authorize(req: &Request, route: &str, key: &str) -> Result<(), Response> {
    let search = route.trim_end_matches('/') == BUNDLES.trim_end_matches('/');
    match presented(req, key, false, true) {
        Presented::Valid => Ok(()),
        Presented::Nothing if search => Ok(()),
        Presented::Invalid if search => Err(wire::bundles_unauthorized()),
        _ => Err(wire::unauthorized()),
    }
}

fn offer(
    gpu: &str,
    count: u32,
    memory: u32,
    region: &str,
    price: f64,
    reliability: f64,
) -> OfferConfig {
    OfferConfig {
        id: None,
        gpu: gpu.to_string(),
        gpu_count: count,
        gpu_memory_gb: memory,
        region: region.to_string(),
        price_per_hour: price,
        spot_price_per_hour: Some((price * 0.6 * 1000.0).round() / 1000.0),
        capacity: 1,
        reliability,
        cloud: None,
        verified: true,
        vcpus: 8 * count,
        ram_gb: 32 * count,
        disk_gb: 200,
    }
}

/// The built-in market: a few machines per GPU model, one rental each.
pub fn default_offers() -> Vec<OfferConfig> {
    vec![
        offer("GTX 1070", 1, 8, "Oslo, NO", 0.08, 0.97),
        offer("GTX 1070", 1, 8, "Austin, US", 0.09, 0.96),
        offer("RTX 4090", 1, 24, "Austin, US", 0.40, 0.995),
        offer("RTX 4090", 1, 24, "Quebec, CA", 0.38, 0.98),
        offer("RTX 4090", 2, 24, "Berlin, DE", 0.79, 0.99),
        offer("A100 SXM4", 1, 80, "Dallas, US", 1.10, 0.995),
        offer("H100 SXM", 1, 80, "Helsinki, FI", 2.20, 0.999),
        offer("H100 SXM", 8, 80, "Ashburn, US", 17.50, 0.999),
    ]
}
