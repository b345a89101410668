//! RunPod wire types: REST v2 pod create bodies and pods, the v2 GPU catalog, RFC 9457 problem
//! bodies, and the GraphQL envelopes used for interruptible (spot) pods.
//!
//! Responses are read leniently (unknown fields ignored, most fields optional) because RunPod
//! adds fields; requests are exact, because v2 answers 422 to unknown fields. Not behaviour.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v2/pods`. `Debug` shows the env's names only.
#[derive(Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreatePod {
    pub name: String,
    pub image: String,
    pub gpu: PodGpu,
    pub cloud: String,
    pub data_center_ids: Vec<String>,
    pub disk: u32,
    pub env: BTreeMap<String, String>,
    pub ports: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_ssh: Option<bool>,
    /// The id of the registry credential the image is pulled with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<String>,
}

impl std::fmt::Debug for CreatePod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatePod")
            .field("name", &self.name)
            .field("image", &self.image)
            .field("gpu", &self.gpu)
            .field("cloud", &self.cloud)
            .field("data_center_ids", &self.data_center_ids)
            .field("disk", &self.disk)
            .field("env", &crate::common::EnvNames(&self.env))
            .field("ports", &self.ports)
            .field("args", &self.args)
            .field("start_ssh", &self.start_ssh)
            .field("registry", &self.registry)
            .finish()
    }
}

/// The `gpu` of a create body and of a pod.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PodGpu {
    pub id: String,
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

/// A v2 pod.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Pod {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub status: String,
    pub gpu: Option<PodGpu>,
    #[serde(default)]
    pub cost: f64,
    pub data_center_id: Option<String>,
    pub runtime: Option<Runtime>,
    pub created_at: Option<String>,
    /// A spot pod (v1 and GraphQL; v2 leaves it out).
    #[serde(default)]
    pub interruptible: bool,
    /// The id of the registry credential the pod pulls its image with.
    #[serde(default)]
    pub registry: Option<String>,
}

/// `POST /v2/registries`: a registry credential. Write-only at RunPod; `Debug` shows the name.
#[derive(Clone, Serialize)]
pub(crate) struct CreateRegistry<'a> {
    pub name: &'a str,
    pub username: &'a str,
    pub password: &'a str,
}

impl std::fmt::Debug for CreateRegistry<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateRegistry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A registry credential as RunPod shows it (never its username or password).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Registry {
    pub id: String,
    #[serde(default)]
    pub name: String,
}

/// `GET /v2/registries`: an array, or (read leniently, as pods are) `{"registries": [...]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RegistryList {
    Bare(Vec<Registry>),
    Wrapped {
        #[serde(default)]
        registries: Vec<Registry>,
    },
}

impl RegistryList {
    pub fn into_vec(self) -> Vec<Registry> {
        match self {
            RegistryList::Bare(all) | RegistryList::Wrapped { registries: all } => all,
        }
    }
}

/// `runtime` of a running pod.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Runtime {
    #[serde(default)]
    pub ports: Option<Vec<RuntimePort>>,
}

/// One published port.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RuntimePort {
    pub private: u16,
    pub public: Option<u16>,
    pub ip: Option<String>,
}

/// `GET /v2/pods`; SkyPilot follows `pagination` defensively, so do we.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PodList {
    #[serde(default)]
    pub pods: Vec<Pod>,
    pub pagination: Option<Pagination>,
}

/// Cursor pagination, if RunPod ever sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Pagination {
    #[serde(default)]
    pub has_next_page: bool,
    pub next_cursor: Option<String>,
}

/// An RFC 9457 problem body.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Problem {
    pub title: Option<String>,
    pub detail: Option<String>,
    #[serde(default)]
    pub errors: Vec<Value>,
}

/// `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=…`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Catalog {
    #[serde(default)]
    pub gpus: Vec<CatalogGpu>,
}

/// One GPU type in the catalog.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CatalogGpu {
    pub id: String,
    pub memory: Option<u32>,
    #[serde(default)]
    pub price: CloudPrices,
    #[serde(default)]
    pub max_count: CloudCounts,
    #[serde(default)]
    pub data_centers: Vec<DataCenter>,
}

/// Prices per GPU and hour per cloud.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct CloudPrices {
    pub secure: Option<f64>,
    pub community: Option<f64>,
}

/// Most GPUs per pod per cloud.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct CloudCounts {
    pub secure: Option<u32>,
    pub community: Option<u32>,
}

/// A data center and its availability (`NONE|LOW|MEDIUM|HIGH`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct DataCenter {
    pub id: String,
    #[serde(default)]
    pub availability: String,
}

/// A GraphQL request with variables (so no value is spliced into the document).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GqlRequest<'a> {
    pub query: &'a str,
    pub variables: Value,
}

/// A GraphQL response: resolver errors arrive with HTTP 200.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct GqlResponse<T> {
    pub data: Option<T>,
    #[serde(default)]
    pub errors: Vec<GqlError>,
}

/// One GraphQL error.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct GqlError {
    #[serde(default)]
    pub message: String,
    pub extensions: Option<GqlExtensions>,
}

/// `extensions` of a GraphQL error.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct GqlExtensions {
    pub code: Option<String>,
}

/// The spot mutation.
pub(crate) const RENT_INTERRUPTABLE: &str = "mutation Rent($input: PodRentInterruptableInput!) { podRentInterruptable(input: $input) { id } }";

/// A pod's type: v2 pods do not say whether they are interruptible; GraphQL's `podType` does
/// (`INTERRUPTABLE`, or `ON_DEMAND`/`RESERVED`).
pub(crate) const POD_TYPE: &str =
    "query PodType($input: PodFilter!) { pod(input: $input) { id podType } }";

/// `data` of the pod type query (`pod` is null for an unknown pod).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PodTypeAnswer {
    pub pod: Option<PodType>,
}

/// A pod's id and type.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodType {
    #[serde(default)]
    pub pod_type: Option<String>,
}

/// The spot price query.
pub(crate) const SPOT_PRICES: &str =
    "query SpotPrices { gpuTypes { id secureSpotPrice communitySpotPrice } }";

/// `data` of the spot mutation.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Rented {
    pub pod_rent_interruptable: Option<RentedPod>,
}

/// The rented pod's id.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RentedPod {
    pub id: String,
}

/// `data` of the spot price query.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SpotPrices {
    #[serde(default)]
    pub gpu_types: Vec<SpotPrice>,
}

/// Spot prices of one GPU type (USD per GPU and hour).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SpotPrice {
    pub id: String,
    pub secure_spot_price: Option<f64>,
    pub community_spot_price: Option<f64>,
}
