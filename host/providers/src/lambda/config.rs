//! Configuration of the Lambda Cloud adapter: base URL, API key, the one SSH key name every
//! launch carries, the cloud-init `user_data`, the client-side launch rate limit and the HTTP
//! budget, from a config file section or the variables `LAMBDA_API_KEY`, `LAMBDA_API_BASE_URL`,
//! `LAMBDA_SSH_KEY_NAME` and `LAMBDA_USER_DATA_FILE`.
//!
//! Not SSH key management: the key must already exist in the Lambda account.

use serde::Deserialize;

use crate::common::{ConfigError, env_key, env_var};
use crate::http::{ApiKey, HttpConfig};

/// The documented API base (the old `cloud.lambdalabs.com` host is deprecated).
pub const DEFAULT_BASE_URL: &str = "https://cloud.lambda.ai/api/v1";

/// Lambda documents 1 launch per 12 seconds.
pub const DOCUMENTED_LAUNCH_INTERVAL_MS: u64 = 12_000;

/// The default spacing of launches: the documented limit plus a 1 s margin, measured from the
/// previous launch's answer (see the adapter), so clocks and transit times never make two
/// launches look closer than the limit to Lambda.
pub const DEFAULT_LAUNCH_INTERVAL_MS: u64 = DOCUMENTED_LAUNCH_INTERVAL_MS + 1_000;

/// How the Lambda adapter reaches Lambda Cloud.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaConfig {
    /// API base including `/api/v1`.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// The API key (never logged).
    pub api_key: ApiKey,
    /// The one SSH key name each launch carries (Lambda requires exactly one).
    pub ssh_key_name: String,
    /// cloud-init user data sent with every launch (a later task puts the runner here).
    #[serde(default)]
    pub user_data: Option<String>,
    /// The least time between one launch's answer and the next launch from this adapter.
    #[serde(default = "default_interval")]
    pub launch_interval_ms: u64,
    /// Timeouts and retries.
    #[serde(default)]
    pub http: HttpConfig,
}

/// `Debug` redacts the API key and the `user_data` (it may carry the runner's secrets).
impl std::fmt::Debug for LambdaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key)
            .field("ssh_key_name", &self.ssh_key_name)
            .field("user_data", &crate::common::redacted(&self.user_data))
            .field("launch_interval_ms", &self.launch_interval_ms)
            .field("http", &self.http)
            .finish()
    }
}

fn default_base_url() -> String {
    DEFAULT_BASE_URL.to_owned()
}

fn default_interval() -> u64 {
    DEFAULT_LAUNCH_INTERVAL_MS
}

impl LambdaConfig {
    /// A config with defaults for everything but the key and the SSH key name.
    pub fn new(api_key: ApiKey, ssh_key_name: impl Into<String>) -> LambdaConfig {
        LambdaConfig {
            base_url: default_base_url(),
            api_key,
            ssh_key_name: ssh_key_name.into(),
            user_data: None,
            launch_interval_ms: DEFAULT_LAUNCH_INTERVAL_MS,
            http: HttpConfig::default(),
        }
    }

    /// From `LAMBDA_API_KEY` and `LAMBDA_SSH_KEY_NAME` (required; the first name of
    /// `LAMBDA_E2E_SSH_KEY_NAMES` is accepted too), `LAMBDA_API_BASE_URL` and
    /// `LAMBDA_USER_DATA_FILE` (optional).
    pub fn from_env() -> Result<LambdaConfig, ConfigError> {
        let missing = |variable, hint| ConfigError::MissingVariable {
            provider: "lambda",
            variable,
            hint,
        };
        let key = env_key("lambda", "LAMBDA_API_KEY", "a Lambda Cloud API key")?;
        let ssh = env_var("LAMBDA_SSH_KEY_NAME")
            .or_else(|| {
                env_var("LAMBDA_E2E_SSH_KEY_NAMES")
                    .and_then(|v| v.split(',').next().map(|s| s.trim().to_owned()))
            })
            .ok_or(missing(
                "LAMBDA_SSH_KEY_NAME",
                "the name of an SSH key registered in the Lambda account",
            ))?;
        let mut config = LambdaConfig::new(key, ssh);
        if let Some(base) = env_var("LAMBDA_API_BASE_URL") {
            config.base_url = base;
        }
        if let Some(path) = env_var("LAMBDA_USER_DATA_FILE") {
            let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::Invalid {
                provider: "lambda",
                message: format!("cannot read LAMBDA_USER_DATA_FILE {path}: {e}"),
            })?;
            config.user_data = Some(text);
        }
        Ok(config)
    }
}
