//! The `Provider` trait and its adapters (fake, RunPod, Lambda Cloud, Vast.ai): the only place
//! that speaks a cloud's HTTP API. Adapters translate wire types into `neocloud-core` types and
//! classify every error; they never decide where to rent.

mod adapter;
mod common;
pub mod fake;
/// Response decoding of every cloud in one call, public only for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub mod fuzzing;
mod http;
pub mod lambda;
pub mod provider;
pub mod retries;
pub mod runpod;
pub mod vast;

pub use common::ConfigError;
pub use fake::FakeProvider;
pub use http::{ApiKey, HttpConfig};
pub use lambda::{LambdaConfig, LambdaProvider};
pub use provider::{
    Boot, ContainerBoot, CreateRequest, FrameIo, FrameStream, LogRequest, LogStream, Operation,
    Provider, ProviderError,
};
pub use runpod::{RunpodConfig, RunpodProvider};
pub use vast::{VastConfig, VastProvider, VastSearch};
