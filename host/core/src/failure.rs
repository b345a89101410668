//! How a failed provider call or rental is classified, so the fallback ladder and policies can
//! decide what to do next without reading error text.
//!
//! Classification itself happens in the provider adapters; this module only names the classes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a rental (or a provider call) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureClass {
    /// The provider has no capacity for this offer right now (or the offer vanished).
    Capacity,
    /// An account quota or spend limit stops every rental on this provider.
    Quota,
    /// The credentials were refused; nothing on this provider will succeed.
    Auth,
    /// The provider asked us to slow down (HTTP 429), possibly with a Retry-After.
    RateLimited,
    /// The request itself is wrong; retrying it anywhere gives the same answer.
    InvalidRequest,
    /// A temporary provider or network error (5xx, reset connection).
    Transient,
    /// The fresh price is above the Pod's or the policy's maximum.
    PriceExceeded,
    /// The call did not answer in time; its outcome is unknown.
    Timeout,
    /// A spot instance was reclaimed by the provider.
    Preempted,
    /// The instance disappeared from the provider, or an on-demand one stopped, without us
    /// deleting or stopping it.
    Lost,
    /// Another renter took the offer between planning and create (it is gone from fresh offer
    /// data). Not the provider's capacity and not the policy's business: the ladder moves on to
    /// the next offer or plans again, without spending the policy's attempt budget.
    OfferTaken,
}

impl FailureClass {
    /// Every class, in a fixed order.
    pub const ALL: [FailureClass; 11] = [
        FailureClass::Capacity,
        FailureClass::Quota,
        FailureClass::Auth,
        FailureClass::RateLimited,
        FailureClass::InvalidRequest,
        FailureClass::Transient,
        FailureClass::PriceExceeded,
        FailureClass::Timeout,
        FailureClass::Preempted,
        FailureClass::Lost,
        FailureClass::OfferTaken,
    ];

    /// The short, stable label used in metrics, conditions and policies.
    pub fn label(self) -> &'static str {
        match self {
            FailureClass::Capacity => "capacity",
            FailureClass::Quota => "quota",
            FailureClass::Auth => "auth",
            FailureClass::RateLimited => "rate-limited",
            FailureClass::InvalidRequest => "invalid-request",
            FailureClass::Transient => "transient",
            FailureClass::PriceExceeded => "price-exceeded",
            FailureClass::Timeout => "timeout",
            FailureClass::Preempted => "preempted",
            FailureClass::Lost => "lost",
            FailureClass::OfferTaken => "offer-taken",
        }
    }

    /// Whether the same call may succeed if repeated later without any change.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            FailureClass::RateLimited | FailureClass::Transient | FailureClass::Timeout
        )
    }

    /// Whether the outcome of a create that failed this way is unknown, so the instance must be
    /// looked up by external name before any retry.
    pub fn outcome_unknown(self) -> bool {
        matches!(self, FailureClass::Timeout | FailureClass::Transient)
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The error for a failure class label that is not one of [`FailureClass::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a failure class")]
pub struct UnknownFailureClass(pub String);

impl FromStr for FailureClass {
    type Err = UnknownFailureClass;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FailureClass::ALL
            .into_iter()
            .find(|c| c.label() == s)
            .ok_or_else(|| UnknownFailureClass(s.to_owned()))
    }
}
