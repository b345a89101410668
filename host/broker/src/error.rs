//! The broker's error type: what callers (the node's reconcilers) see when planning or renting
//! cannot go on.
//!
//! Provider failures inside the fallback ladder are not errors here; they are attempts.

use neocloud_core::Attempt;
use neocloud_providers::ProviderError;

use crate::policy::PolicyError;

/// Why the broker could not place a workload.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BrokerError {
    /// A ranking policy failed, so no plan could be made.
    #[error("failed to plan: {0}")]
    Policy(#[from] PolicyError),
    /// The plan is empty.
    #[error("failed to plan: {explanation}")]
    NoCandidates {
        /// The plan's explanation.
        explanation: String,
    },
    /// The fallback ladder ended without a rental.
    #[error("gave up renting {external_name} after {} attempts: {reason}", attempts.len())]
    GaveUp {
        /// The instance name we tried to rent under.
        external_name: String,
        /// Why the ladder stopped.
        reason: String,
        /// Every attempt made.
        attempts: Vec<Attempt>,
    },
    /// Every offer left in the plan was taken by other renters between planning and create:
    /// plan again with fresh offers (not a failure of the workload's, nor the policy's).
    #[error("the offers planned for {external_name} were taken by other renters; planning again")]
    OffersTaken {
        /// The instance name.
        external_name: String,
        /// Every attempt made.
        attempts: Vec<Attempt>,
    },
    /// Writing an attempt to the binding failed, so renting stopped before the provider call.
    #[error("failed to record attempt {number} for {external_name}: {message}")]
    Record {
        /// The instance name.
        external_name: String,
        /// The attempt number.
        number: u32,
        /// What the recorder said.
        message: String,
    },
    /// A provider call outside the ladder failed (e.g. looking up an instance of unknown outcome).
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

impl BrokerError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            BrokerError::Policy(_) => false,
            BrokerError::NoCandidates { .. }
            | BrokerError::GaveUp { .. }
            | BrokerError::OffersTaken { .. } => true,
            BrokerError::Record { .. } => true,
            BrokerError::Provider(e) => e.class.is_transient(),
        }
    }

    /// A short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            BrokerError::Policy(_) => "policy",
            BrokerError::NoCandidates { .. } => "no-candidates",
            BrokerError::GaveUp { .. } => "gave-up",
            BrokerError::OffersTaken { .. } => "offers-taken",
            BrokerError::Record { .. } => "record",
            BrokerError::Provider(e) => e.class.label(),
        }
    }
}
