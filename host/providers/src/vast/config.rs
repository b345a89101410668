//! Configuration of the Vast.ai adapter: base URL, API key, HTTP budget, page sizes, and the
//! specification's search defaults (verified hosts, reliability at least 0.95, 20 GiB disk,
//! on-demand), from a config file section or `VAST_API_KEY` and `VAST_API_BASE_URL`.
//!
//! Not per-Pod narrowing: the `vast-*` annotations arrive as `VastHints` on the workload and
//! are turned into a [`super::VastSearch`].

use neocloud_core::workload::{VAST_DEFAULT_DISK_GIB, VAST_DEFAULT_MIN_RELIABILITY};
use serde::Deserialize;

use crate::common::{ConfigError, env_key, env_var};
use crate::http::{ApiKey, HttpConfig};

/// The documented API origin; paths are `/api/v0/...` and `/api/v1/instances/`.
pub const DEFAULT_BASE_URL: &str = "https://console.vast.ai";

/// The largest page `GET /api/v1/instances/` serves.
pub const MAX_PAGE_SIZE: u32 = 25;

/// How the Vast adapter reaches Vast.ai, and its search defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VastConfig {
    /// API origin.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// The API key (never logged).
    pub api_key: ApiKey,
    /// Timeouts and retries.
    #[serde(default)]
    pub http: HttpConfig,
    /// Instances per list page (1 to 25).
    #[serde(default = "default_page_size")]
    pub page_size: u32,
    /// Offers per search.
    #[serde(default = "default_search_limit")]
    pub search_limit: u32,
    /// Only verified hosts unless a Pod says otherwise.
    #[serde(default = "yes")]
    pub verified: bool,
    /// Least host reliability unless a Pod says otherwise.
    #[serde(default = "default_reliability")]
    pub min_reliability: f64,
    /// Disk in GiB unless a Pod says otherwise.
    #[serde(default = "default_disk")]
    pub disk_gib: u32,
}

fn default_base_url() -> String {
    DEFAULT_BASE_URL.to_owned()
}
fn default_page_size() -> u32 {
    MAX_PAGE_SIZE
}
fn default_search_limit() -> u32 {
    100
}
fn yes() -> bool {
    true
}
fn default_reliability() -> f64 {
    VAST_DEFAULT_MIN_RELIABILITY
}
fn default_disk() -> u32 {
    VAST_DEFAULT_DISK_GIB
}

impl VastConfig {
    /// A config with the specification's defaults for everything but the key.
    pub fn new(api_key: ApiKey) -> VastConfig {
        VastConfig {
            base_url: default_base_url(),
            api_key,
            http: HttpConfig::default(),
            page_size: MAX_PAGE_SIZE,
            search_limit: default_search_limit(),
            verified: true,
            min_reliability: VAST_DEFAULT_MIN_RELIABILITY,
            disk_gib: VAST_DEFAULT_DISK_GIB,
        }
    }

    /// From `VAST_API_KEY` (required) and `VAST_API_BASE_URL` (optional).
    pub fn from_env() -> Result<VastConfig, ConfigError> {
        let key = env_key("vast", "VAST_API_KEY", "a Vast.ai API key")?;
        let mut config = VastConfig::new(key);
        if let Some(base) = env_var("VAST_API_BASE_URL") {
            config.base_url = base;
        }
        Ok(config)
    }
}
