//! OTLP export of the node's metrics, beside `/metrics`: every family under its Prometheus name
//! (counters without `_total`, histograms without their unit, which the OTLP unit carries), so
//! a collector's Prometheus exporter reproduces the names `/metrics` serves. Counters and gauges
//! are observed at each export from the registry's own values (one source of truth); the three
//! histograms are recorded as they are observed, since OTLP has no histogram fed by a callback.
//!
//! Not the exporter's set-up (`crate::telemetry`), nor the families (`super`).

use std::sync::{Arc, Weak};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter, ObservableCounter, ObservableGauge};

use super::{Metrics, POLICY_BUCKETS, PROVIDER_CALL_BUCKETS, TIME_TO_RUNNING_BUCKETS};

/// Whether a family is a counter or a gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// The families exported by callback, by their registry names.
const OBSERVED: &[(&str, Kind)] = &[
    ("neocloud_burn_rate_usd_per_hour", Kind::Gauge),
    ("neocloud_budget_in_flight_usd_per_hour", Kind::Gauge),
    ("neocloud_provisioning_held_usd_per_hour", Kind::Gauge),
    ("neocloud_budget_cap_usd_per_hour", Kind::Gauge),
    ("neocloud_instances", Kind::Gauge),
    ("neocloud_pods", Kind::Gauge),
    ("neocloud_rentals", Kind::Counter),
    ("neocloud_policy_evaluations", Kind::Counter),
    ("neocloud_sweeper_deletions", Kind::Counter),
    ("neocloud_reconcile_errors", Kind::Counter),
    ("neocloud_spend_usd", Kind::Counter),
    ("neocloud_trace_spans_exported", Kind::Counter),
    ("neocloud_trace_spans_dropped", Kind::Counter),
];

/// The histograms, by their registry names without the `_seconds` unit.
pub(super) const HISTOGRAMS: [&str; 3] = [
    "neocloud_provider_call_duration",
    "neocloud_policy_evaluation_duration",
    "neocloud_pod_time_to_running",
];

/// The OTLP instruments; dropping them stops nothing (the meter provider owns the callbacks).
pub(super) struct Instruments {
    pub provider_calls: Histogram<f64>,
    pub policy_durations: Histogram<f64>,
    pub time_to_running: Histogram<f64>,
    _counters: Vec<ObservableCounter<f64>>,
    _gauges: Vec<ObservableGauge<f64>>,
}

impl Instruments {
    /// Registers every family with `meter`; the callbacks read `metrics` for as long as it lives.
    pub(super) fn new(metrics: &Arc<Metrics>, meter: &Meter) -> Instruments {
        let histogram = |name: &'static str, bounds: &[f64]| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_boundaries(bounds.to_vec())
                .build()
        };
        let mut counters = Vec::new();
        let mut gauges = Vec::new();
        for &(name, kind) in OBSERVED {
            let weak = Arc::downgrade(metrics);
            match kind {
                Kind::Counter => {
                    let sample = format!("{name}_total");
                    counters.push(
                        meter
                            .f64_observable_counter(name)
                            .with_callback(move |o| observe(&weak, &sample, |v, a| o.observe(v, a)))
                            .build(),
                    );
                }
                Kind::Gauge => {
                    gauges.push(
                        meter
                            .f64_observable_gauge(name)
                            .with_callback(move |o| observe(&weak, name, |v, a| o.observe(v, a)))
                            .build(),
                    );
                }
            }
        }
        Instruments {
            provider_calls: histogram(HISTOGRAMS[0], &PROVIDER_CALL_BUCKETS),
            policy_durations: histogram(HISTOGRAMS[1], &POLICY_BUCKETS),
            time_to_running: histogram(HISTOGRAMS[2], &TIME_TO_RUNNING_BUCKETS),
            _counters: counters,
            _gauges: gauges,
        }
    }
}

/// Calls `record` with every sample of `series` in the registry, if `metrics` still lives.
fn observe(metrics: &Weak<Metrics>, series: &str, mut record: impl FnMut(f64, &[KeyValue])) {
    let Some(metrics) = metrics.upgrade() else {
        return;
    };
    let text = metrics.encode();
    for (name, attributes, value) in text.lines().filter_map(sample) {
        if name == series {
            record(value, &attributes);
        }
    }
}

/// One sample line of the OpenMetrics text (`name{k="v",...} value`), or `None` for comments
/// and anything that does not parse.
fn sample(line: &str) -> Option<(&str, Vec<KeyValue>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series, Vec::new(), value));
    };
    let body = rest.strip_suffix('}')?;
    let mut attributes = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut v = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => v.push('\n'),
                    other => v.push(other),
                },
                '"' => break,
                c => v.push(c),
            }
        }
        attributes.push(KeyValue::new(key, v));
        if chars.next_if_eq(&',').is_none() {
            break;
        }
    }
    Some((name, attributes, value))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn samples_parse_with_escaped_label_values() {
        let (name, attrs, v) =
            sample(r#"neocloud_spend_usd_total{namespace="ml",team="a \"b\"\\c"} 1.5"#).unwrap();
        assert_eq!((name, v), ("neocloud_spend_usd_total", 1.5));
        assert_eq!(attrs[0], KeyValue::new("namespace", "ml"));
        assert_eq!(attrs[1], KeyValue::new("team", r#"a "b"\c"#));
        let (name, attrs, v) = sample("neocloud_burn_rate_usd_per_hour 0.0").unwrap();
        assert_eq!(
            (name, attrs.len(), v),
            ("neocloud_burn_rate_usd_per_hour", 0, 0.0)
        );
        assert!(sample("# TYPE neocloud_pods gauge").is_none());
        assert!(sample("# EOF").is_none());
    }

    /// Every family the registry exposes is exported over OTLP, and nothing else is.
    #[test]
    fn every_family_is_exported() {
        let m = Metrics::new();
        m.record_in_every_family();
        let exposed: BTreeSet<String> = m
            .encode()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap().to_owned())
            .collect();
        let exported: BTreeSet<String> = OBSERVED
            .iter()
            .map(|(n, _)| (*n).to_owned())
            .chain(HISTOGRAMS.iter().map(|h| format!("{h}_seconds")))
            .collect();
        assert_eq!(exposed, exported);
    }
}
