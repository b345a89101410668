//! BurstPolicy objects as policies the reconciler can plan and rent with.
//!
//! [`PolicyRegistry`] watches every `BurstPolicy`, loads each generation (CEL rules through the
//! CEL engine; a Wasm component from a file, a ConfigMap key or a URL pinned by sha256 through
//! the Wasm engine), writes its status, and [`PolicyRegistry::resolve`]s a policy name into a
//! per-Pod [`Planner`] and fallback policy whose pieces come from the policy, wrapped in the
//! metrics wrappers, and the rest from the node's defaults.
//!
//! A generation that fails to load replaces the previous one: the policy stops serving (Pods
//! naming it wait, `resolve` says why) until a generation loads. Serving an older generation
//! would run rules the object no longer shows.
//!
//! Not for choosing which policy a Pod uses (the reconciler reads `cloud.aibrix.ai/policy`), nor
//! for evaluating policies (the engines and the broker do).

mod cel;
mod egress;
mod load;
mod oci;
mod registry;
mod status;
pub use neocloud_broker::wasm;
pub use neocloud_broker::wasm::wit;

pub use cel::Governed;
pub use egress::EgressLimit;
pub use registry::{PolicyRegistry, PolicyUnavailable, Resolved};
pub use status::LOADED;
