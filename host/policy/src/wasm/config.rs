//! Engine-wide settings (pool sizes, epoch tick, disk cache) and per-policy settings (budget,
//! capabilities, failure policy, mode).
//!
//! Not for loading or running anything: see [`super::engine`] and [`super::policy`].

use std::path::PathBuf;
use std::time::Duration;

/// Settings shared by every policy of one [`super::WasmEngine`]. Changing any of them changes the
/// engine fingerprint, so compiled components are never reused across configurations.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// How often the background ticker advances the epoch; deadlines are rounded up to ticks.
    pub epoch_tick: Duration,
    /// Largest Wasm stack a guest may use, in bytes (`Config::max_wasm_stack`).
    pub max_wasm_stack: usize,
    /// Count fuel in every store; a policy without a fuel budget then gets unlimited fuel.
    pub fuel: bool,
    /// Concurrent component instances the pooling allocator can hold.
    pub pool_instances: u32,
    /// Largest linear memory a pool slot can hold, in bytes; per-policy budgets are smaller.
    pub pool_max_memory: usize,
    /// Largest table a pool slot can hold, in elements.
    pub pool_table_elements: usize,
    /// Directory of wasmtime's on-disk cache of compiled components; none keeps them in memory.
    pub cache_dir: Option<PathBuf>,
    /// Largest total size of the files in `cache_dir`, in bytes: the oldest are removed past it
    /// when an engine is built (and by wasmtime's background worker). Not part of the
    /// fingerprint: it changes what is kept, not what is compiled.
    pub cache_max_bytes: u64,
}

/// The default [`EngineConfig::cache_max_bytes`]: 512 MiB, about ten compiled Python components.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 512 << 20;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            epoch_tick: Duration::from_millis(1),
            max_wasm_stack: 512 * 1024,
            fuel: false,
            pool_instances: 128,
            pool_max_memory: 512 << 20,
            pool_table_elements: 100_000,
            cache_dir: None,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
        }
    }
}

/// What a policy may spend on one decision. Instantiation counts against the same budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Wall-clock limit for instantiation plus the call; enforced by epoch interruption.
    pub deadline: Duration,
    /// Largest size of any one linear memory, in bytes; growing past it traps.
    pub memory_bytes: usize,
    /// Instructions (wasmtime fuel units); needs [`EngineConfig::fuel`].
    pub fuel: Option<u64>,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(100),
            memory_bytes: 64 << 20,
            fuel: None,
        }
    }
}

/// Host imports a policy is granted. Anything not granted is not linked, so a guest that
/// imports it fails to load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The bounded `neocloud:policy/log` import.
    pub log: bool,
    /// WASI 0.2 with nothing in it: no preopened directories, no environment, no arguments, no
    /// network, closed stdin; stdout and stderr are captured into the bounded log. Needed by
    /// componentize-py guests (and componentize-js guests built with default features).
    pub deny_all_wasi: bool,
}

/// What happens when a policy fails (trap, timeout, guest error, invalid output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// The decision fails; the Pod is not placed and says why.
    #[default]
    Fail,
    /// The failure is reported and the host's built-in default decides instead.
    Ignore,
}

/// Whether a policy's answer is used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// The answer is applied.
    #[default]
    Enforce,
    /// The policy runs and its outcome is reported, but the host default always decides;
    /// `failurePolicy` is not consulted.
    Audit,
}

/// Per-policy settings, from a `BurstPolicy` or the node's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySettings {
    /// Name used in logs and errors.
    pub name: String,
    pub budget: Budget,
    pub capabilities: Capabilities,
    pub failure_policy: FailurePolicy,
    pub mode: Mode,
}

impl PolicySettings {
    /// Default budget, no capabilities, `Fail`, `Enforce`.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            budget: Budget::default(),
            capabilities: Capabilities::default(),
            failure_policy: FailurePolicy::default(),
            mode: Mode::default(),
        }
    }
}

/// Limits on what a guest may return; larger answers are rejected, never truncated (except the
/// message of a guest error, which is truncated as the WIT documents).
pub mod output_limits {
    /// Longest reason string (`give-up`, `reject`), in bytes.
    pub const MAX_REASON_BYTES: usize = 1024;
    /// Longest guest error message kept, in bytes; the rest is cut.
    pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;
    /// Longest log message kept, in bytes.
    pub const MAX_LOG_MESSAGE_BYTES: usize = 512;
    /// Most log messages kept per decision; the rest are counted and dropped.
    pub const MAX_LOG_MESSAGES: usize = 32;
    /// Most bytes of guest stdout and stderr captured per decision (deny-all WASI only).
    pub const MAX_STDIO_BYTES: usize = 4096;
}
