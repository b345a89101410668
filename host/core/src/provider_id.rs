//! Which cloud an offer or instance belongs to.
//!
//! A closed set on purpose: the hot path (planning over thousands of offers, Wasm policies)
//! compares small enums, not strings. Not for provider configuration or credentials.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A GPU cloud NeoCloud Node can rent from.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ProviderId {
    /// RunPod pods.
    Runpod,
    /// Lambda Cloud virtual machines.
    Lambda,
    /// Vast.ai marketplace instances.
    Vast,
    /// Another Kubernetes cluster (an AI-factory workload cluster).
    Kube,
    /// The in-memory fake cloud used by tests and the default deployment.
    Fake,
}

impl ProviderId {
    /// Every provider, in a fixed order.
    pub const ALL: [ProviderId; 5] = [
        ProviderId::Runpod,
        ProviderId::Lambda,
        ProviderId::Vast,
        ProviderId::Kube,
        ProviderId::Fake,
    ];

    /// The lower-case name used in annotations, metrics and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderId::Runpod => "runpod",
            ProviderId::Lambda => "lambda",
            ProviderId::Vast => "vast",
            ProviderId::Kube => "kube",
            ProviderId::Fake => "fake",
        }
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a provider name that is not one of [`ProviderId::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a known provider (expected one of runpod, lambda, vast, kube, fake)")]
pub struct UnknownProvider(pub String);

impl FromStr for ProviderId {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProviderId::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownProvider(s.to_owned()))
    }
}
