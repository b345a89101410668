//! What the renter tells the world while it rents: every attempt (written durably before the
//! provider is called), every fallback decision, and every wait with what it waits for and until
//! when. The node writes these to the binding and the Pod's events; tests keep them in memory.
//!
//! Not for deciding anything: the fallback policy and the ladder decide, the renter reports.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use neocloud_core::{Attempt, FailureClass, FallbackAction, Offer};
use neocloud_providers::retries::Retry;

/// What was decided after a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The number of the failed attempt this answers.
    pub attempt: u32,
    /// Its failure class.
    pub class: FailureClass,
    /// The action chosen.
    pub action: FallbackAction,
    /// Whether the fallback policy chose it; `false` when the renter moved on by itself (an offer
    /// taken by another renter is not the policy's business).
    pub by_policy: bool,
    /// The wait the provider asked for with the failure (`Retry-After`), if it did.
    pub retry_after: Option<Duration>,
    /// What the ladder made of it, within its limits.
    pub next: NextStep,
}

/// What follows a decision.
#[derive(Debug, Clone, PartialEq)]
pub enum NextStep {
    /// Try `offer` after `after`.
    Try {
        /// The offer tried next.
        offer: Offer,
        /// The wait before it.
        after: Duration,
        /// Whether it is the same offer as the failed attempt's.
        same_offer: bool,
    },
    /// No further attempt in this round.
    Stop {
        /// Why, in a sentence.
        reason: String,
    },
}

/// A wait before a provider call, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Wait {
    /// How long.
    pub duration: Duration,
    /// When it ends.
    pub until: DateTime<Utc>,
    /// What it waits for, as a sentence fragment: "lambda's launch spacing (one launch per 12 s)".
    pub reason: String,
    /// Who set its length.
    pub decided_by: WaitDecider,
}

/// Who set the length of a wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitDecider {
    /// The provider, in a 429's `Retry-After`.
    RetryAfter,
    /// The node's own backoff (no `Retry-After` was given, or the built-in fallback's backoff
    /// after a transient failure).
    NodeBackoff,
    /// The provider's spacing of creates (Lambda allows one launch every few seconds).
    LaunchSpacing,
    /// A fallback policy, by name.
    Policy(String),
}

impl std::fmt::Display for WaitDecider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitDecider::RetryAfter => f.write_str("the provider's Retry-After"),
            WaitDecider::NodeBackoff => f.write_str("the node's backoff"),
            WaitDecider::LaunchSpacing => f.write_str("the provider's launch spacing"),
            WaitDecider::Policy(name) => write!(f, "policy {name}"),
        }
    }
}

impl Decision {
    /// The action as a short kebab-case label: `retry-same-offer`, `next-offer`, `skip-provider`,
    /// `wait`, `give-up`.
    pub fn action_label(&self) -> &'static str {
        action_label(&self.action)
    }

    /// The decision in a sentence fragment, such as "try the next offer (vast offer 7) at once"
    /// or "wait 30s, then retry the same offer".
    pub fn describe(&self) -> String {
        let chosen = match &self.action {
            FallbackAction::RetrySameOffer { .. } => "retry the same offer".to_owned(),
            FallbackAction::NextOffer => "try the next offer".to_owned(),
            FallbackAction::SkipProvider { provider } => format!("skip provider {provider}"),
            FallbackAction::Wait { .. } => "wait and retry the same offer".to_owned(),
            FallbackAction::GiveUp { reason } => format!("give up ({reason})"),
        };
        match &self.next {
            NextStep::Try { offer, after, .. } => {
                let when = if after.is_zero() {
                    "at once".to_owned()
                } else {
                    format!("after {}", seconds(*after))
                };
                format!(
                    "{chosen}: next is {} offer {} {when}",
                    offer.provider, offer.id
                )
            }
            NextStep::Stop { reason } if matches!(self.action, FallbackAction::GiveUp { .. }) => {
                let _ = reason;
                chosen
            }
            NextStep::Stop { reason } => format!("{chosen}, but {reason}"),
        }
    }
}

/// The kebab-case label of an action.
pub fn action_label(action: &FallbackAction) -> &'static str {
    match action {
        FallbackAction::RetrySameOffer { .. } => "retry-same-offer",
        FallbackAction::NextOffer => "next-offer",
        FallbackAction::SkipProvider { .. } => "skip-provider",
        FallbackAction::Wait { .. } => "wait",
        FallbackAction::GiveUp { .. } => "give-up",
    }
}

pub use neocloud_providers::retries::seconds;

/// Writes attempts durably (the node writes them to the binding status) and reports decisions
/// and waits.
#[async_trait]
pub trait AttemptRecorder: Send + Sync {
    /// Records a new or updated attempt (same `number` means update). An error stops renting.
    async fn record(&self, attempt: &Attempt) -> Result<(), String>;

    /// Reports what was decided after a failed attempt. An error stops renting.
    async fn decided(&self, decision: &Decision) -> Result<(), String> {
        let _ = decision;
        Ok(())
    }

    /// Reports a wait before a provider call that is not a decision's (a provider's own spacing
    /// of creates).
    async fn waiting(&self, wait: &Wait) {
        let _ = wait;
    }

    /// Reports the requests the adapter sent again within `attempt`'s provider call (429s, 5xx,
    /// timeouts), before the attempt's outcome is recorded. Called only when there were some.
    async fn retried(&self, attempt: &Attempt, retries: &[Retry]) {
        let _ = (attempt, retries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neocloud_core::ProviderId;

    fn offer() -> Offer {
        Offer {
            gpu: neocloud_core::GpuModel::Known {
                name: "A40".into(),
                memory_gib: 48,
            },
            region: "US".into(),
            reliability: None,
            disk_gib: None,
            ..neocloud_fixtures::offer(ProviderId::Vast, "7", "A40", 0.4)
        }
    }

    #[test]
    fn a_decision_says_what_was_chosen_and_what_comes_next() {
        let d = Decision {
            attempt: 2,
            class: FailureClass::RateLimited,
            action: FallbackAction::Wait {
                duration: Duration::from_secs(30),
            },
            by_policy: true,
            retry_after: None,
            next: NextStep::Try {
                offer: offer(),
                after: Duration::from_secs(30),
                same_offer: true,
            },
        };
        assert_eq!(d.action_label(), "wait");
        assert_eq!(
            d.describe(),
            "wait and retry the same offer: next is vast offer 7 after 30s"
        );
    }

    #[test]
    fn a_decision_the_ladder_overrules_says_why() {
        let d = Decision {
            attempt: 10,
            class: FailureClass::Transient,
            action: FallbackAction::RetrySameOffer {
                after: Duration::from_millis(1500),
            },
            by_policy: true,
            retry_after: None,
            next: NextStep::Stop {
                reason: "reached the limit of 10 attempts".into(),
            },
        };
        assert_eq!(
            d.describe(),
            "retry the same offer, but reached the limit of 10 attempts"
        );
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5s");
    }
}
