//! `neocloud-node policy ...`: operator commands for Wasm policies. `check` loads a component and
//! prints what it is, `eval` runs one decision on JSON inputs, `test` runs fixtures, `bench`
//! measures decisions per second with p50 and p99, and push, pull, sign, verify and keygen
//! distribute policies through an OCI registry (see `policy_oci`). Every command prints JSON when it succeeds; when it fails (the
//! file is missing, is not a component, is a component of another world, lacks the role asked
//! for) it returns the error, which the binary prints once and exits non-zero.
//!
//! Compiled components are kept in a disk cache between runs ([`CacheArgs`]): the user's cache
//! directory unless `--cache-dir` or `--no-cache` says otherwise.
//!
//! Not for CEL policies, nor for anything the node does at runtime: it only drives
//! `neocloud_policy::wasm`. Wiring (in main.rs):
//!
//! ```text
//! Command::Policy { #[command(flatten)] cache: cli::policy::CacheArgs,
//!                   #[command(subcommand)] command: cli::policy::PolicyCommand }
//! Command::Policy { command, cache } => cli::policy::run(command, &cache)?,
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use neocloud_policy::wasm::bindings::{
    Annotation, CapacityType, Offer, PlacementDecision, PlacementInput, PriceDecision,
    PricingInput, Workload,
};
use neocloud_policy::wasm::{
    Capabilities, DEFAULT_CACHE_MAX_BYTES, EngineConfig, Evaluation, PolicySettings, PolicySource,
    Role, Verdict, WasmEngine, WasmPolicy,
};
use serde::Deserialize;

use neocloud_node::policies::wit::{RegionTable, gpu_model_named, provider_named};
use serde_json::{Value, json};

/// `neocloud-node policy <command>`.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// Load a Wasm policy and print its world, roles, exports, imports, digest and size.
    Check {
        /// The component (.wasm).
        file: PathBuf,
        /// Fail unless the component implements this role (repeatable).
        #[arg(long, value_enum)]
        role: Vec<RoleArg>,
    },
    /// Run one decision and print it with its timing: with `--attempts` the fallback decision,
    /// else placement of `--offers`, else pricing of each offer.
    Eval {
        /// The workload, as JSON (see `WorkloadJson`).
        #[arg(long)]
        workload: PathBuf,
        /// The candidate offers, as a JSON array (see `OfferJson`).
        #[arg(long, required_unless_present = "attempts")]
        offers: Option<PathBuf>,
        /// The failed attempts for a fallback decision, as JSON: `{"attempts": [...],
        /// "remaining_offers": N, "elapsed_ms": N}` (see `FallbackJson`).
        #[arg(long)]
        attempts: Option<PathBuf>,
        /// The component (.wasm).
        file: PathBuf,
    },
    /// Run a policy against fixtures (a YAML file of cases with their expected decisions) and
    /// print a pass/fail table; exits non-zero when a case fails.
    Test {
        /// The component (.wasm).
        file: PathBuf,
        /// The fixtures (see `policies/*/fixtures.yaml` and docs in `policy_test`).
        fixtures: PathBuf,
    },
    /// Run placement decisions over synthetic offers (a policy without placement: fallback
    /// decisions after three failed attempts) and print decisions/s, p50 and p99.
    Bench {
        /// The component (.wasm); it must export the placement or the fallback role.
        file: PathBuf,
        #[arg(long, default_value_t = 1000)]
        offers: usize,
        #[arg(long, default_value_t = 1000)]
        iterations: usize,
    },
    /// push, pull, sign, verify, keygen: distribution through an OCI registry.
    #[command(flatten)]
    Oci(crate::cli::policy_oci::OciCommand),
}

/// A role `check --role` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    Placement,
    Fallback,
    Pricing,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::Placement => Role::Placement,
            RoleArg::Fallback => Role::Fallback,
            RoleArg::Pricing => Role::Pricing,
        }
    }
}

/// How every `policy` command loads components: where it keeps compiled components between runs
/// (compiling an 18 MB Python component takes most of a minute in a debug build, reading it back
/// well under a second; entries are keyed by the component's bytes, the engine settings and the
/// wasmtime version, so a changed component or binary compiles again), and the deadline of each
/// decision.
#[derive(Debug, Clone, clap::Args)]
pub struct CacheArgs {
    /// The directory of compiled components [default: $XDG_CACHE_HOME/neocloud-node/wasm, else
    /// ~/.cache/neocloud-node/wasm]
    #[arg(
        long,
        env = "NEOCLOUD_WASM_CACHE_DIR",
        value_name = "DIR",
        global = true
    )]
    pub cache_dir: Option<PathBuf>,
    /// Keep nothing on disk: compile each component from scratch.
    #[arg(long, env = "NEOCLOUD_WASM_NO_CACHE", global = true,
          value_parser = clap::builder::FalseyValueParser::new())]
    pub no_cache: bool,
    /// The largest size of the cache directory, in MiB; the oldest entries past it are removed
    /// when a command starts.
    #[arg(long, env = "NEOCLOUD_WASM_CACHE_MAX_MIB", value_name = "MIB", global = true,
          default_value_t = DEFAULT_CACHE_MAX_BYTES >> 20)]
    pub cache_max_mib: u64,
    /// The wall-clock limit of each decision, instantiation included, in milliseconds: the
    /// node's (100) unless a slow guest or a loaded machine is being measured.
    #[arg(long, env = "NEOCLOUD_POLICY_DEADLINE_MS", value_name = "MS", global = true,
          default_value_t = default_deadline_ms(),
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub deadline_ms: u64,
}

/// The deadline of a decision unless `--deadline-ms` says otherwise: the node's.
fn default_deadline_ms() -> u64 {
    let deadline = neocloud_policy::wasm::Budget::default().deadline;
    u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX)
}

impl Default for CacheArgs {
    /// The user's cache directory, 512 MiB, the node's deadline.
    fn default() -> Self {
        Self {
            cache_dir: None,
            no_cache: false,
            cache_max_mib: DEFAULT_CACHE_MAX_BYTES >> 20,
            deadline_ms: default_deadline_ms(),
        }
    }
}

impl CacheArgs {
    /// The directory these arguments name: none with `--no-cache`, else `--cache-dir`, else the
    /// user's cache directory (none when neither `XDG_CACHE_HOME` nor `HOME` is set).
    pub fn dir(&self) -> Option<PathBuf> {
        if self.no_cache {
            return None;
        }
        let user = || user_cache_home(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"));
        self.cache_dir
            .clone()
            .or_else(|| user().map(|d| d.join("neocloud-node").join("wasm")))
    }

    /// A Wasm engine with this cache. A directory that cannot be used is reported and left out:
    /// the command then works, only slower.
    pub fn engine(&self) -> anyhow::Result<WasmEngine> {
        let config = EngineConfig {
            cache_dir: self.dir(),
            cache_max_bytes: self.cache_max_mib.saturating_mul(1 << 20),
            ..EngineConfig::default()
        };
        match WasmEngine::new(config.clone()) {
            Ok(engine) => Ok(engine),
            Err(e) if config.cache_dir.is_some() => {
                tracing::warn!("{e}; compiling without the disk cache");
                let config = EngineConfig {
                    cache_dir: None,
                    ..config
                };
                Ok(WasmEngine::new(config)?)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The XDG base directory for caches: `$XDG_CACHE_HOME` when it is an absolute path (the spec
/// says to ignore a relative one), else `$HOME/.cache`.
fn user_cache_home(
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    xdg.and_then(absolute)
        .or_else(|| home.and_then(absolute).map(|h| h.join(".cache")))
}

/// Runs `command` and returns its JSON output (pretty-printed, newline-terminated).
pub fn run(command: PolicyCommand, cache: &CacheArgs) -> anyhow::Result<String> {
    let value = match command {
        PolicyCommand::Check { file, role } => check(cache, &file, &role)?,
        PolicyCommand::Eval {
            workload,
            attempts: Some(attempts),
            file,
            ..
        } => eval_fallback(cache, &file, &workload, &attempts)?,
        PolicyCommand::Eval {
            workload,
            offers: Some(offers),
            attempts: None,
            file,
        } => eval(cache, &file, &workload, &offers)?,
        PolicyCommand::Eval { .. } => bail!("policy eval needs --offers or --attempts"),
        PolicyCommand::Test { file, fixtures } => {
            return crate::cli::policy_test::run(cache, &file, &fixtures);
        }
        PolicyCommand::Bench {
            file,
            offers,
            iterations,
        } => bench(cache, &file, offers, iterations)?,
        PolicyCommand::Oci(command) => match crate::cli::policy_oci::run(command, cache)? {
            Value::String(text) => return Ok(format!("{text}\n")),
            value => value,
        },
    };
    Ok(format!("{}\n", serde_json::to_string_pretty(&value)?))
}

/// Everything a CLI-loaded policy may use: the log, and WASI that grants nothing.
pub(crate) fn load(cache: &CacheArgs, file: &Path) -> anyhow::Result<WasmPolicy> {
    let engine = cache.engine()?;
    let mut settings = PolicySettings::named(file.display().to_string());
    settings.budget.deadline = std::time::Duration::from_millis(cache.deadline_ms);
    settings.capabilities = Capabilities {
        log: true,
        deny_all_wasi: true,
    };
    Ok(engine.load(&PolicySource::file(file), settings)?)
}

/// Fails unless `policy` implements `role`.
pub(crate) fn require(policy: &WasmPolicy, file: &Path, role: Role) -> anyhow::Result<()> {
    let info = policy.info();
    if info.roles.contains(&role) {
        return Ok(());
    }
    let roles: Vec<String> = info.roles.iter().map(Role::to_string).collect();
    bail!(
        "policy {} does not implement the {role} role; it implements {} (world {})",
        file.display(),
        roles.join(", "),
        info.world
    )
}

fn check(cache: &CacheArgs, file: &Path, wanted: &[RoleArg]) -> anyhow::Result<Value> {
    let policy = load(cache, file)?;
    for role in wanted {
        require(&policy, file, Role::from(*role))?;
    }
    let info = policy.info();
    let roles: Vec<String> = info.roles.iter().map(Role::to_string).collect();
    Ok(json!({
        "ok": true, "file": file, "world": info.world, "roles": roles,
        "exports": info.exports, "imports": info.imports,
        "digest": format!("sha256:{}", info.digest), "size": info.size,
    }))
}

fn eval(cache: &CacheArgs, file: &Path, workload: &Path, offers: &Path) -> anyhow::Result<Value> {
    let workload: WorkloadJson = read_json(workload)?;
    let offers: Vec<OfferJson> = read_json(offers)?;
    let policy = load(cache, file)?;
    let input = placement_input(&workload, &offers)?;
    if policy.info().roles.contains(&Role::Placement) {
        return Ok(outcome(&policy.place(&input), placement_json));
    }
    if policy.info().roles.contains(&Role::Pricing) {
        let results = price_each(&policy, &input, &offers);
        let shown: Vec<Value> = results.iter().map(|e| outcome(e, price_json)).collect();
        return Ok(json!({ "pricing": shown }));
    }
    bail!(
        "policy {} exports neither placement nor pricing; eval needs one",
        file.display()
    )
}

/// Each offer of `input` priced by `policy`, in order (`offers` gives their region names).
pub(crate) fn price_each(
    policy: &WasmPolicy,
    input: &PlacementInput,
    offers: &[OfferJson],
) -> Vec<Evaluation<PriceDecision>> {
    let priced = input.offers.iter().zip(offers).map(|(offer, raw)| {
        policy.price(&PricingInput {
            workload: input.workload.clone(),
            offer: *offer,
            region: raw.region.clone(),
            on_demand_reference: None,
        })
    });
    priced.collect()
}

fn eval_fallback(
    cache: &CacheArgs,
    file: &Path,
    workload: &Path,
    attempts: &Path,
) -> anyhow::Result<Value> {
    let input =
        crate::cli::policy_test::fallback_input(&read_json(workload)?, &read_json(attempts)?)?;
    let policy = load(cache, file)?;
    require(&policy, file, Role::Fallback)?;
    Ok(outcome(
        &policy.next(&input),
        crate::cli::policy_test::action_json,
    ))
}

pub(crate) fn outcome<T>(evaluation: &Evaluation<T>, show: fn(&T) -> Value) -> Value {
    let micros = evaluation.elapsed.as_secs_f64() * 1e6;
    let log: Vec<&str> = evaluation
        .log
        .lines
        .iter()
        .map(|l| l.message.as_str())
        .collect();
    match &evaluation.verdict {
        Verdict::Apply(answer) => {
            json!({ "decision": show(answer), "elapsed_us": micros, "log": log })
        }
        other => json!({
            "error": other.error().map(|e| e.to_string()),
            "label": other.error().map(|e| e.label()),
            "elapsed_us": micros, "log": log,
        }),
    }
}

pub(crate) fn placement_json(decision: &PlacementDecision) -> Value {
    match decision {
        PlacementDecision::Scores(scores) => json!({ "scores": scores }),
        PlacementDecision::Order(order) => json!({ "order": order }),
    }
}

pub(crate) fn price_json(decision: &PriceDecision) -> Value {
    match decision {
        PriceDecision::Accept(bid) => json!({ "accept": {
            "max_price_per_hour": bid.max_price_per_hour,
            "spot_bid_per_hour": bid.spot_bid_per_hour,
        }}),
        PriceDecision::Reject(reason) => json!({ "reject": reason }),
    }
}

/// Placement decisions over `offers` synthetic offers; for a policy without placement, fallback
/// decisions after three failed attempts.
fn bench(
    cache: &CacheArgs,
    file: &Path,
    offers: usize,
    iterations: usize,
) -> anyhow::Result<Value> {
    let policy = load(cache, file)?;
    if !policy.info().roles.contains(&Role::Placement) {
        require(&policy, file, Role::Fallback)
            .context("policy bench measures placement, else fallback")?;
        let input = crate::cli::policy_test::synthetic_fallback()?;
        let run = || {
            let e = policy.next(&input);
            (e.elapsed, e.verdict.error().map(|e| e.to_string()))
        };
        return measure(
            iterations,
            json!({ "role": "fallback", "attempts": 3 }),
            run,
        );
    }
    let synthetic: Vec<OfferJson> = (0..offers).map(synthetic_offer).collect();
    let input = placement_input(&WorkloadJson::default(), &synthetic)?;
    let run = || {
        let e = policy.place(&input);
        (e.elapsed, e.verdict.error().map(|e| e.to_string()))
    };
    measure(
        iterations,
        json!({ "role": "placement", "offers": offers }),
        run,
    )
}

/// Runs `decide` `iterations` times and adds decisions/s, p50 and p99 to `about`.
fn measure(
    iterations: usize,
    mut about: Value,
    decide: impl Fn() -> (std::time::Duration, Option<String>),
) -> anyhow::Result<Value> {
    let mut samples = Vec::with_capacity(iterations);
    let started = Instant::now();
    for _ in 0..iterations.max(1) {
        let (elapsed, error) = decide();
        if let Some(error) = error {
            bail!("decision failed: {error}");
        }
        samples.push(elapsed);
    }
    let total = started.elapsed();
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    about["iterations"] = json!(samples.len());
    about["decisions_per_second"] = json!(samples.len() as f64 / total.as_secs_f64());
    about["p50_us"] = json!(at(0.50).as_secs_f64() * 1e6);
    about["p99_us"] = json!(at(0.99).as_secs_f64() * 1e6);
    Ok(about)
}

fn synthetic_offer(i: usize) -> OfferJson {
    const MODELS: [&str; 4] = ["H100", "A100-80GB", "L40S", "RTX-4090"];
    OfferJson {
        provider: ["runpod", "lambda", "vast", "kube"][i % 4].into(),
        gpu_model: MODELS[i % 4].into(),
        gpu_count: 1 + (i % 8) as u32,
        gpu_memory_gib: 80,
        price_per_hour: 0.2 + ((i * 37) % 400) as f64 / 100.0,
        spot: i.is_multiple_of(3),
        region: ["us-east-1", "us-west-2", "eu-central-1"][i % 3].into(),
        reliability: 0.8 + ((i * 13) % 20) as f64 / 100.0,
        verified: true,
        disk_gib: 100,
    }
}

pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("failed to parse {}", path.display()))
}

/// The workload file of `policy eval`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct WorkloadJson {
    gpu_count: u32,
    /// e.g. `["H100", "A100-80GB"]`; empty means any.
    gpu_models: Vec<String>,
    max_price_per_hour: Option<f64>,
    /// `on-demand`, `spot` or `any`.
    capacity_type: String,
    regions: Vec<String>,
    image: String,
    annotations: BTreeMap<String, String>,
}

impl Default for WorkloadJson {
    fn default() -> Self {
        Self {
            gpu_count: 1,
            gpu_models: vec![],
            max_price_per_hour: None,
            capacity_type: "any".into(),
            regions: vec![],
            image: "busybox".into(),
            annotations: BTreeMap::new(),
        }
    }
}

/// One element of the offers file of `policy eval`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OfferJson {
    /// `runpod`, `lambda`, `vast`, `kube`, `fake`; anything else is `other`.
    provider: String,
    gpu_model: String,
    gpu_count: u32,
    gpu_memory_gib: u32,
    price_per_hour: f64,
    spot: bool,
    region: String,
    #[serde(default = "one")]
    reliability: f64,
    #[serde(default = "yes")]
    verified: bool,
    #[serde(default)]
    disk_gib: u32,
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

pub(crate) fn placement_input(
    w: &WorkloadJson,
    offers: &[OfferJson],
) -> anyhow::Result<PlacementInput> {
    let mut regions = RegionTable::default();
    let offers = offers
        .iter()
        .map(|o| offer(o, regions.index(&o.region)))
        .collect();
    Ok(PlacementInput {
        workload: workload(w)?,
        regions: regions.into_names(),
        offers,
    })
}

fn workload(w: &WorkloadJson) -> anyhow::Result<Workload> {
    let capacity_type = match w.capacity_type.as_str() {
        "on-demand" => CapacityType::OnDemand,
        "spot" => CapacityType::Spot,
        "any" => CapacityType::Any,
        other => bail!("capacity_type must be on-demand, spot or any, not {other:?}"),
    };
    Ok(Workload {
        gpu_count: w.gpu_count,
        gpu_models: w.gpu_models.iter().map(|m| gpu_model_named(m)).collect(),
        max_price_per_hour: w.max_price_per_hour,
        capacity_type,
        regions: w.regions.clone(),
        image: w.image.clone(),
        annotations: w
            .annotations
            .iter()
            .map(|(key, value)| Annotation {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
    })
}

fn offer(o: &OfferJson, region: u32) -> Offer {
    Offer {
        provider: provider_named(&o.provider),
        gpu_model: gpu_model_named(&o.gpu_model),
        gpu_count: o.gpu_count,
        gpu_memory_gib: o.gpu_memory_gib,
        price_per_hour: o.price_per_hour,
        spot: o.spot,
        region,
        reliability: o.reliability,
        verified: o.verified,
        disk_gib: o.disk_gib,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn the_user_cache_is_xdg_cache_home_when_absolute_else_home_dot_cache() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(
            user_cache_home(os("/x/cache"), os("/home/u")),
            Some(PathBuf::from("/x/cache"))
        );
        assert_eq!(
            user_cache_home(os("relative"), os("/home/u")),
            Some(PathBuf::from("/home/u/.cache"))
        );
        assert_eq!(
            user_cache_home(None, os("/home/u")),
            Some(PathBuf::from("/home/u/.cache"))
        );
        assert_eq!(user_cache_home(None, None), None);
    }

    #[test]
    fn no_cache_wins_over_a_named_directory() {
        let cache = CacheArgs {
            cache_dir: Some("/tmp/x".into()),
            no_cache: true,
            ..CacheArgs::default()
        };
        assert_eq!(cache.dir(), None);
        let named = CacheArgs {
            no_cache: false,
            ..cache
        };
        assert_eq!(named.dir(), Some(PathBuf::from("/tmp/x")));
    }
}
