//! Spend showback: `neocloud_spend_usd_total`, a counter of the USD the node's instances have
//! cost, charged to the labels the operator chose among namespace, team (a Pod label of their
//! choosing), provider and GPU model. Fed from the cost ledger's per-binding accrual every few
//! seconds and once more with the final figure when a binding's instances are gone, it counts
//! each binding's cost once, in increments, so `increase()` over any window is what was spent in
//! it. A restarted node counts what its running bindings accrued before, once, when it first
//! sees them.
//!
//! Not the burn rate (a gauge, in `super`) nor the per-binding figure on the binding's status.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::{Deserialize, Serialize};

/// A label `neocloud_spend_usd_total` may carry. Each one multiplies the series: choose what
/// the team's dashboards need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SpendLabel {
    /// The Pod's namespace.
    Namespace,
    /// The value of the Pod label `spend.teamLabel` ("" when the Pod has none).
    Team,
    /// The provider (runpod, lambda, vast, fake).
    Provider,
    /// The GPU model, as on the binding (`A40`, `H100 SXM`).
    Gpu,
}

impl SpendLabel {
    fn name(self) -> &'static str {
        match self {
            SpendLabel::Namespace => "namespace",
            SpendLabel::Team => "team",
            SpendLabel::Provider => "provider",
            SpendLabel::Gpu => "gpu",
        }
    }
}

/// The labels when none are configured.
pub const DEFAULT_SPEND_LABELS: [SpendLabel; 3] =
    [SpendLabel::Namespace, SpendLabel::Provider, SpendLabel::Gpu];

/// What one binding has cost so far and whom it is charged to.
#[derive(Debug, Clone, Copy)]
pub struct BindingSpend<'a> {
    /// `namespace/name` of the binding.
    pub binding: &'a str,
    /// USD accrued by every instance of the binding so far.
    pub accrued_usd: f64,
    pub namespace: &'a str,
    /// The Pod's team label value, if the Pod is known and has one.
    pub team: Option<&'a str>,
    pub provider: &'a str,
    /// The binding's GPU as on its status (`1x A40`); the count is dropped.
    pub gpu: &'a str,
}

type Labels = Vec<(&'static str, String)>;

/// The counter and what it has counted per binding.
#[derive(Debug)]
pub(super) struct SpendCounter {
    by: Mutex<Vec<SpendLabel>>,
    family: Family<Labels, Counter<f64, AtomicU64>>,
    /// Per binding: the labels it was last charged to and the accrual counted so far.
    counted: Mutex<HashMap<String, (Labels, f64)>>,
}

impl Default for SpendCounter {
    fn default() -> Self {
        SpendCounter {
            by: Mutex::new(DEFAULT_SPEND_LABELS.to_vec()),
            family: Family::default(),
            counted: Mutex::default(),
        }
    }
}

impl SpendCounter {
    pub(super) fn family(&self) -> Family<Labels, Counter<f64, AtomicU64>> {
        self.family.clone()
    }

    pub(super) fn set_labels(&self, by: &[SpendLabel]) {
        let mut labels = by.to_vec();
        labels.dedup();
        *self.by.lock().unwrap_or_else(PoisonError::into_inner) = labels;
    }

    fn labels(&self, s: &BindingSpend<'_>) -> Labels {
        let gpu = neocloud_api::gpu_model(s.gpu);
        let by = self.by.lock().unwrap_or_else(PoisonError::into_inner);
        by.iter()
            .map(|label| {
                let value = match label {
                    SpendLabel::Namespace => s.namespace,
                    SpendLabel::Team => s.team.unwrap_or_default(),
                    SpendLabel::Provider => s.provider,
                    SpendLabel::Gpu => gpu,
                };
                (label.name(), value.to_owned())
            })
            .collect()
    }

    /// Counts what `s` accrued since it was last seen.
    pub(super) fn observe(&self, s: &BindingSpend<'_>) {
        let labels = self.labels(s);
        let mut counted = self.counted.lock().unwrap_or_else(PoisonError::into_inner);
        let (labels, before) = match counted.remove(s.binding) {
            // A Pod no longer in the cache keeps the team it was charged to.
            Some((known, before)) if s.team.is_none() => (merge_team(labels, &known), before),
            Some((_, before)) => (labels, before),
            None => (labels, 0.0),
        };
        let delta = s.accrued_usd - before;
        if delta.is_finite() && delta > 0.0 {
            self.family.get_or_create(&labels).inc_by(delta);
        }
        counted.insert(s.binding.to_owned(), (labels, s.accrued_usd.max(before)));
    }

    /// Counts the rest of `s`'s final accrual and forgets it.
    pub(super) fn finish(&self, s: &BindingSpend<'_>) {
        self.observe(s);
        self.counted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(s.binding);
    }
}

/// `labels` with the team value of `known` (the binding's Pod is gone; its team is not).
fn merge_team(mut labels: Labels, known: &Labels) -> Labels {
    if let Some(team) = known.iter().find(|(name, _)| *name == "team") {
        for label in labels.iter_mut().filter(|(name, _)| *name == "team") {
            label.1 = team.1.clone();
        }
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend<'a>(
        binding: &'a str,
        usd: f64,
        team: Option<&'a str>,
        provider: &'a str,
    ) -> BindingSpend<'a> {
        BindingSpend {
            binding,
            accrued_usd: usd,
            namespace: "ml",
            team,
            provider,
            gpu: "2x H100 SXM",
        }
    }

    fn total(c: &SpendCounter, labels: &[(&'static str, &str)]) -> f64 {
        let labels: Labels = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        c.family.get_or_create(&labels).get()
    }

    #[test]
    fn each_binding_is_counted_once_in_increments_under_the_configured_labels() {
        let c = SpendCounter::default();
        c.set_labels(&[SpendLabel::Team, SpendLabel::Gpu]);
        c.observe(&spend("ml/a", 1.0, Some("vision"), "runpod"));
        c.observe(&spend("ml/a", 1.5, Some("vision"), "runpod"));
        c.observe(&spend("ml/a", 1.5, Some("vision"), "runpod"));
        c.observe(&spend("ml/b", 0.25, Some("vision"), "vast"));
        let vision = [("team", "vision"), ("gpu", "H100 SXM")];
        assert!((total(&c, &vision) - 1.75).abs() < 1e-9);

        // The Pod is gone from the cache: its last figure still goes to its team.
        c.finish(&spend("ml/a", 2.0, None, "runpod"));
        assert!((total(&c, &vision) - 2.25).abs() < 1e-9);
        // A finished binding seen again (a stale cache) counts from zero only if really new;
        // the figure never goes down.
        c.observe(&spend("ml/b", 0.2, Some("vision"), "vast"));
        assert!((total(&c, &vision) - 2.25).abs() < 1e-9);
        let nobody = [("team", ""), ("gpu", "H100 SXM")];
        c.observe(&spend("ml/c", 0.5, None, "lambda"));
        assert!((total(&c, &nobody) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn the_default_labels_are_namespace_provider_and_gpu() {
        let c = SpendCounter::default();
        c.observe(&spend("ml/a", 3.0, Some("vision"), "lambda"));
        let labels = [
            ("namespace", "ml"),
            ("provider", "lambda"),
            ("gpu", "H100 SXM"),
        ];
        assert!((total(&c, &labels) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn labels_are_configured_from_their_names() {
        let by: Vec<SpendLabel> = serde_json::from_str(r#"["namespace","team"]"#).unwrap();
        assert_eq!(by, [SpendLabel::Namespace, SpendLabel::Team]);
        let bad = serde_json::from_str::<Vec<SpendLabel>>(r#"["pod"]"#).unwrap_err();
        assert!(bad.to_string().contains("unknown variant `pod`"), "{bad}");
    }
}
