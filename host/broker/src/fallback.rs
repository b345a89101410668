//! Fallback policies: given a failed attempt, what to do next. The built-in default follows
//! SkyPilot's and dstack's failover (capacity: next offer; quota or auth: skip the provider; rate
//! limited: wait for Retry-After; transient: capped exponential backoff with jitter; invalid
//! request: give up). A Wasm or CEL fallback policy implements the same trait.
//!
//! Not for enforcing limits: the ladder (`ladder`) caps attempts and time whatever a policy says.

use std::fmt;
use std::time::Duration;

use neocloud_core::{Attempt, FailureClass, FallbackAction, ProviderId, WorkloadSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::policy::PolicyError;

/// The failure a fallback policy is asked about.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The class.
    pub class: FailureClass,
    /// The provider of the failed attempt.
    pub provider: ProviderId,
    /// The provider's Retry-After, if any.
    pub retry_after: Option<Duration>,
}

/// What a fallback policy sees.
#[derive(Debug, Clone)]
pub struct FallbackContext<'a> {
    /// The workload.
    pub workload: &'a WorkloadSpec,
    /// Every attempt so far, the failed one last.
    pub attempts: &'a [Attempt],
    /// The failure to answer.
    pub failure: Failure,
    /// How many times the current offer has already been retried.
    pub retries_of_offer: u32,
}

/// A fallback policy.
pub trait FallbackPolicy: Send + Sync + fmt::Debug {
    /// The next action after a failure. An error ends the ladder (the node's `failurePolicy`
    /// decides what that means for the Pod).
    fn next_action(&self, cx: &FallbackContext<'_>) -> Result<FallbackAction, PolicyError>;
}

/// Capped exponential backoff with deterministic jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// Each retry multiplies the delay by this.
    pub factor: f64,
    /// No delay is longer.
    pub cap: Duration,
    /// Jitter as a fraction of the delay (0.2 = plus or minus 20%).
    pub jitter: f64,
    /// The seed of the jitter; the same seed and retry number give the same delay.
    pub seed: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            factor: 2.0,
            cap: Duration::from_secs(30),
            jitter: 0.2,
            seed: 0,
        }
    }
}

impl Backoff {
    /// The delay before retry number `retry` (0-based) of attempt number `attempt`; always within
    /// `[0, cap]`.
    pub fn delay(&self, retry: u32, attempt: usize) -> Duration {
        let base = self.initial.as_secs_f64() * self.factor.max(1.0).powi(retry.min(64) as i32);
        let capped = base.min(self.cap.as_secs_f64());
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ (attempt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let spread = self.jitter.clamp(0.0, 1.0);
        let factor = if spread > 0.0 {
            rng.random_range(1.0 - spread..=1.0 + spread)
        } else {
            1.0
        };
        Duration::from_secs_f64((capped * factor).clamp(0.0, self.cap.as_secs_f64()))
    }
}

/// The built-in fallback ladder.
#[derive(Debug, Clone, PartialEq)]
pub struct DefaultFallback {
    /// Backoff for transient failures and timeouts.
    pub backoff: Backoff,
    /// Retries of one offer after transient failures before moving to the next offer.
    pub max_retries_per_offer: u32,
    /// The wait when a rate-limited answer has no Retry-After.
    pub default_rate_limit_wait: Duration,
    /// The longest Retry-After honoured; longer ones move to the next offer instead.
    pub max_rate_limit_wait: Duration,
}

impl Default for DefaultFallback {
    fn default() -> Self {
        DefaultFallback {
            backoff: Backoff::default(),
            max_retries_per_offer: 3,
            default_rate_limit_wait: Duration::from_secs(5),
            max_rate_limit_wait: Duration::from_secs(60),
        }
    }
}

impl FallbackPolicy for DefaultFallback {
    fn next_action(&self, cx: &FallbackContext<'_>) -> Result<FallbackAction, PolicyError> {
        let f = &cx.failure;
        let action = match f.class {
            FailureClass::Capacity | FailureClass::PriceExceeded | FailureClass::OfferTaken => {
                FallbackAction::NextOffer
            }
            FailureClass::Preempted | FailureClass::Lost => FallbackAction::NextOffer,
            FailureClass::Quota | FailureClass::Auth => FallbackAction::SkipProvider {
                provider: f.provider,
            },
            FailureClass::InvalidRequest => FallbackAction::GiveUp {
                reason: format!(
                    "{} rejected the request as invalid; retrying elsewhere would not help",
                    f.provider
                ),
            },
            FailureClass::RateLimited => {
                let wait = f.retry_after.unwrap_or(self.default_rate_limit_wait);
                if wait <= self.max_rate_limit_wait {
                    FallbackAction::Wait { duration: wait }
                } else {
                    FallbackAction::NextOffer
                }
            }
            FailureClass::Transient | FailureClass::Timeout => {
                if cx.retries_of_offer < self.max_retries_per_offer {
                    FallbackAction::RetrySameOffer {
                        after: self.backoff.delay(cx.retries_of_offer, cx.attempts.len()),
                    }
                } else {
                    FallbackAction::NextOffer
                }
            }
        };
        Ok(action)
    }
}
