//! `failurePolicy` and `mode` for a BurstPolicy's CEL rules, which the CEL engine does not apply
//! itself (the Wasm engine does, see [`super::wasm`]). Same table as the Wasm verdict:
//! Enforce applies answers and, on an error, fails (Fail) or lets the host default decide
//! (Ignore); Audit evaluates, logs, and always lets the host default decide.
//!
//! Not for compiling or evaluating CEL (the engine and `neocloud_broker::cel` do).

use std::sync::Arc;

use neocloud_broker::{OfferFilter, OfferRanker, PolicyError};
use neocloud_core::{Attempt, Offer, WorkloadSpec};

use neocloud_api::{FailurePolicy, PolicyMode};

/// A CEL filter or ranker with the host default it yields to.
#[derive(Debug)]
pub struct Governed<T: ?Sized> {
    policy: Arc<T>,
    default: Arc<T>,
    name: String,
    failure: FailurePolicy,
    mode: PolicyMode,
}

impl<T: ?Sized> Governed<T> {
    /// `policy` decides as `failure` and `mode` say; `default` decides otherwise.
    pub fn new(
        policy: Arc<T>,
        default: Arc<T>,
        name: impl Into<String>,
        failure: FailurePolicy,
        mode: PolicyMode,
    ) -> Self {
        Self {
            policy,
            default,
            name: name.into(),
            failure,
            mode,
        }
    }

    fn govern<V: std::fmt::Debug>(
        &self,
        answer: Result<V, PolicyError>,
        default: impl FnOnce() -> Result<V, PolicyError>,
    ) -> Result<V, PolicyError> {
        let name = &self.name;
        match (self.mode, answer, self.failure) {
            (PolicyMode::Enforce, Ok(v), _) => Ok(v),
            (PolicyMode::Enforce, Err(e), FailurePolicy::Fail) => Err(e),
            (PolicyMode::Enforce, Err(error), FailurePolicy::Ignore) => {
                tracing::warn!(policy = %name, %error, "policy failed; failurePolicy Ignore: the host default decides");
                default()
            }
            (PolicyMode::Audit, answer, _) => {
                tracing::info!(policy = %name, ?answer, "audit: the host default decides");
                default()
            }
        }
    }
}

impl OfferFilter for Governed<dyn OfferFilter> {
    fn accepts(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<bool, PolicyError> {
        let answer = self.policy.accepts(w, o, attempts);
        self.govern(answer, || self.default.accepts(w, o, attempts))
    }
}

impl OfferRanker for Governed<dyn OfferRanker> {
    fn rank(
        &self,
        w: &WorkloadSpec,
        offers: &[&Offer],
        attempts: &[Attempt],
    ) -> Result<Vec<f64>, PolicyError> {
        let answer = self.policy.rank(w, offers, attempts);
        self.govern(answer, || self.default.rank(w, offers, attempts))
    }

    fn score(&self, w: &WorkloadSpec, o: &Offer, attempts: &[Attempt]) -> Result<f64, PolicyError> {
        let answer = self.policy.score(w, o, attempts);
        self.govern(answer, || self.default.score(w, o, attempts))
    }
}
