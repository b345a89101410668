//! The one place that generates host bindings from `wit/neocloud-policy-0.1.0`, and short
//! re-exports of the generated types the rest of the crate and its callers use.
//!
//! Not for logic. Bindings are generated for the `full-policy` world; a guest that implements one
//! role is called through that role's per-interface `GuestIndices`, so it needs to export only
//! what it implements.

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

wasmtime::component::bindgen!({
    path: "../../wit/neocloud-policy-0.1.0",
    world: "full-policy",
    additional_derives: [PartialEq],
});

pub use exports::neocloud::policy::fallback::{FallbackAction, FallbackInput};
pub use exports::neocloud::policy::placement::{PlacementDecision, PlacementInput};
pub use exports::neocloud::policy::pricing::{Bid, PriceDecision, PricingInput};
pub use neocloud::policy::log::Level as LogLevel;
pub use neocloud::policy::types::{
    Annotation, Attempt, CapacityType, ErrorCode, FailureClass, GpuModel, Offer, PolicyError,
    Provider, Workload,
};

/// Per-interface export lookups, resolved once per component.
pub(crate) mod guests {
    pub use super::exports::neocloud::policy::fallback::GuestIndices as FallbackIndices;
    pub use super::exports::neocloud::policy::placement::GuestIndices as PlacementIndices;
    pub use super::exports::neocloud::policy::pricing::GuestIndices as PricingIndices;
}

/// The package every world of this binding belongs to.
pub const PACKAGE: &str = "neocloud:policy@0.1.0";
