//! Lambda Cloud (`provider-apis.md` §2, OpenAPI 1.10.0): on-demand virtual machines launched
//! with our external name as `name` (and as the `neocloud:external-name` tag), exactly one SSH
//! key, and cloud-init `user_data` from the adapter config.
//!
//! Offer ids are `instanceType/region`. Lambda has no spot, no stop and no pagination; the
//! instance list has no name filter, so lookups list every instance. A `preempted` instance is
//! reported as stopped. Launches are spaced by a client-side interval (12 s by default, the
//! documented limit) and preceded by a capacity check on `/instance-types`.
//!
//! Not SSH key creation, file systems, firewall rules or images.

mod adapter;
mod config;
mod convert;
mod errors;
pub(crate) mod fuzzing;
mod wire;

#[cfg(test)]
mod tests;

pub use adapter::LambdaProvider;
pub use config::{DEFAULT_BASE_URL, DEFAULT_LAUNCH_INTERVAL_MS, LambdaConfig};
