use std::time::Duration;

use neocloud_core::{FailureClass, InstancePhase, ProviderId};
use neocloud_providers::Operation;

use super::{Metrics, PolicyKind, RentalOutcome};

/// The value of the sample whose name and labels are exactly `series`, if present.
pub(super) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split(' ').next()?.parse().ok()
    })
}

#[test]
fn every_family_appears_with_its_labels_once_recorded() {
    let m = Metrics::new();
    m.set_burn_rate(3.5);
    m.set_budget_in_flight(1.25);
    m.set_budget_cap(Some(20.0));
    m.set_instances([(ProviderId::Vast, InstancePhase::Running)]);
    m.record_rental(ProviderId::Vast, RentalOutcome::Created);
    m.record_rental(ProviderId::Lambda, RentalOutcome::Adopted);
    m.record_rental(
        ProviderId::Runpod,
        RentalOutcome::Failed(FailureClass::RateLimited),
    );
    let call = Duration::from_millis(30);
    m.observe_provider_call(ProviderId::Vast, Operation::Create, "ok", call);
    let eval = Duration::from_micros(40);
    m.observe_policy_evaluation("cheap", PolicyKind::Placement, true, eval);
    m.observe_policy_evaluation("cheap", PolicyKind::Placement, false, eval);
    m.record_sweeper_deletion(ProviderId::Lambda, false);
    m.record_sweeper_deletion(ProviderId::Lambda, true);
    m.set_pods(["Running", "Running", "Pending"]);
    m.record_reconcile_error("provider");
    let text = m.encode();

    let expected = [
        ("neocloud_burn_rate_usd_per_hour", 3.5),
        ("neocloud_budget_in_flight_usd_per_hour", 1.25),
        ("neocloud_budget_cap_usd_per_hour", 20.0),
        (
            r#"neocloud_instances{provider="vast",phase="running"}"#,
            1.0,
        ),
        (
            r#"neocloud_rentals_total{provider="vast",outcome="created",class="none"}"#,
            1.0,
        ),
        (
            r#"neocloud_rentals_total{provider="lambda",outcome="adopted",class="none"}"#,
            1.0,
        ),
        (
            r#"neocloud_rentals_total{provider="runpod",outcome="failed",class="rate-limited"}"#,
            1.0,
        ),
        (
            r#"neocloud_provider_call_duration_seconds_count{provider="vast",operation="create",outcome="ok"}"#,
            1.0,
        ),
        (
            r#"neocloud_provider_call_duration_seconds_bucket{le="0.05",provider="vast",operation="create",outcome="ok"}"#,
            1.0,
        ),
        (
            r#"neocloud_provider_call_duration_seconds_bucket{le="0.025",provider="vast",operation="create",outcome="ok"}"#,
            0.0,
        ),
        (
            r#"neocloud_policy_evaluations_total{policy="cheap",kind="placement",outcome="ok"}"#,
            1.0,
        ),
        (
            r#"neocloud_policy_evaluations_total{policy="cheap",kind="placement",outcome="error"}"#,
            1.0,
        ),
        (
            r#"neocloud_policy_evaluation_duration_seconds_count{policy="cheap",kind="placement"}"#,
            2.0,
        ),
        (
            r#"neocloud_policy_evaluation_duration_seconds_bucket{le="0.00005",policy="cheap",kind="placement"}"#,
            2.0,
        ),
        (
            r#"neocloud_sweeper_deletions_total{provider="lambda",mode="deleted"}"#,
            1.0,
        ),
        (
            r#"neocloud_sweeper_deletions_total{provider="lambda",mode="dry_run"}"#,
            1.0,
        ),
        (r#"neocloud_pods{phase="Running"}"#, 2.0),
        (r#"neocloud_pods{phase="Pending"}"#, 1.0),
        (r#"neocloud_reconcile_errors_total{reason="provider"}"#, 1.0),
    ];
    for (series, value) in expected {
        assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn families_declare_type_and_unit_once_they_hold_a_series() {
    let m = Metrics::new();
    let empty = m.encode();
    assert!(!empty.contains("neocloud_rentals"), "{empty}");

    m.record_rental(ProviderId::Fake, RentalOutcome::Created);
    m.observe_provider_call(ProviderId::Fake, Operation::Get, "ok", Duration::ZERO);
    m.observe_policy_evaluation("p", PolicyKind::Filter, true, Duration::ZERO);
    let text = m.encode();
    for name in [
        "neocloud_provider_call_duration_seconds",
        "neocloud_policy_evaluation_duration_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} histogram\n")),
            "{text}"
        );
        assert!(text.contains(&format!("# UNIT {name} seconds\n")), "{text}");
    }
    assert!(text.contains("# TYPE neocloud_rentals counter\n"), "{text}");
}

#[test]
fn instance_phases_that_dropped_to_zero_read_zero() {
    let m = Metrics::new();
    m.set_instances([
        (ProviderId::Vast, InstancePhase::Starting),
        (ProviderId::Vast, InstancePhase::Running),
        (ProviderId::Vast, InstancePhase::Running),
        (ProviderId::Runpod, InstancePhase::Pending),
    ]);
    m.set_instances([(ProviderId::Vast, InstancePhase::Running)]);
    let text = m.encode();

    let running = r#"neocloud_instances{provider="vast",phase="running"}"#;
    let starting = r#"neocloud_instances{provider="vast",phase="starting"}"#;
    let pending = r#"neocloud_instances{provider="runpod",phase="pending"}"#;
    assert_eq!(sample(&text, running), Some(1.0), "{text}");
    assert_eq!(sample(&text, starting), Some(0.0), "{text}");
    assert_eq!(sample(&text, pending), Some(0.0), "{text}");
}

#[test]
fn pod_phases_that_dropped_to_zero_read_zero() {
    let m = Metrics::new();
    m.set_pods(["Pending", "Running"]);
    m.set_pods(Vec::<String>::new());
    let text = m.encode();
    assert_eq!(
        sample(&text, r#"neocloud_pods{phase="Pending"}"#),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, r#"neocloud_pods{phase="Running"}"#),
        Some(0.0)
    );
}

#[test]
fn budget_cap_is_absent_without_a_cap() {
    let m = Metrics::new();
    let cap = "neocloud_budget_cap_usd_per_hour";
    assert_eq!(sample(&m.encode(), cap), None);
    m.set_budget_cap(Some(12.0));
    assert_eq!(sample(&m.encode(), cap), Some(12.0));
    m.set_budget_cap(None);
    let text = m.encode();
    assert!(!text.contains(cap), "{text}");
}

#[test]
fn rental_counters_accumulate_per_label_set() {
    let m = Metrics::new();
    for _ in 0..3 {
        m.record_rental(
            ProviderId::Vast,
            RentalOutcome::Failed(FailureClass::Capacity),
        );
    }
    m.record_rental(ProviderId::Vast, RentalOutcome::Failed(FailureClass::Quota));
    let text = m.encode();
    let capacity = r#"neocloud_rentals_total{provider="vast",outcome="failed",class="capacity"}"#;
    let quota = r#"neocloud_rentals_total{provider="vast",outcome="failed",class="quota"}"#;
    assert_eq!(sample(&text, capacity), Some(3.0), "{text}");
    assert_eq!(sample(&text, quota), Some(1.0), "{text}");
}

#[test]
fn time_to_running_is_a_histogram_by_provider_in_seconds() {
    let m = Metrics::new();
    m.observe_time_to_running(ProviderId::Runpod, Duration::from_secs(42));
    m.observe_time_to_running(ProviderId::Vast, Duration::from_secs(400));
    let text = m.encode();
    let name = "neocloud_pod_time_to_running_seconds";
    assert!(text.contains(&format!("# UNIT {name} seconds\n")), "{text}");
    for (series, value) in [
        (
            format!("{name}_bucket{{le=\"30.0\",provider=\"runpod\"}}"),
            0.0,
        ),
        (
            format!("{name}_bucket{{le=\"60.0\",provider=\"runpod\"}}"),
            1.0,
        ),
        (format!("{name}_count{{provider=\"runpod\"}}"), 1.0),
        (format!("{name}_sum{{provider=\"vast\"}}"), 400.0),
        (
            format!("{name}_bucket{{le=\"300.0\",provider=\"vast\"}}"),
            0.0,
        ),
    ] {
        assert_eq!(sample(&text, &series), Some(value), "{series} in:\n{text}");
    }
}
