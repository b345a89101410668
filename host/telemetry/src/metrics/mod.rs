//! The node's Prometheus metrics: one registry holding every `neocloud_*` family, typed methods
//! to record into it, wrappers that time provider calls and policy evaluations, and the HTTP
//! endpoint (`/metrics`, `/healthz`, `/readyz`) that exposes them.
//!
//! Not for deciding anything: callers record what happened; nothing here reads a metric back to
//! change behaviour. Metric names and labels are stable and documented in the README.

mod family;
mod http;
mod otlp;
mod policy;
mod provider;
mod spend;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use neocloud_broker::CostSnapshot;
use neocloud_core::{FailureClass, InstancePhase, ProviderId};
use neocloud_providers::Operation;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

use family::{CountedGauge, F64Gauge, HistogramFamily, NoLabels, histogram_family};
pub use http::serve;
pub use policy::{
    InstrumentedFallback, InstrumentedFilter, InstrumentedPricing, InstrumentedRanker,
};
pub use provider::{InstrumentedProvider, instrument, operation_label};
pub use spend::{BindingSpend, DEFAULT_SPEND_LABELS, SpendLabel};

/// Upper bounds (seconds) for provider HTTP calls: 5 ms to 60 s.
const PROVIDER_CALL_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Upper bounds (seconds) for policy evaluations: 10 µs (a CEL expression) to 1 s (a slow Wasm
/// guest near its deadline).
const POLICY_BUCKETS: [f64; 16] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0,
];

/// Upper bounds (seconds) for a Pod's time from creation to Running: a second (an instance
/// adopted warm) to an hour (a large image on a slow cloud).
const TIME_TO_RUNNING_BUCKETS: [f64; 12] = [
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
];

/// How a rental ended, for `neocloud_rentals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RentalOutcome {
    /// A new instance was rented.
    Created,
    /// An instance with our external name already existed and was taken over.
    Adopted,
    /// The rental failed with this class.
    Failed(FailureClass),
}

impl RentalOutcome {
    /// The `outcome` and `class` labels.
    fn labels(self) -> (&'static str, &'static str) {
        match self {
            RentalOutcome::Created => ("created", "none"),
            RentalOutcome::Adopted => ("adopted", "none"),
            RentalOutcome::Failed(class) => ("failed", class.label()),
        }
    }
}

/// Which hook a policy evaluation served, for the `kind` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Ranking offers (`OfferRanker`).
    Placement,
    /// Choosing the next step after a failure (`FallbackPolicy`).
    Fallback,
    /// Accepting an offer with a ceiling and a bid (`PricingPolicy`).
    Pricing,
    /// Accepting or rejecting one offer (`OfferFilter`).
    Filter,
}

impl PolicyKind {
    /// The `kind` label.
    pub fn label(self) -> &'static str {
        match self {
            PolicyKind::Placement => "placement",
            PolicyKind::Fallback => "fallback",
            PolicyKind::Pricing => "pricing",
            PolicyKind::Filter => "filter",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct InstanceLabels {
    provider: &'static str,
    phase: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct PodLabels {
    phase: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RentalLabels {
    provider: &'static str,
    outcome: &'static str,
    class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ProviderLabels {
    provider: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CallLabels {
    provider: &'static str,
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PolicyOutcomeLabels {
    policy: String,
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SweepLabels {
    provider: &'static str,
    mode: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// Every metric of the node over one registry. Share it as `Arc<Metrics>`; every method takes
/// `&self` and is safe to call concurrently. Nothing here panics: the families use locks that
/// cannot be poisoned, and the two replace-style gauges recover a poisoned lock.
pub struct Metrics {
    registry: Registry,
    burn_rate: F64Gauge,
    in_flight: F64Gauge,
    held: F64Gauge,
    budget_cap: Family<NoLabels, F64Gauge>,
    instances: CountedGauge<InstanceLabels>,
    rentals: Family<RentalLabels, Counter>,
    provider_calls: HistogramFamily<CallLabels>,
    policy_evaluations: Family<PolicyOutcomeLabels, Counter>,
    policy_durations: HistogramFamily<PolicyLabels>,
    sweeper_deletions: Family<SweepLabels, Counter>,
    pods: CountedGauge<PodLabels>,
    reconcile_errors: Family<ReasonLabels, Counter>,
    spend: spend::SpendCounter,
    time_to_running: HistogramFamily<ProviderLabels>,
    /// The OTLP instruments, once [`Metrics::export_otlp`] is called.
    otlp: std::sync::OnceLock<otlp::Instruments>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every family registered. The burn rate and in-flight gauges read 0 from
    /// the start; every other family is left out of the exposition until it holds a series.
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("neocloud"),
            burn_rate: F64Gauge::default(),
            in_flight: F64Gauge::default(),
            held: F64Gauge::default(),
            budget_cap: Family::default(),
            instances: CountedGauge::default(),
            rentals: Family::default(),
            provider_calls: histogram_family(&PROVIDER_CALL_BUCKETS),
            policy_evaluations: Family::default(),
            policy_durations: histogram_family(&POLICY_BUCKETS),
            sweeper_deletions: Family::default(),
            pods: CountedGauge::default(),
            reconcile_errors: Family::default(),
            spend: spend::SpendCounter::default(),
            time_to_running: histogram_family(&TIME_TO_RUNNING_BUCKETS),
            otlp: std::sync::OnceLock::new(),
        };
        m.register();
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        let usd = "USD per hour";
        r.register(
            "burn_rate_usd_per_hour",
            format!("What the running instances cost now, {usd}"),
            self.burn_rate.clone(),
        );
        r.register(
            "budget_in_flight_usd_per_hour",
            format!("Budget reserved for rentals in flight, {usd}"),
            self.in_flight.clone(),
        );
        r.register(
            "provisioning_held_usd_per_hour",
            format!(
                "Budget held for admitted ProvisioningRequests whose Pods have not come yet, {usd} \
                 (also counted in budget_in_flight_usd_per_hour)"
            ),
            self.held.clone(),
        );
        r.register(
            "budget_cap_usd_per_hour",
            format!("The cluster spending cap, {usd}; no sample when there is no cap"),
            self.budget_cap.clone(),
        );
        r.register(
            "instances",
            "Instances we hold, by provider and phase, from the latest full count",
            self.instances.family(),
        );
        r.register(
            "rentals",
            "Rentals by provider, outcome (created, adopted, failed) and failure class",
            self.rentals.clone(),
        );
        r.register_with_unit(
            "provider_call_duration",
            "Provider API calls by provider, operation and outcome (ok or failure class)",
            Unit::Seconds,
            self.provider_calls.clone(),
        );
        r.register(
            "policy_evaluations",
            "Policy evaluations by policy, kind and outcome (ok or error)",
            self.policy_evaluations.clone(),
        );
        r.register_with_unit(
            "policy_evaluation_duration",
            "Policy evaluation latency by policy and kind",
            Unit::Seconds,
            self.policy_durations.clone(),
        );
        r.register(
            "sweeper_deletions",
            "Orphaned instances the sweeper deleted (or would have, in dry run)",
            self.sweeper_deletions.clone(),
        );
        r.register(
            "pods",
            "Pods on the node by phase, from the latest full count",
            self.pods.family(),
        );
        r.register(
            "reconcile_errors",
            "Reconcile errors by reason",
            self.reconcile_errors.clone(),
        );
        r.register(
            "spend_usd",
            "USD spent on instances, by the configured labels (namespace, team, provider, gpu)",
            self.spend.family(),
        );
        r.register_with_unit(
            "pod_time_to_running",
            "From a Pod's creation to its instance Running, by provider",
            Unit::Seconds,
            self.time_to_running.clone(),
        );
        crate::telemetry::register_metrics(r);
    }

    /// Exports every family over OTLP through `meter` too (the exporter is set up by
    /// `crate::telemetry`); a second call does nothing.
    pub fn export_otlp(self: &std::sync::Arc<Self>, meter: &opentelemetry::metrics::Meter) {
        let _ = self
            .otlp
            .get_or_init(|| otlp::Instruments::new(self, meter));
    }

    /// Sets what the running instances cost now, USD per hour.
    pub fn set_burn_rate(&self, usd_per_hour: f64) {
        self.burn_rate.set(usd_per_hour);
    }

    /// Sets the budget reserved for rentals in flight, USD per hour.
    pub fn set_budget_in_flight(&self, usd_per_hour: f64) {
        self.in_flight.set(usd_per_hour);
    }

    /// Sets the budget held for admitted ProvisioningRequests, USD per hour.
    pub fn set_provisioning_held(&self, usd_per_hour: f64) {
        self.held.set(usd_per_hour);
    }

    /// Sets the cluster cap, USD per hour. `None` (no cap) removes the sample, so the family has
    /// no value rather than a misleading 0 (which would read as "nothing may be spent").
    pub fn set_budget_cap(&self, usd_per_hour: Option<f64>) {
        match usd_per_hour {
            Some(cap) => {
                self.budget_cap.get_or_create(&[]).set(cap);
            }
            None => self.budget_cap.clear(),
        }
    }

    /// The labels `neocloud_spend_usd_total` carries from now on (configuration, at start).
    pub fn set_spend_labels(&self, by: &[SpendLabel]) {
        self.spend.set_labels(by);
    }

    /// Counts what a binding accrued since it was last seen into `neocloud_spend_usd_total`.
    pub fn observe_spend(&self, spend: &BindingSpend<'_>) {
        self.spend.observe(spend);
    }

    /// Counts a binding's final accrual (its instances are gone) and forgets it.
    pub fn finish_spend(&self, spend: &BindingSpend<'_>) {
        self.spend.finish(spend);
    }

    /// Sets the burn rate, in-flight budget and cap from the broker's snapshot.
    pub fn set_cost(&self, cost: &CostSnapshot) {
        self.set_burn_rate(cost.burn_usd_per_hour);
        self.set_budget_in_flight(cost.in_flight_usd_per_hour);
        self.set_budget_cap(cost.cap_usd_per_hour);
    }

    /// Replaces `neocloud_instances` with a fresh count: one `(provider, phase)` item per
    /// instance. Every series seen before and absent now reads 0.
    pub fn set_instances(&self, instances: impl IntoIterator<Item = (ProviderId, InstancePhase)>) {
        let mut counts = BTreeMap::new();
        for (provider, phase) in instances {
            let labels = InstanceLabels {
                provider: provider.as_str(),
                phase: phase.to_string(),
            };
            *counts.entry(labels).or_insert(0) += 1;
        }
        self.instances.replace(counts);
    }

    /// Replaces `neocloud_pods` with a fresh count: one phase (`Pending`, `Running`, ...) per
    /// Pod on the node. Every phase seen before and absent now reads 0.
    pub fn set_pods<S: AsRef<str>>(&self, phases: impl IntoIterator<Item = S>) {
        let mut counts = BTreeMap::new();
        for phase in phases {
            let labels = PodLabels {
                phase: phase.as_ref().to_owned(),
            };
            *counts.entry(labels).or_insert(0) += 1;
        }
        self.pods.replace(counts);
    }

    /// Records how long a Pod placed on `provider` took from its creation to Running.
    pub fn observe_time_to_running(&self, provider: ProviderId, elapsed: Duration) {
        let labels = ProviderLabels {
            provider: provider.as_str(),
        };
        self.time_to_running
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if let Some(o) = self.otlp.get() {
            o.time_to_running.record(
                elapsed.as_secs_f64(),
                &[opentelemetry::KeyValue::new("provider", labels.provider)],
            );
        }
    }

    /// Counts one rental on `provider`.
    pub fn record_rental(&self, provider: ProviderId, outcome: RentalOutcome) {
        let (outcome, class) = outcome.labels();
        let labels = RentalLabels {
            provider: provider.as_str(),
            outcome,
            class,
        };
        self.rentals.get_or_create(&labels).inc();
    }

    /// Records one provider call and how long it took. `outcome` is `ok`, a failure class label,
    /// or `cancelled` (see [`InstrumentedProvider`]).
    pub fn observe_provider_call(
        &self,
        provider: ProviderId,
        operation: Operation,
        outcome: &'static str,
        elapsed: Duration,
    ) {
        let labels = CallLabels {
            provider: provider.as_str(),
            operation: operation_label(operation),
            outcome,
        };
        self.provider_calls
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if let Some(o) = self.otlp.get() {
            o.provider_calls.record(
                elapsed.as_secs_f64(),
                &[
                    opentelemetry::KeyValue::new("provider", labels.provider),
                    opentelemetry::KeyValue::new("operation", labels.operation),
                    opentelemetry::KeyValue::new("outcome", labels.outcome),
                ],
            );
        }
    }

    /// Records one policy evaluation: counted by outcome (`ok` when `succeeded`, else `error`)
    /// and timed by policy and kind.
    pub fn observe_policy_evaluation(
        &self,
        policy: &str,
        kind: PolicyKind,
        succeeded: bool,
        elapsed: Duration,
    ) {
        let outcome = if succeeded { "ok" } else { "error" };
        let counted = PolicyOutcomeLabels {
            policy: policy.to_owned(),
            kind: kind.label(),
            outcome,
        };
        self.policy_evaluations.get_or_create(&counted).inc();
        let timed = PolicyLabels {
            policy: policy.to_owned(),
            kind: kind.label(),
        };
        self.policy_durations
            .get_or_create(&timed)
            .observe(elapsed.as_secs_f64());
        if let Some(o) = self.otlp.get() {
            o.policy_durations.record(
                elapsed.as_secs_f64(),
                &[
                    opentelemetry::KeyValue::new("policy", timed.policy),
                    opentelemetry::KeyValue::new("kind", timed.kind),
                ],
            );
        }
    }

    /// Counts one orphan the sweeper deleted on `provider` (mode `deleted`), or would have
    /// deleted in dry run (mode `dry_run`).
    pub fn record_sweeper_deletion(&self, provider: ProviderId, dry_run: bool) {
        let labels = SweepLabels {
            provider: provider.as_str(),
            mode: if dry_run { "dry_run" } else { "deleted" },
        };
        self.sweeper_deletions.get_or_create(&labels).inc();
    }

    /// Counts one reconcile error. `reason` must be a short, bounded label (an error's metric
    /// label), never a message.
    pub fn record_reconcile_error(&self, reason: &str) {
        let labels = ReasonLabels {
            reason: reason.to_owned(),
        };
        self.reconcile_errors.get_or_create(&labels).inc();
    }

    /// Records one sample in every family, so that the exposition lists each (for the tests
    /// that check the README, the dashboard and the OTLP export cover every family).
    #[doc(hidden)]
    pub fn record_in_every_family(&self) {
        self.set_burn_rate(1.0);
        self.set_budget_in_flight(1.0);
        self.set_budget_cap(Some(2.0));
        self.set_instances([(ProviderId::Fake, InstancePhase::Running)]);
        self.record_rental(
            ProviderId::Fake,
            RentalOutcome::Failed(FailureClass::RateLimited),
        );
        self.observe_provider_call(ProviderId::Fake, Operation::Create, "ok", Duration::ZERO);
        self.observe_policy_evaluation("p", PolicyKind::Pricing, true, Duration::ZERO);
        self.record_sweeper_deletion(ProviderId::Fake, true);
        self.set_pods(["Running"]);
        self.record_reconcile_error("provider");
        self.observe_time_to_running(ProviderId::Fake, Duration::from_secs(3));
        // Reading a reason's count creates its series (at 0).
        crate::telemetry::dropped(crate::telemetry::DropReason::QueueFull);
        self.observe_spend(&BindingSpend {
            binding: "ml/a",
            accrued_usd: 1.0,
            namespace: "ml",
            team: None,
            provider: "fake",
            gpu: "1x A40",
        });
    }

    /// Every family's name as a scraper sees it (a counter's with `_total`), from a registry with
    /// a sample in each: for the tests that check the README, the dashboard and the chart list
    /// exactly these.
    #[doc(hidden)]
    pub fn every_family_name() -> BTreeSet<String> {
        let m = Self::new();
        m.record_in_every_family();
        m.encode()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(name, kind)| match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_owned(),
            })
            .collect()
    }

    /// The whole registry in the OpenMetrics text format, ending with `# EOF`. Encoding into a
    /// string cannot fail with these metric types; if it ever did, the error is logged and the
    /// output lacks `# EOF`, so the scraper rejects it instead of storing partial data.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "failed to encode metrics");
        }
        out
    }
}

#[cfg(test)]
pub(super) mod tests;
