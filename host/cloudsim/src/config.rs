//! Typed configuration of the simulators: one [`SimConfig`] per provider, and the combined
//! [`CloudSimConfig`] read from a YAML file by `neocloud-cloudsim --config FILE`.
//!
//! Not the adapters' configuration, and not validated against any real account.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::faults::FaultRule;

/// The API key every simulator accepts unless configured otherwise.
pub const DEFAULT_API_KEY: &str = "sim-key";

/// The SSH key name the Lambda simulator has registered unless configured otherwise.
pub const DEFAULT_SSH_KEY: &str = "sim-ssh-key";

/// How one provider simulator behaves. `Debug` redacts the API key.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// The only API key that is accepted.
    #[serde(default = "default_api_key")]
    pub api_key: String,
    /// TCP port on 127.0.0.1; 0 picks a free one.
    #[serde(default)]
    pub port: u16,
    /// How long state changes take.
    #[serde(default)]
    pub timing: Timing,
    /// The market; `None` uses the provider's built-in default market.
    #[serde(default)]
    pub offers: Option<Vec<OfferConfig>>,
    /// Faults armed at start (a scenario).
    #[serde(default)]
    pub faults: Vec<FaultRule>,
    /// Spot instances are preempted this long after they start running.
    #[serde(default)]
    pub preempt_spot_after_ms: Option<u64>,
    /// At most this many live instances per account (Lambda `global/quota-exceeded`,
    /// RunPod 402, Vast `invalid_args`); `None` is unlimited.
    #[serde(default)]
    pub quota: Option<u32>,
    /// Launch rate limit (Lambda only): 1 launch per 12 s by default, as documented.
    #[serde(default)]
    pub launch_rate_limit: RateLimit,
    /// SSH key names registered at start (Lambda only; launch requires one that exists).
    #[serde(default = "default_ssh_keys")]
    pub ssh_key_names: Vec<String>,
    /// Opt-in: run the `neocloud-runner` command an instance was created with as a local child
    /// process (leading its own process group, which is killed with the instance and when the
    /// simulator is dropped), with the runner's arguments and environment.
    ///
    /// - Lambda: the `neocloud-runner` entry of the cloud-init `user_data`'s `runcmd`, with the
    ///   env of its `systemd-run --setenv=…` prefix, once the instance is `active`; killed when
    ///   it is terminated, restarted or preempted.
    /// - RunPod: a start command (REST `args` string, GraphQL `dockerArgs`) of the shape
    ///   `sh -c SCRIPT` in shell words, whose last non-empty line is
    ///   `exec …/neocloud-runner ARGS…`, with the pod's whole `env`, once the pod is `RUNNING`
    ///   (again after start/restart); killed when it is stopped, preempted, failed, restarted or
    ///   deleted.
    /// - Vast: `runtype: "args"` with `args` `["sh", "-c", SCRIPT]` of the same shape, with the
    ///   request's `env` (without `-p …` port keys), once the instance is `running` (again after
    ///   a start); killed when it is stopped (preempted, outbid), failed or destroyed.
    ///
    /// Other commands start nothing.
    #[serde(default)]
    pub run_user_data: bool,
    /// The binary run in place of the `neocloud-runner` path written in `user_data` or the
    /// start command (for tests, the built binary); `None` runs `neocloud-runner` from `PATH`.
    #[serde(default)]
    pub runner_binary: Option<std::path::PathBuf>,
    /// Registries whose images pull only with their login (RunPod: the pod's registry
    /// credential; Vast: `image_login`); other images are public. A pull that fails leaves the
    /// instance failed with Docker's error (RunPod `ERROR`, Vast `exited` with `status_msg`).
    #[serde(default)]
    pub private_registries: Vec<crate::registries::PrivateRegistry>,
}

impl std::fmt::Debug for SimConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimConfig")
            .field("api_key", &"<redacted>")
            .field("port", &self.port)
            .field("timing", &self.timing)
            .field("offers", &self.offers)
            .field("faults", &self.faults)
            .field("preempt_spot_after_ms", &self.preempt_spot_after_ms)
            .field("quota", &self.quota)
            .field("launch_rate_limit", &self.launch_rate_limit)
            .field("ssh_key_names", &self.ssh_key_names)
            .field("run_user_data", &self.run_user_data)
            .field("runner_binary", &self.runner_binary)
            .field("private_registries", &self.private_registries)
            .finish()
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            api_key: default_api_key(),
            port: 0,
            timing: Timing::default(),
            offers: None,
            faults: Vec::new(),
            preempt_spot_after_ms: None,
            quota: None,
            launch_rate_limit: RateLimit::default(),
            ssh_key_names: default_ssh_keys(),
            run_user_data: false,
            runner_binary: None,
            private_registries: Vec::new(),
        }
    }
}

impl SimConfig {
    /// A config with fast state changes and no launch rate limit, for tests.
    pub fn fast() -> Self {
        Self {
            timing: Timing {
                provisioning_ms: 50,
                starting_ms: 50,
                terminating_ms: 50,
            },
            launch_rate_limit: RateLimit {
                max_requests: 1,
                window_ms: 0,
            },
            ..Self::default()
        }
    }

    /// Runs the runner command found in Lambda `user_data`, or in a RunPod or Vast container's
    /// start command, with `binary` once the instance is running (see
    /// [`run_user_data`](Self::run_user_data)).
    pub fn with_user_data_runner(mut self, binary: impl Into<std::path::PathBuf>) -> Self {
        self.run_user_data = true;
        self.runner_binary = Some(binary.into());
        self
    }
}

fn default_ssh_keys() -> Vec<String> {
    vec![DEFAULT_SSH_KEY.to_string()]
}

fn default_api_key() -> String {
    DEFAULT_API_KEY.to_string()
}

/// Delays of the time-driven state changes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timing {
    /// Created until the image starts loading (RunPod PROVISIONING, Vast `null`).
    pub provisioning_ms: u64,
    /// Loading until running (RunPod STARTING, Vast `loading`, Lambda's `booting` is both).
    pub starting_ms: u64,
    /// Terminating until terminated (Lambda).
    pub terminating_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            provisioning_ms: 2_000,
            starting_ms: 3_000,
            terminating_ms: 2_000,
        }
    }
}

/// A sliding-window rate limit: at most `max_requests` per `window_ms`; a zero window disables it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Requests allowed per window.
    pub max_requests: u32,
    /// Window length in milliseconds.
    pub window_ms: u64,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            max_requests: 1,
            window_ms: 12_000,
        }
    }
}

/// One offer of the market, in the provider's own vocabulary.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferConfig {
    /// Vast ask id; assigned when absent (RunPod and Lambda have no offer ids on the wire).
    /// Not serialized: the market's offer carries the id in effect, beside these fields.
    #[serde(default, skip_serializing)]
    pub id: Option<u64>,
    /// RunPod GPU type id, Lambda instance type name, or Vast `gpu_name`.
    pub gpu: String,
    /// GPUs per instance (RunPod: the most one pod may take).
    #[serde(default = "one")]
    pub gpu_count: u32,
    /// Memory per GPU in GB.
    #[serde(default = "default_gpu_memory")]
    pub gpu_memory_gb: u32,
    /// RunPod data center id, Lambda region name, or Vast geolocation ("City, CC").
    pub region: String,
    /// USD per hour: per GPU on RunPod, per instance on Lambda and Vast.
    pub price_per_hour: f64,
    /// Minimum spot bid in USD per hour (same unit as `price_per_hour`); `None` is no spot.
    #[serde(default)]
    pub spot_price_per_hour: Option<f64>,
    /// How many more rentals the offer can take (RunPod: GPUs).
    pub capacity: u32,
    /// Host reliability in [0, 1] (Vast `reliability2`).
    #[serde(default = "default_reliability")]
    pub reliability: f64,
    /// RunPod cloud: SECURE or COMMUNITY.
    #[serde(default)]
    pub cloud: Option<String>,
    /// Vast `verified`.
    #[serde(default = "yes")]
    pub verified: bool,
    /// vCPUs per instance.
    #[serde(default = "default_vcpus")]
    pub vcpus: u32,
    /// RAM per instance in GB.
    #[serde(default = "default_ram")]
    pub ram_gb: u32,
    /// Disk in GB.
    #[serde(default = "default_disk")]
    pub disk_gb: u32,
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}
fn default_gpu_memory() -> u32 {
    24
}
fn default_reliability() -> f64 {
    0.99
}
fn default_vcpus() -> u32 {
    8
}
fn default_ram() -> u32 {
    32
}
fn default_disk() -> u32 {
    100
}

/// The combined config of [`crate::CloudSim`] (see `cloudsim.example.yaml` in this crate); a
/// missing section starts that simulator with defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudSimConfig {
    /// RunPod simulator.
    #[serde(default)]
    pub runpod: SimConfig,
    /// Lambda Cloud simulator.
    #[serde(default)]
    pub lambda: SimConfig,
    /// Vast.ai simulator.
    #[serde(default)]
    pub vast: SimConfig,
}

impl CloudSimConfig {
    /// Reads a YAML config file.
    pub fn from_file(path: &Path) -> Result<Self, SimError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SimError::ReadConfig {
            path: shown.clone(),
            source,
        })?;
        Self::from_yaml(&text).map_err(|source| SimError::ParseConfig {
            path: shown,
            source,
        })
    }

    /// Parses a YAML document.
    pub fn from_yaml(text: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::from_str(text)
    }
}
