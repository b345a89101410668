//! Configuration of the RunPod adapter: base URL, API key, HTTP budget and pod defaults, from a
//! config file section or the specification's variables (`RUNPOD_API_KEY`,
//! `RUNPOD_API_BASE_URL`).
//!
//! Not account setup: SSH keys and spend limits are managed in RunPod itself.

use serde::Deserialize;

use crate::common::{ConfigError, env_key, env_var};
use crate::http::{ApiKey, HttpConfig};

/// The documented API origin; REST v2 lives under `/v2` and GraphQL at `/graphql`.
pub const DEFAULT_BASE_URL: &str = "https://api.runpod.io";

/// How the RunPod adapter reaches RunPod.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunpodConfig {
    /// API origin (the simulator's origin in tests).
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// The API key (never logged).
    pub api_key: ApiKey,
    /// Timeouts and retries.
    #[serde(default)]
    pub http: HttpConfig,
    /// Container disk in GB when the workload does not say.
    #[serde(default = "default_disk_gb")]
    pub default_disk_gb: u32,
    /// Ask RunPod to start SSH with the account's registered keys.
    #[serde(default)]
    pub start_ssh: bool,
}

fn default_base_url() -> String {
    DEFAULT_BASE_URL.to_owned()
}

fn default_disk_gb() -> u32 {
    50
}

impl RunpodConfig {
    /// A config with defaults for everything but the key.
    pub fn new(api_key: ApiKey) -> RunpodConfig {
        RunpodConfig {
            base_url: default_base_url(),
            api_key,
            http: HttpConfig::default(),
            default_disk_gb: default_disk_gb(),
            start_ssh: false,
        }
    }

    /// From `RUNPOD_API_KEY` (required) and `RUNPOD_API_BASE_URL` (optional).
    pub fn from_env() -> Result<RunpodConfig, ConfigError> {
        let hint = "a RunPod API key with read and write scope";
        let mut config = RunpodConfig::new(env_key("runpod", "RUNPOD_API_KEY", hint)?);
        if let Some(base) = env_var("RUNPOD_API_BASE_URL") {
            config.base_url = base;
        }
        Ok(config)
    }
}
