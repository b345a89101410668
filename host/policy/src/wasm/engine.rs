//! The shared wasmtime engine: configuration (pooling allocator, epoch interruption, stack limit,
//! optional fuel), the epoch ticker thread, and the compile-once cache keyed by the component's
//! sha256 and the engine fingerprint (in memory, plus wasmtime's on-disk cache when a directory
//! is configured).
//!
//! Not for running decisions (see [`super::policy`]) or fetching sources (see [`super::source`]).
//!
//! The disk cache is wasmtime's own (`Config::cache`, opened and size-bounded by
//! [`super::disk_cache`]): it keys entries by a hash of the wasm
//! bytes, the compiler settings and the wasmtime version, and deserialises them itself. We do not
//! call `Component::deserialize` ourselves because it is `unsafe` and the workspace forbids
//! `unsafe_code` (a `forbid` cannot be relaxed by an `allow`).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use wasmtime::component::Component;
use wasmtime::{Cache, Config, Engine, InstanceAllocationStrategy};
use wasmtime::{PoolingAllocationConfig, WasmBacktraceDetails};

use super::config::EngineConfig;
use super::error::WasmError;
use super::policy::WasmPolicy;
use super::source::PolicySource;
use super::ticker::EpochTicker;
use super::{PolicySettings, disk_cache, source};

/// Counters that show what the cache did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Components compiled from Wasm (neither cache had them).
    pub compiled: u64,
    /// Loads served from the in-memory cache.
    pub memory_hits: u64,
    /// Loads served from the on-disk cache (no compilation).
    pub disk_hits: u64,
}

/// A wasmtime engine shared by every policy. Cheap to clone; the epoch ticker stops when the
/// last clone is dropped.
#[derive(Clone, Debug)]
pub struct WasmEngine {
    inner: Arc<Inner>,
}

/// One digest's compiled component, filled by the first load.
type Slot = Arc<Mutex<Option<Component>>>;

struct Inner {
    engine: Engine,
    config: EngineConfig,
    fingerprint: u64,
    components: Mutex<HashMap<(String, u64), Slot>>,
    disk: Option<Cache>,
    from_bytes: AtomicU64,
    memory_hits: AtomicU64,
    ticker: EpochTicker,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmEngine")
            .field("config", &self.config)
            .field("fingerprint", &format_args!("{:016x}", self.fingerprint))
            .finish_non_exhaustive()
    }
}

impl WasmEngine {
    /// Builds the engine and starts its epoch ticker.
    pub fn new(config: EngineConfig) -> Result<Self, WasmError> {
        let disk = match &config.cache_dir {
            Some(dir) => Some(disk_cache::open(dir, config.cache_max_bytes)?),
            None => None,
        };
        let engine = Engine::new(&wasmtime_config(&config, disk.clone()))
            .map_err(|e| WasmError::Engine(format!("{e:#}")))?;
        let fingerprint = fingerprint(&engine);
        let ticker = EpochTicker::start(engine.clone(), config.epoch_tick);
        let inner = Inner {
            engine,
            config,
            fingerprint,
            components: Mutex::new(HashMap::new()),
            disk,
            from_bytes: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            ticker,
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Reads `source`, checks its digest, compiles it unless cached, and prepares it for
    /// decisions. Fails if the component implements no role or imports what it was not granted.
    pub fn load(
        &self,
        source: &PolicySource,
        settings: PolicySettings,
    ) -> Result<WasmPolicy, WasmError> {
        let loaded = source::read(source)?;
        if !loaded.bytes.starts_with(WASM_MAGIC) {
            let start = &loaded.bytes[..loaded.bytes.len().min(WASM_MAGIC.len())];
            return Err(WasmError::NotWasm {
                policy: settings.name,
                digest: loaded.digest,
                start: match start {
                    [] => "nothing".to_owned(),
                    bytes => hex::encode(bytes),
                },
            });
        }
        if is_core_module(&loaded.bytes) {
            return Err(WasmError::CoreModule {
                policy: settings.name,
                digest: loaded.digest,
            });
        }
        let component = self.component(&settings.name, &loaded.digest, &loaded.bytes)?;
        WasmPolicy::prepare(self.clone(), &component, &loaded, settings)
    }

    /// What the cache has done so far.
    pub fn stats(&self) -> EngineStats {
        let from_bytes = self.inner.from_bytes.load(Ordering::Relaxed);
        let disk_hits = self.disk_hits();
        EngineStats {
            compiled: from_bytes.saturating_sub(disk_hits),
            memory_hits: self.inner.memory_hits.load(Ordering::Relaxed),
            disk_hits,
        }
    }

    /// The engine configuration this engine was built with.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Keeps the epoch advancing (so deadlines pass) while the guard lives: one per call.
    pub(crate) fn ticking(&self) -> super::ticker::Ticking {
        self.inner.ticker.ticking()
    }

    pub(crate) fn wasmtime(&self) -> &Engine {
        &self.inner.engine
    }

    /// The compiled component for `digest`, compiling it at most once per engine configuration.
    /// Loads of different digests compile in parallel; loads of the same digest wait for one.
    fn component(&self, name: &str, digest: &str, bytes: &[u8]) -> Result<Component, WasmError> {
        let key = (digest.to_owned(), self.inner.fingerprint);
        let slot = Arc::clone(self.inner.components.lock().entry(key).or_default());
        let mut slot = slot.lock();
        if let Some(found) = slot.as_ref() {
            self.inner.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(found.clone());
        }
        self.inner.from_bytes.fetch_add(1, Ordering::Relaxed);
        let hits_before = self.disk_hits();
        let started = std::time::Instant::now();
        let component =
            Component::new(&self.inner.engine, bytes).map_err(|e| WasmError::Compile {
                policy: name.to_owned(),
                digest: digest.to_owned(),
                message: one_line(&format!("{e:#}")),
            })?;
        // Another digest loading at the same time may be the hit; this is for the log only.
        let how = if self.disk_hits() > hits_before {
            "read from the disk cache"
        } else {
            "compiled"
        };
        tracing::debug!(
            policy = name,
            digest,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "wasm component {how}"
        );
        *slot = Some(component.clone());
        Ok(component)
    }

    fn disk_hits(&self) -> u64 {
        self.inner
            .disk
            .as_ref()
            .map_or(0, |c| c.cache_hits() as u64)
    }
}

/// The first four bytes of every Wasm binary, module or component.
const WASM_MAGIC: &[u8] = b"\0asm";

/// wasmtime's messages may span lines (a parser error pretty-prints the bytes it expected); a
/// policy's status condition and the CLI's error line are one line each.
fn one_line(text: &str) -> String {
    let lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    lines.collect::<Vec<_>>().join(" ")
}

/// Whether `bytes` start like a core Wasm module (version 1), not a component (layer 1).
fn is_core_module(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\0asm\x01\0\0\0")
}

fn wasmtime_config(config: &EngineConfig, disk: Option<Cache>) -> Config {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(config.pool_instances)
        .total_core_instances(config.pool_instances * 16)
        .total_memories(config.pool_instances * 2)
        .total_tables(config.pool_instances * 4)
        .max_memory_size(config.pool_max_memory)
        .table_elements(config.pool_table_elements)
        .max_core_instance_size(4 << 20)
        .max_component_instance_size(1 << 20);
    let mut wasm = Config::new();
    wasm.epoch_interruption(true)
        .max_wasm_stack(config.max_wasm_stack)
        .consume_fuel(config.fuel)
        .wasm_backtrace_details(WasmBacktraceDetails::Disable)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
        .cache(disk);
    wasm
}

/// A hash of everything that makes compiled code incompatible: wasmtime's version and compiler
/// settings (`precompile_compatibility_hash`).
fn fingerprint(engine: &Engine) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.finish()
}
