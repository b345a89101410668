//! RunPod (`provider-apis.md` §1): on-demand pods through REST v2 (`/v2/pods`, the GPU catalog),
//! interruptible (spot) pods through GraphQL (`podRentInterruptable`), since v2 has no spot.
//!
//! Offer ids are `gpuTypeId/CLOUD/dataCenterId`, with `/spot` appended for spot offers. The pod
//! `name` is our external name; v2 has no server-side name filter, so lookups list every pod.
//! Differences from the reference page: a 403 on create is classified as capacity (RunPod's
//! "skip this candidate"), and a spot bid below the minimum as price-exceeded.
//!
//! A Pod's private image is pulled with a registry credential (`/v2/registries`) made for its
//! rental and deleted with it (see `registries`).
//!
//! Not REST v1 (retired 2026-11-15), network volumes, templates or CPU pods.

mod adapter;
mod config;
mod convert;
mod errors;
pub(crate) mod fuzzing;
mod registries;
mod wire;

#[cfg(test)]
mod tests;

pub use adapter::RunpodProvider;
pub use config::{DEFAULT_BASE_URL, RunpodConfig};
