//! A Wasm policy behind the broker's policy traits: [`WasmRanker`] (one `place` call ranks the
//! whole list), [`WasmPricing`] and [`WasmFallback`]. Each holds the host default it falls back
//! to, and acts on the engine's [`Verdict`], which already applied `failurePolicy` and `mode`:
//!
//! - `Apply`: the guest's answer decides;
//! - `Failed` (Enforce, failurePolicy Fail): the trait call fails with the guest's error;
//! - `Ignored` (Enforce, failurePolicy Ignore): the error is logged, the host default decides;
//! - `Audited` (Audit): the guest's answer or error is logged, the host default decides.
//!
//! The ranker trait cannot drop offers, but a placement guest can (a negative score, or an
//! offer left out of `order`). The ranker records those in [`Exclusions`] and
//! [`ExcludingPricing`], wrapped around whatever pricing the planner uses, rejects them, so they
//! never become candidates.
//!
//! Here rather than in the node so that anything placing through the broker (the node, the
//! market replay) runs Wasm policies the same way.
//!
//! Not for loading components (the node's `policies::load`, or [`WasmEngine::load`]) or
//! mapping types (see [`wit`]).
//!
//! [`WasmEngine::load`]: neocloud_policy::wasm::WasmEngine::load

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use crate::{FallbackContext, FallbackPolicy, OfferRanker, PolicyError, PricingPolicy};
use neocloud_core::{Attempt, FallbackAction, Offer, PriceDecision, ProviderId, WorkloadSpec};
use neocloud_policy::wasm::bindings as wit_types;
use neocloud_policy::wasm::{Evaluation, FailurePolicy, Verdict, WasmPolicy};

pub mod wit;

/// What the caller does with one evaluation.
enum Outcome<T> {
    /// The guest decided.
    Answer(T),
    /// The host default decides.
    Default,
}

/// Turns a verdict into an outcome, logging what the host default overrides.
fn outcome<T: Debug>(
    policy: &WasmPolicy,
    role: &str,
    e: Evaluation<T>,
) -> Result<Outcome<T>, PolicyError> {
    let name = &policy.settings().name;
    match e.verdict {
        Verdict::Apply(answer) => Ok(Outcome::Answer(answer)),
        Verdict::Failed(error) => Err(PolicyError::new(name.clone(), error.to_string())),
        Verdict::Ignored(error) => {
            tracing::warn!(policy = %name, role, %error, "policy failed; failurePolicy Ignore: the host default decides");
            Ok(Outcome::Default)
        }
        Verdict::Audited(result) => {
            match result {
                Ok(answer) => {
                    tracing::info!(policy = %name, role, ?answer, "audit: policy answered; the host default decides")
                }
                Err(error) => {
                    tracing::info!(policy = %name, role, %error, "audit: policy failed; the host default decides")
                }
            }
            Ok(Outcome::Default)
        }
    }
}

/// Offers a placement guest excluded in the latest ranking, by provider and offer id. Shared by
/// one [`WasmRanker`] and its [`ExcludingPricing`]; one resolved planner serves one decision.
#[derive(Debug, Default, Clone)]
pub struct Exclusions {
    inner: Arc<Mutex<HashSet<(ProviderId, String)>>>,
}

impl Exclusions {
    fn replace(&self, excluded: HashSet<(ProviderId, String)>) {
        let mut set = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *set = excluded;
    }

    /// Whether the latest ranking excluded `o`.
    pub fn contains(&self, o: &Offer) -> bool {
        let set = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        set.contains(&(o.provider, o.id.clone()))
    }
}

/// A placement policy as the planner's ranker.
#[derive(Debug)]
pub struct WasmRanker {
    policy: WasmPolicy,
    default: Arc<dyn OfferRanker>,
    exclusions: Exclusions,
}

impl WasmRanker {
    /// Ranks with `policy`, or with `default` when the verdict says the host default decides.
    /// Exclusions are written to `exclusions`.
    pub fn new(policy: WasmPolicy, default: Arc<dyn OfferRanker>, exclusions: Exclusions) -> Self {
        Self {
            policy,
            default,
            exclusions,
        }
    }
}

impl OfferRanker for WasmRanker {
    /// One guest call for the whole list.
    fn rank(
        &self,
        w: &WorkloadSpec,
        offers: &[&Offer],
        attempts: &[Attempt],
    ) -> Result<Vec<f64>, PolicyError> {
        if offers.is_empty() {
            // Nothing to rank: a guest may (validly) call an empty list invalid input.
            self.exclusions.replace(HashSet::new());
            return Ok(Vec::new());
        }
        let input = wit::placement_input(wit::workload(w), offers);
        match outcome(&self.policy, "placement", self.policy.place(&input))? {
            Outcome::Answer(decision) => {
                let (scores, excluded) = wit::placement_scores(&decision, offers.len());
                let set = offers
                    .iter()
                    .zip(excluded)
                    .filter(|(_, x)| *x)
                    .map(|(o, _)| (o.provider, o.id.clone()))
                    .collect();
                self.exclusions.replace(set);
                Ok(scores)
            }
            Outcome::Default => {
                self.exclusions.replace(HashSet::new());
                self.default.rank(w, offers, attempts)
            }
        }
    }

    /// One guest call for a list of one.
    fn score(&self, w: &WorkloadSpec, o: &Offer, attempts: &[Attempt]) -> Result<f64, PolicyError> {
        let scores = self.rank(w, &[o], attempts)?;
        scores.first().copied().ok_or_else(|| {
            PolicyError::new(
                &self.policy.settings().name,
                "returned no score for one offer",
            )
        })
    }
}

/// Rejects the offers a placement guest excluded, and prices the rest with `inner`.
#[derive(Debug)]
pub struct ExcludingPricing {
    inner: Arc<dyn PricingPolicy>,
    exclusions: Exclusions,
    policy: String,
}

impl ExcludingPricing {
    /// Wraps `inner`; `policy` names the placement policy in rejection reasons.
    pub fn new(
        inner: Arc<dyn PricingPolicy>,
        exclusions: Exclusions,
        policy: impl Into<String>,
    ) -> Self {
        Self {
            inner,
            exclusions,
            policy: policy.into(),
        }
    }
}

impl PricingPolicy for ExcludingPricing {
    fn decide(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<PriceDecision, PolicyError> {
        if self.exclusions.contains(o) {
            return Ok(PriceDecision::Reject {
                reason: format!("placement policy {} excluded offer {}", self.policy, o.id),
            });
        }
        self.inner.decide(w, o, attempts)
    }
}

/// A pricing policy as the planner's pricing.
#[derive(Debug)]
pub struct WasmPricing {
    policy: WasmPolicy,
    default: Arc<dyn PricingPolicy>,
}

impl WasmPricing {
    /// Prices with `policy`, or with `default` when the host default decides.
    pub fn new(policy: WasmPolicy, default: Arc<dyn PricingPolicy>) -> Self {
        Self { policy, default }
    }
}

impl PricingPolicy for WasmPricing {
    fn decide(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<PriceDecision, PolicyError> {
        let input = wit::pricing_input(wit::workload(w), o);
        match outcome(&self.policy, "pricing", self.policy.price(&input))? {
            Outcome::Answer(decision) => Ok(wit::price_decision(&decision)),
            Outcome::Default => self.default.decide(w, o, attempts),
        }
    }
}

/// A fallback policy as the renter's fallback.
///
/// `remaining-offers` is not known here (the broker's `FallbackContext` does not carry it), so
/// guests are sent `u32::MAX`, meaning "unknown, maybe more"; the ladder still ends the walk when
/// offers run out. `elapsed-ms` counts from the first attempt's start.
#[derive(Debug)]
pub struct WasmFallback {
    policy: WasmPolicy,
    default: Arc<dyn FallbackPolicy>,
}

impl WasmFallback {
    /// Decides with `policy`, or with `default` when the host default decides.
    pub fn new(policy: WasmPolicy, default: Arc<dyn FallbackPolicy>) -> Self {
        Self { policy, default }
    }

    /// An answer the node cannot act on, treated as the guest failing: per `failurePolicy`.
    fn refused(
        &self,
        cx: &FallbackContext<'_>,
        why: String,
    ) -> Result<FallbackAction, PolicyError> {
        let settings = self.policy.settings();
        if settings.failure_policy == FailurePolicy::Ignore {
            tracing::warn!(policy = %settings.name, %why, "fallback answer refused; failurePolicy Ignore: the host default decides");
            return self.default.next_action(cx);
        }
        Err(PolicyError::new(&settings.name, why))
    }

    fn input(cx: &FallbackContext<'_>) -> wit_types::FallbackInput {
        let now = chrono::Utc::now();
        let elapsed_ms = cx
            .attempts
            .first()
            .map_or(0, |a| wit::millis_since(a.started_at, now));
        wit_types::FallbackInput {
            workload: wit::workload(cx.workload),
            attempts: wit::attempts(cx.attempts, cx.failure.class, now),
            remaining_offers: u32::MAX,
            elapsed_ms,
        }
    }
}

impl FallbackPolicy for WasmFallback {
    fn next_action(&self, cx: &FallbackContext<'_>) -> Result<FallbackAction, PolicyError> {
        let input = Self::input(cx);
        match outcome(&self.policy, "fallback", self.policy.next(&input))? {
            Outcome::Answer(action) => match wit::fallback_action(&action) {
                Ok(action) => Ok(action),
                Err(why) => self.refused(cx, why),
            },
            Outcome::Default => self.default.next_action(cx),
        }
    }
}
