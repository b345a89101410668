//! A placement strategy as a file a user can write: which providers, on-demand or spot where
//! the job allows it, when to give up on spot, optional CEL constraint and rank expressions
//! (the same language, variables and limits as a BurstPolicy's `spec.cel`), and an optional
//! Wasm policy component (as a BurstPolicy's `spec.wasm`, run by the same engine and adapters
//! as in the node). The replay turns a job and a strategy into the [`WorkloadSpec`],
//! [`Planner`] and fallback policy the node would use.
//!
//! Not the fallback ladder: every strategy rents through the node's default ladder, so what
//! differs between strategies is what they ask for and how they rank.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use neocloud_broker::wasm::{ExcludingPricing, Exclusions, WasmFallback, WasmPricing, WasmRanker};
use neocloud_broker::{CelFilter, CelRanker, FallbackPolicy, Planner, PricingPolicy};
use neocloud_core::{
    Attempt, CapacityType, FailureClass, GpuModel, GpuRequest, ProviderHints, ProviderId,
    WorkloadSpec,
};
use neocloud_policy::cel::{CelEngine, CelLimits, CompiledConstraint, CompiledRank};
use neocloud_policy::wasm::{
    EngineConfig, FailurePolicy, PolicySettings, PolicySource, Role, WasmEngine, WasmPolicy,
};
use serde::{Deserialize, Serialize};

use crate::jobs::Job;

/// Whether a strategy rents spot capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityChoice {
    /// On-demand only, whatever the job tolerates.
    OnDemand,
    /// Spot or on-demand where the job tolerates spot; on-demand otherwise.
    Job,
}

/// A strategy file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Strategy {
    /// Its name in reports.
    pub name: String,
    /// One line on what it is.
    #[serde(default)]
    pub description: String,
    /// Providers in preference order; empty: every provider.
    #[serde(default)]
    pub providers: Vec<ProviderId>,
    /// On-demand only, or spot where the job allows it.
    pub capacity: CapacityChoice,
    /// After this many preemptions of a job, on-demand only.
    #[serde(default)]
    pub on_demand_after_preemptions: Option<u32>,
    /// A CEL boolean every offer rented must satisfy.
    #[serde(default)]
    pub constraint: Option<String>,
    /// A CEL number; the highest ranks first (default: cheapest first).
    #[serde(default)]
    pub rank: Option<String>,
    /// The cluster's budget in USD per hour, as the node's `--max-usd-per-hour`.
    #[serde(default)]
    pub budget_usd_per_hour: Option<f64>,
    /// A Wasm policy component (placement, pricing or fallback world), relative to the
    /// strategy file's directory.
    #[serde(default)]
    pub wasm: Option<PathBuf>,
    /// What a failing Wasm policy does: `Fail` (the decision fails) or `Ignore` (the node's
    /// default decides), as a BurstPolicy's `failurePolicy`.
    #[serde(default)]
    pub failure_policy: Option<String>,
    /// The directory relative paths start from (the file's, when read from one).
    #[serde(skip)]
    pub dir: Option<PathBuf>,
}

/// A strategy that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// The file cannot be read or parsed.
    #[error("strategy {path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A field is not valid.
    #[error("strategy {name}: {message}")]
    Invalid {
        /// The strategy's name.
        name: String,
        /// What is wrong, naming the field and the value.
        message: String,
    },
}

/// A strategy with its expressions compiled.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The strategy.
    pub strategy: Strategy,
    constraint: Option<Arc<CompiledConstraint>>,
    rank: Option<Arc<CompiledRank>>,
    wasm: Option<WasmPolicy>,
}

impl Strategy {
    /// Reads a strategy file (JSON).
    pub fn read(path: &std::path::Path) -> Result<Strategy, StrategyError> {
        let file = |message: String| StrategyError::File {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file(e.to_string()))?;
        let mut strategy: Strategy =
            serde_json::from_str(&text).map_err(|e| file(e.to_string()))?;
        strategy.dir = path.parent().map(Path::to_path_buf);
        Ok(strategy)
    }

    /// Checks the fields and compiles the expressions.
    pub fn compile(&self) -> Result<Compiled, StrategyError> {
        let invalid = |message: String| StrategyError::Invalid {
            name: self.name.clone(),
            message,
        };
        if self.name.trim().is_empty() {
            return Err(invalid("name is empty".to_owned()));
        }
        if let Some(p) = self.providers.iter().find(|p| {
            !matches!(
                p,
                ProviderId::Runpod | ProviderId::Lambda | ProviderId::Vast
            )
        }) {
            return Err(invalid(format!(
                "providers has {p}; a replay has runpod, lambda and vast"
            )));
        }
        if let Some(budget) = self.budget_usd_per_hour
            && !(budget.is_finite() && budget > 0.0)
        {
            return Err(invalid(format!(
                "budget_usd_per_hour is {budget} (must be above 0)"
            )));
        }
        let engine = CelEngine::new(CelLimits::default());
        let constraint = match &self.constraint {
            Some(src) => Some(
                engine
                    .compile_constraint(src)
                    .map_err(|e| invalid(format!("constraint: {e}")))?,
            ),
            None => None,
        };
        let rank = match &self.rank {
            Some(src) => Some(
                engine
                    .compile_rank(src)
                    .map_err(|e| invalid(format!("rank: {e}")))?,
            ),
            None => None,
        };
        let wasm = match &self.wasm {
            Some(path) => Some(self.load_wasm(path).map_err(invalid)?),
            None => None,
        };
        Ok(Compiled {
            strategy: self.clone(),
            constraint,
            rank,
            wasm,
        })
    }

    fn load_wasm(&self, path: &Path) -> Result<WasmPolicy, String> {
        let path = match &self.dir {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_path_buf(),
        };
        let mut settings = PolicySettings::named(self.name.clone());
        settings.failure_policy = match self.failure_policy.as_deref() {
            None | Some("Fail") => FailurePolicy::Fail,
            Some("Ignore") => FailurePolicy::Ignore,
            Some(other) => {
                return Err(format!(
                    "failure_policy is {other:?} (Fail or Ignore, as a BurstPolicy's)"
                ));
            }
        };
        let engine = WasmEngine::new(EngineConfig::default()).map_err(|e| format!("wasm: {e}"))?;
        let source = PolicySource::File {
            path: path.clone(),
            sha256: None,
        };
        engine
            .load(&source, settings)
            .map_err(|e| format!("wasm {}: {e}", path.display()))
    }
}

/// How many of the attempts are preemptions.
pub fn preemptions(history: &[Attempt]) -> u32 {
    history
        .iter()
        .filter(|a| a.failure() == Some(FailureClass::Preempted))
        .count() as u32
}

impl Compiled {
    /// The workload the node would make of this job's Pod under this strategy, given the
    /// job's attempts so far.
    pub fn workload(&self, job: &Job, history: &[Attempt]) -> WorkloadSpec {
        let s = &self.strategy;
        let spot_given_up = s
            .on_demand_after_preemptions
            .is_some_and(|n| preemptions(history) >= n);
        let capacity_type = match s.capacity {
            CapacityChoice::Job if job.spot_ok && !spot_given_up => CapacityType::Any,
            _ => CapacityType::OnDemand,
        };
        WorkloadSpec {
            image: "ghcr.io/example/train:replay".to_owned(),
            command: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            env_from: Vec::new(),
            ports: Vec::new(),
            gpu: GpuRequest {
                count: job.gpus,
                accepted: job
                    .models
                    .iter()
                    .flat_map(|m| GpuModel::accepted_by_name(m))
                    .collect(),
            },
            resources: Default::default(),
            disk_gib: None,
            capacity_type,
            regions: Vec::new(),
            providers: s.providers.clone(),
            max_price_per_hour: job.max_price_per_hour,
            constraint: s.constraint.clone(),
            rank: s.rank.clone(),
            policy: None,
            hints: ProviderHints::default(),
        }
    }

    /// The planner for one workload: the strategy's CEL and Wasm where it has some, the node's
    /// defaults (every offer, cheapest first, the minimum bid) where it has none, composed as
    /// the node composes a BurstPolicy's.
    pub fn planner(&self, w: &WorkloadSpec) -> Planner {
        let mut planner = Planner::default();
        if let Some(expr) = &self.constraint {
            planner.filter = Arc::new(CelFilter::new(Arc::clone(expr), w));
        }
        if let Some(expr) = &self.rank {
            planner.ranker = Arc::new(CelRanker::new(Arc::clone(expr), w));
        }
        if let Some(wasm) = &self.wasm {
            let roles = &wasm.info().roles;
            if roles.contains(&Role::Pricing) {
                planner.pricing = Arc::new(WasmPricing::new(wasm.clone(), planner.pricing));
            }
            if roles.contains(&Role::Placement) {
                let exclusions = Exclusions::default();
                planner.ranker = Arc::new(WasmRanker::new(
                    wasm.clone(),
                    planner.ranker,
                    exclusions.clone(),
                ));
                let pricing: Arc<dyn PricingPolicy> = Arc::new(ExcludingPricing::new(
                    planner.pricing,
                    exclusions,
                    &self.strategy.name,
                ));
                planner.pricing = pricing;
            }
        }
        planner
    }

    /// The fallback policy: the strategy's Wasm fallback if it has one, else `default`.
    pub fn fallback(&self, default: Arc<dyn FallbackPolicy>) -> Arc<dyn FallbackPolicy> {
        match &self.wasm {
            Some(wasm) if wasm.info().roles.contains(&Role::Fallback) => {
                Arc::new(WasmFallback::new(wasm.clone(), default))
            }
            _ => default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(json: serde_json::Value) -> Strategy {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_bad_expression_or_provider_is_refused_by_field() {
        let bad = strategy(serde_json::json!({
            "name": "x", "capacity": "job", "rank": "offer.price_per_hour +"
        }));
        let error = bad.compile().unwrap_err().to_string();
        assert!(error.starts_with("strategy x: rank: "), "{error}");
        let fake = strategy(serde_json::json!({
            "name": "y", "capacity": "on-demand", "providers": ["fake"]
        }));
        assert_eq!(
            fake.compile().unwrap_err().to_string(),
            "strategy y: providers has fake; a replay has runpod, lambda and vast"
        );
        let budget = strategy(serde_json::json!({
            "name": "z", "capacity": "job", "budget_usd_per_hour": 0
        }));
        assert!(
            budget
                .compile()
                .unwrap_err()
                .to_string()
                .contains("budget_usd_per_hour is 0")
        );
    }

    #[test]
    fn spot_is_given_up_after_the_preemptions_the_strategy_allows() {
        let s = strategy(serde_json::json!({
            "name": "d", "capacity": "job", "on_demand_after_preemptions": 2
        }))
        .compile()
        .unwrap();
        let job = Job {
            id: "j".into(),
            arrival_s: 0,
            work_s: 60,
            gpus: 1,
            models: vec!["H100".into()],
            spot_ok: true,
            max_price_per_hour: None,
        };
        let preempted = Attempt {
            number: 1,
            provider: ProviderId::Vast,
            offer_id: "1".into(),
            price_per_hour: 1.0,
            started_at: chrono::Utc::now(),
            outcome: neocloud_core::AttemptOutcome::Failed {
                class: FailureClass::Preempted,
                code: None,
                message: "reclaimed".into(),
            },
        };
        assert_eq!(s.workload(&job, &[]).capacity_type, CapacityType::Any);
        let once = vec![preempted.clone()];
        assert_eq!(s.workload(&job, &once).capacity_type, CapacityType::Any);
        let twice = vec![preempted.clone(), preempted];
        assert_eq!(
            s.workload(&job, &twice).capacity_type,
            CapacityType::OnDemand
        );
        let no_spot = Job {
            spot_ok: false,
            ..job
        };
        assert_eq!(
            s.workload(&no_spot, &[]).capacity_type,
            CapacityType::OnDemand
        );
    }
}
