//! The Pod's CEL expressions (`cloud.aibrix.ai/constraints` and `cloud.aibrix.ai/rank`, or a
//! `BurstPolicy`'s rules) as the planner's [`OfferFilter`] and [`OfferRanker`], evaluated by
//! neocloud-policy's CEL engine over views of our domain types.
//!
//! A filter or ranker is built per decision: the workload's view is made once, each offer's
//! view per evaluation. Not for compiling or caching expressions: the engine does that.

use std::sync::Arc;

use neocloud_core::{Attempt, AttemptOutcome, Offer, WorkloadSpec};
use neocloud_policy::cel::{
    CelAttempt, CelEvalError, CelGpu, CelInput, CelOffer, CelWorkload, CompiledConstraint,
    CompiledRank,
};

use crate::policy::{OfferFilter, OfferRanker, PolicyError};

/// The CEL view of a workload. `annotations` is empty: the broker sees the parsed Pod, not its
/// metadata.
pub fn workload_view(w: &WorkloadSpec) -> CelWorkload {
    CelWorkload {
        gpu_count: i64::from(w.gpu.count),
        gpu_models: w.gpu.accepted.iter().map(|g| g.name().to_owned()).collect(),
        max_price: w.max_price_per_hour.unwrap_or(0.0),
        capacity_type: w.capacity_type.to_string(),
        regions: w.regions.clone(),
        image: w.image.clone(),
        annotations: Default::default(),
    }
}

/// The CEL view of an offer; unknown reliability reads as 1.0 and unknown sizes as 0.
pub fn offer_view(o: &Offer) -> CelOffer {
    CelOffer {
        provider: o.provider.as_str().to_owned(),
        id: o.id.clone(),
        gpu: CelGpu {
            model: o.gpu.name().to_owned(),
            memory_gib: i64::from(o.gpu.memory_gib().unwrap_or(0)),
        },
        gpu_count: i64::from(o.gpu_count),
        price_per_hour: o.price_per_hour,
        spot: o.capacity.is_spot(),
        region: o.region.clone(),
        reliability: o.reliability.unwrap_or(1.0),
        verified: o.verified,
        disk_gib: i64::from(o.disk_gib.unwrap_or(0)),
    }
}

/// The CEL view of a past attempt; attempts that did not fail have an empty class.
pub fn attempt_view(a: &Attempt) -> CelAttempt {
    let (failure_class, message) = match &a.outcome {
        AttemptOutcome::Failed { class, message, .. } => {
            (class.label().to_owned(), message.clone())
        }
        _ => (String::new(), String::new()),
    };
    CelAttempt {
        provider: a.provider.as_str().to_owned(),
        offer_id: a.offer_id.clone(),
        failure_class,
        message,
    }
}

fn policy_error(source: &str, e: &CelEvalError) -> PolicyError {
    PolicyError::new(
        format!("cel expression `{source}`"),
        format!("{} ({})", e, e.kind().as_str()),
    )
}

/// A compiled CEL constraint bound to one decision's workload.
#[derive(Debug)]
pub struct CelFilter {
    expr: Arc<CompiledConstraint>,
    workload: CelWorkload,
}

impl CelFilter {
    /// Binds `expr` to the workload being placed.
    pub fn new(expr: Arc<CompiledConstraint>, w: &WorkloadSpec) -> Self {
        Self {
            expr,
            workload: workload_view(w),
        }
    }
}

impl OfferFilter for CelFilter {
    fn accepts(
        &self,
        _: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<bool, PolicyError> {
        let offer = offer_view(o);
        let attempts: Vec<CelAttempt> = attempts.iter().map(attempt_view).collect();
        let input = CelInput {
            workload: &self.workload,
            offer: &offer,
            attempts: &attempts,
        };
        self.expr
            .eval(&input)
            .map_err(|e| policy_error(self.expr.source(), &e))
    }
}

/// A compiled CEL rank expression bound to one decision's workload; higher is better.
#[derive(Debug)]
pub struct CelRanker {
    expr: Arc<CompiledRank>,
    workload: CelWorkload,
}

impl CelRanker {
    /// Binds `expr` to the workload being placed.
    pub fn new(expr: Arc<CompiledRank>, w: &WorkloadSpec) -> Self {
        Self {
            expr,
            workload: workload_view(w),
        }
    }
}

impl OfferRanker for CelRanker {
    fn score(&self, _: &WorkloadSpec, o: &Offer, attempts: &[Attempt]) -> Result<f64, PolicyError> {
        let offer = offer_view(o);
        let attempts: Vec<CelAttempt> = attempts.iter().map(attempt_view).collect();
        let input = CelInput {
            workload: &self.workload,
            offer: &offer,
            attempts: &attempts,
        };
        self.expr
            .eval(&input)
            .map_err(|e| policy_error(self.expr.source(), &e))
    }
}
