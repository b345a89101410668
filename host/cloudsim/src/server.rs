//! What every provider simulator shares: the [`Core`] state (config, clock, market, ledger,
//! faults), the request middleware that checks auth and applies faults, starting the HTTP server
//! on 127.0.0.1, and the [`SimHandle`] that tests hold.
//!
//! Not provider behaviour: each provider module supplies its routes, its [`Dialect`] (how it
//! spells auth, capacity, rate-limit and server errors) and its [`SimOps`].

use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::clock::SimClock;
use crate::config::{OfferConfig, SimConfig};
use crate::error::SimError;
use crate::faults::{ArmedFault, FaultKind, FaultRule, Faults};
use crate::ledger::{Ledger, LedgerReport};
use crate::market::{Market, Offer};

/// How a provider spells its generic errors, and how it authenticates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialect {
    /// Checks credentials for a request to `route`; `Err` is the 401 (or equivalent) response.
    pub authorize: fn(&Request, &str, &str) -> Result<(), Response>,
    /// 429 with `Retry-After`.
    pub rate_limited: fn(u64) -> Response,
    /// A 5xx.
    pub server_error: fn(u16) -> Response,
    /// Adds headers every authenticated response carries (RunPod's `RateLimit`).
    pub decorate: fn(&mut Response),
}

/// A [`Dialect::decorate`] that adds nothing.
pub(crate) fn plain(_: &mut Response) {}

/// A fault the middleware leaves to the handler (capacity, vanished offer, low bid).
#[derive(Debug, Clone)]
pub(crate) struct HandlerFault(pub FaultKind);

/// The handler-level fault in a request's extensions, if any.
pub(crate) fn handler_fault(extensions: &http::Extensions) -> Option<FaultKind> {
    extensions
        .get::<HandlerFault>()
        .map(|HandlerFault(kind)| kind.clone())
}

/// State shared by one simulator's handlers and admin API.
#[derive(Debug)]
pub(crate) struct Core {
    pub provider: &'static str,
    pub config: SimConfig,
    pub clock: SimClock,
    pub market: Mutex<Market>,
    pub ledger: Mutex<Ledger>,
    pub faults: Mutex<Faults>,
    pub dialect: Dialect,
}

impl Core {
    /// Builds the state, using `default_offers` when the config has no market.
    pub fn new(
        provider: &'static str,
        config: SimConfig,
        default_offers: fn() -> Vec<OfferConfig>,
        first_offer_id: u64,
        dialect: Dialect,
    ) -> Arc<Self> {
        let clock = SimClock::new();
        let offers = config.offers.clone().unwrap_or_else(default_offers);
        let mut faults = Faults::default();
        for rule in &config.faults {
            faults.add(rule.clone());
        }
        Arc::new(Self {
            provider,
            clock,
            market: Mutex::new(Market::new(offers, first_offer_id)),
            ledger: Mutex::new(Ledger::new(provider, clock)),
            faults: Mutex::new(faults),
            dialect,
            config,
        })
    }
}

/// Provider operations the admin API needs.
pub(crate) trait SimOps: Send + Sync + Debug {
    /// Preempts an instance the provider's way; false if unknown or already gone.
    fn preempt(&self, id: &str) -> bool;
    /// Breaks an instance so it never becomes ready; false if unknown.
    fn fail(&self, id: &str) -> bool;
}

async fn intercept(State(core): State<Arc<Core>>, req: Request, next: Next) -> Response {
    let method = req.method().as_str().to_owned();
    let route = match req.extensions().get::<MatchedPath>() {
        Some(matched) => matched.as_str().to_owned(),
        None => req.uri().path().to_owned(),
    };
    if let Err(denied) = (core.dialect.authorize)(&req, &route, &core.config.api_key) {
        return denied;
    }
    let fault = core.faults.lock().take(&method, &route);
    let mut response = match fault {
        None => next.run(req).await,
        Some(fault) => apply(&core, fault, req, next).await,
    };
    (core.dialect.decorate)(&mut response);
    response
}

async fn apply(core: &Core, fault: FaultKind, mut req: Request, next: Next) -> Response {
    tracing::debug!(provider = core.provider, ?fault, "injecting fault");
    match fault {
        FaultKind::RateLimited { retry_after_secs } => {
            (core.dialect.rate_limited)(retry_after_secs)
        }
        FaultKind::ServerError { status } => (core.dialect.server_error)(status),
        FaultKind::Slow { delay_ms } => {
            tokio::time::sleep(SimClock::ms(delay_ms)).await;
            next.run(req).await
        }
        FaultKind::LostResponse => {
            let _discarded = next.run(req).await;
            drop_connection()
        }
        FaultKind::ErrorAfterCreate { status } => {
            let _discarded = next.run(req).await;
            (core.dialect.server_error)(status)
        }
        kind @ (FaultKind::CapacityExhausted | FaultKind::OfferVanishes | FaultKind::BidTooLow) => {
            req.extensions_mut().insert(HandlerFault(kind));
            next.run(req).await
        }
    }
}

/// Marker payload of the unwind that drops a connection.
#[derive(Debug)]
struct ResponseLost;

/// Abandons the request so that hyper closes the connection without writing a response.
///
/// `resume_unwind` skips the panic hook, so nothing is printed; tokio contains the unwind in the
/// connection's task and the server keeps accepting. Requires `panic = "unwind"` (the default).
fn drop_connection() -> Response {
    std::panic::resume_unwind(Box::new(ResponseLost))
}

/// A JSON response with a status.
pub(crate) fn json(status: StatusCode, body: &impl Serialize) -> Response {
    (status, axum::Json(body)).into_response()
}

/// A running HTTP server; dropping it stops the server.
#[derive(Debug)]
struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn bind(router: Router, port: u16) -> Result<Server, SimError> {
    let wanted = format!("127.0.0.1:{port}");
    let bind_error = |source| SimError::Bind {
        addr: wanted.clone(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(&wanted)
        .await
        .map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "simulator server stopped");
        }
    });
    Ok(Server { addr, task })
}

/// A running provider simulator: its address, and the Rust side of the admin API.
#[derive(Debug)]
pub struct SimHandle {
    server: Server,
    core: Arc<Core>,
    ops: Arc<dyn SimOps>,
    base_path: &'static str,
}

impl SimHandle {
    /// Wraps `api` with the auth and fault middleware, adds the admin API, and serves it.
    pub(crate) async fn launch(
        core: Arc<Core>,
        ops: Arc<dyn SimOps>,
        api: Router,
        base_path: &'static str,
    ) -> Result<Self, SimError> {
        let guarded = api.route_layer(middleware::from_fn_with_state(core.clone(), intercept));
        let router = guarded.merge(crate::admin::router(core.clone(), ops.clone()));
        let server = bind(router, core.config.port).await?;
        tracing::info!(provider = core.provider, addr = %server.addr, "simulator listening");
        Ok(Self {
            server,
            core,
            ops,
            base_path,
        })
    }

    /// The socket address the simulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn origin(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// The provider's documented base URL, rebased on the simulator (see each provider module).
    pub fn base_url(&self) -> String {
        format!("{}{}", self.origin(), self.base_path)
    }

    /// `http://127.0.0.1:PORT/_admin`.
    pub fn admin_url(&self) -> String {
        format!("{}/_admin", self.origin())
    }

    /// The accepted API key.
    pub fn api_key(&self) -> &str {
        &self.core.config.api_key
    }

    /// The billing ledger as of now.
    pub fn ledger(&self) -> LedgerReport {
        self.core.ledger.lock().report()
    }

    /// Arms a fault; returns its id.
    pub fn add_fault(&self, rule: FaultRule) -> u64 {
        self.core.faults.lock().add(rule)
    }

    /// Disarms one fault (a window of trouble that ends); false if it is not armed.
    pub fn remove_fault(&self, id: u64) -> bool {
        self.core.faults.lock().remove(id)
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        self.core.faults.lock().clear();
    }

    /// The armed faults with their remaining counts.
    pub fn faults(&self) -> Vec<ArmedFault> {
        self.core.faults.lock().list()
    }

    /// Preempts an instance (Vast: stopped; Lambda: preempted; RunPod: exited).
    pub fn preempt(&self, instance_id: &str) -> bool {
        self.ops.preempt(instance_id)
    }

    /// Breaks an instance so it never becomes ready (Vast: `actual_status` `exited`; Lambda:
    /// `unhealthy`; RunPod: `ERROR`). It stays billed until deleted.
    pub fn fail(&self, instance_id: &str) -> bool {
        self.ops.fail(instance_id)
    }

    /// The market's offers with their remaining capacity.
    pub fn offers(&self) -> Vec<Offer> {
        self.core.market.lock().offers().to_vec()
    }

    /// Sets an offer's remaining capacity (0 exhausts it).
    pub fn set_capacity(&self, offer_id: u64, available: u32) -> bool {
        self.core.market.lock().set_capacity(offer_id, available)
    }

    /// Sets an offer's price and spot minimum bid (what a market replay moves).
    pub fn set_price(&self, offer_id: u64, price_per_hour: f64, spot: Option<f64>) -> bool {
        self.core
            .market
            .lock()
            .set_price(offer_id, price_per_hour, spot)
    }

    /// Removes an offer from the market.
    pub fn remove_offer(&self, offer_id: u64) -> bool {
        self.core.market.lock().remove(offer_id)
    }
}
