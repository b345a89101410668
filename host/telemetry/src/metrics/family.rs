//! The metric shapes `Metrics` is built from: an `f64` gauge, a label-less family (a gauge that
//! can be absent), histogram families with fixed buckets, and gauges replaced from a full count.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// A gauge holding an `f64`.
pub(super) type F64Gauge = Gauge<f64, AtomicU64>;

/// The label set of a family with one unlabelled series (present or absent).
pub(super) type NoLabels = [(&'static str, &'static str); 0];

/// Builds each series' histogram with the same fixed upper bounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Buckets(&'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// A histogram per label set.
pub(super) type HistogramFamily<L> = Family<L, Histogram, Buckets>;

/// A histogram family whose series use `buckets` (seconds).
pub(super) fn histogram_family<L: Clone + Hash + Eq>(
    buckets: &'static [f64],
) -> HistogramFamily<L> {
    Family::new_with_constructor(Buckets(buckets))
}

/// An integer gauge family set only from full counts: each count replaces every value, and a
/// series seen before but absent from the count reads 0 instead of keeping its last value.
#[derive(Debug)]
pub(super) struct CountedGauge<L> {
    family: Family<L, Gauge>,
    /// Every label set ever set; the lock also serialises concurrent replacements.
    seen: Mutex<BTreeSet<L>>,
}

impl<L: Clone + Hash + Ord> Default for CountedGauge<L> {
    fn default() -> Self {
        CountedGauge {
            family: Family::default(),
            seen: Mutex::new(BTreeSet::new()),
        }
    }
}

impl<L: Clone + Hash + Ord> CountedGauge<L> {
    /// The family to register (a handle sharing the values).
    pub(super) fn family(&self) -> Family<L, Gauge> {
        self.family.clone()
    }

    /// Sets every series from `counts`; series missing from it read 0. A lock poisoned by a
    /// panicking writer is recovered: the next full count repairs whatever it left.
    pub(super) fn replace(&self, counts: BTreeMap<L, i64>) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        for labels in seen.iter().filter(|l| !counts.contains_key(*l)) {
            self.family.get_or_create(labels).set(0);
        }
        for (labels, count) in counts {
            self.family.get_or_create(&labels).set(count);
            seen.insert(labels);
        }
    }
}
