//! Local, stateful simulators of the RunPod, Lambda Cloud and Vast.ai HTTP APIs, with a market,
//! a billing ledger and fault injection, so that adapters are tested over real HTTP without
//! spending money. It depends on nothing else of ours.
//!
//! Start one simulator with [`RunpodSim::start`], [`LambdaSim::start`] or [`VastSim::start`]
//! (each on 127.0.0.1, port 0 by default), or all three with [`CloudSim::start`] / [`serve`]
//! from a [`CloudSimConfig`]. Each simulator also serves the admin API described in
//! [`admin`] under `/_admin`.
//!
//! State changes (provisioning → running, Lambda terminating → gone, `preempt_spot_after_ms`)
//! are derived from tokio time when a request reads them, so short [`Timing`] delays are enough
//! in tests. Faults ([`FaultKind`]) target one route (or all) for the next N requests; the
//! `lost_response` fault closes the connection by unwinding the request's task, which needs the
//! default `panic = "unwind"`.
//!
//! Not an adapter and not a mock of our own `Provider` trait: it speaks only the providers'
//! wire protocols, as documented in `reference/provider-apis.md`.

#![recursion_limit = "256"]
// Handlers return early with a ready HTTP response as the error; boxing it would only add noise
// on a path that is taken once per request.
#![allow(clippy::result_large_err)]

pub mod admin;
mod auth;
mod clock;
mod combined;
pub mod config;
mod error;
pub mod faults;
pub mod lambda;
pub mod ledger;
pub mod market;
pub mod nvke;
pub mod registries;
mod runner;
pub mod runpod;
mod schema;
mod server;
pub mod vast;

pub use clock::SimClock;
pub use combined::{CloudSim, serve};
pub use config::{CloudSimConfig, OfferConfig, RateLimit, SimConfig, Timing};
pub use error::SimError;
pub use faults::{ArmedFault, FaultKind, FaultRule};
pub use lambda::LambdaSim;
pub use ledger::{LedgerEntry, LedgerReport};
pub use market::Offer;
pub use nvke::NvkeSim;
pub use registries::PrivateRegistry;
pub use runpod::RunpodSim;
pub use server::SimHandle;
pub use vast::VastSim;
