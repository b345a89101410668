//! The WebAssembly component engine for guest policies implementing `neocloud:policy@0.1.0`
//! (placement, fallback, pricing), on wasmtime 48.
//!
//! What it does:
//! - compiles each component once per sha256 and engine configuration ([`WasmEngine`]), in
//!   memory and, when a cache directory is configured, on disk through wasmtime's cache;
//! - prepares an `InstancePre` per policy and runs every decision in a fresh `Store` on the
//!   pooling allocator, under the policy's [`Budget`]: an epoch deadline (a background ticker),
//!   a memory limiter that traps on refused growth, the engine's stack limit, optional fuel;
//! - links only what a policy is granted ([`Capabilities`]): the bounded log, and a WASI context
//!   that grants nothing, for componentize-py/-js guests;
//! - classifies traps by type ([`TrapKind`]), keeps guest errors as values, validates answers,
//!   and applies `failurePolicy` and `mode` ([`Verdict`]).
//!
//! What it is not for: choosing defaults or acting on a verdict (the broker does), CEL (see
//! [`crate::cel`]), or mapping domain types (callers build the generated WIT records in
//! [`bindings`]).
//!
//! ```no_run
//! use neocloud_policy::wasm::{EngineConfig, PolicySettings, PolicySource, WasmEngine};
//! let engine = WasmEngine::new(EngineConfig::default())?;
//! let policy = engine.load(
//!     &PolicySource::file("policies/build/placement-c.wasm"),
//!     PolicySettings::named("cheapest"),
//! )?;
//! println!("{} {}", policy.info().world, policy.info().digest);
//! # Ok::<(), neocloud_policy::wasm::WasmError>(())
//! ```

pub mod bindings;
mod call;
mod config;
mod disk_cache;
mod engine;
mod error;
mod host;
mod info;
mod link;
mod policy;
mod source;
mod ticker;
/// The checks of a guest's answer, public only for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub mod validate;
mod verdict;

pub use config::{
    Budget, Capabilities, DEFAULT_CACHE_MAX_BYTES, EngineConfig, FailurePolicy, Mode,
    PolicySettings, output_limits,
};
pub use engine::{EngineStats, WasmEngine};
pub use error::{Role, TrapKind, WasmError};
pub use host::{DecisionLog, GUEST_LOG_TARGET, LogLine};
pub use info::PolicyInfo;
pub use policy::WasmPolicy;
pub use source::{MAX_COMPONENT_BYTES, PolicySource, sha256_hex};
pub use verdict::{Evaluation, Verdict};
