//! Vast.ai (`provider-apis.md` §3): offer search through `POST /api/v0/bundles/` (our
//! constraints and the `vast-*` hints become the operator query), rental through
//! `PUT /api/v0/asks/{id}/` with our external name as `label`, and lookups by label through the
//! keyset-paginated `GET /api/v1/instances/`.
//!
//! Offer ids are ask ids; instance ids are contract ids. Differences from the reference page:
//! the container runs with `runtype: "args"` (the image's entrypoint with the Pod's command and
//! args), ports are published with the CLI's `-p N:N` env keys, and a bid below the minimum is
//! classified as price-exceeded (the stopped instance Vast creates is destroyed first).
//!
//! Not SSH key registration, volumes, templates or the bulk destroy.

mod adapter;
mod config;
mod convert;
mod errors;
pub(crate) mod fuzzing;
mod wire;

#[cfg(test)]
mod tests;

pub use adapter::VastProvider;
pub use config::{DEFAULT_BASE_URL, MAX_PAGE_SIZE, VastConfig};
pub use convert::VastSearch;
