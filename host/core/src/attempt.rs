//! The record of one try to rent an offer, and the action a fallback policy answers with.
//!
//! Attempts are history: the node writes them to the binding status and passes them to policies.
//! Not for deciding anything; the broker's fallback ladder does that.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::failure::FailureClass;
use crate::provider_id::ProviderId;

/// One try to rent one offer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    /// 1 for the first try of a workload, then 2, 3...
    pub number: u32,
    /// The provider asked.
    pub provider: ProviderId,
    /// The provider's offer id.
    pub offer_id: String,
    /// The price per hour of the whole instance we accepted for this try.
    pub price_per_hour: f64,
    /// When the try started.
    pub started_at: DateTime<Utc>,
    /// How it ended.
    pub outcome: AttemptOutcome,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum AttemptOutcome {
    /// The attempt has been recorded but has not finished (written before the provider call).
    InFlight,
    /// The provider created (or already had) the instance.
    Rented {
        /// The provider's instance id.
        instance_id: String,
    },
    /// The try failed.
    Failed {
        /// The class that drives the fallback ladder.
        class: FailureClass,
        /// The provider's own error code, when it has one.
        code: Option<String>,
        /// A short message, never containing credentials.
        message: String,
    },
}

impl Attempt {
    /// The failure class, if this attempt failed.
    pub fn failure(&self) -> Option<FailureClass> {
        match &self.outcome {
            AttemptOutcome::Failed { class, .. } => Some(*class),
            _ => None,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum FallbackAction {
    /// Try the same offer again after a delay.
    RetrySameOffer {
        /// How long to wait first.
        after: Duration,
    },
    /// Move on to the next candidate offer.
    NextOffer,
    /// Drop every remaining offer of this provider, then move on.
    SkipProvider {
        /// The provider to skip.
        provider: ProviderId,
    },
    /// Wait, then try the same offer again (rate limits).
    Wait {
        /// How long to wait.
        duration: Duration,
    },
    /// Stop trying; the workload stays unplaced.
    GiveUp {
        /// Why, for the Pod's events and conditions.
        reason: String,
    },
}
