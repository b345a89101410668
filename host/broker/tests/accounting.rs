//! Budget reservations (RAII: committed or released) and cost accounting.

use chrono::{Duration, TimeZone, Utc};
use neocloud_broker::{BudgetGuard, CostLedger};

#[test]
fn a_dropped_reservation_releases_its_budget() {
    let guard = BudgetGuard::new(Some(2.0));
    let r = guard.reserve(1.5).unwrap();
    assert!(
        guard.reserve(1.0).is_err(),
        "in-flight budget counts against the cap"
    );
    drop(r);
    assert_eq!(guard.in_flight_usd_per_hour(), 0.0);
    assert!(guard.reserve(1.0).is_ok());
}

#[test]
fn a_committed_reservation_becomes_the_bindings_burn_until_released() {
    let guard = BudgetGuard::new(Some(2.0));
    guard.reserve(1.5).unwrap().commit("ml/train", 1.2);
    assert_eq!(
        (guard.running_usd_per_hour(), guard.in_flight_usd_per_hour()),
        (1.2, 0.0)
    );
    let err = guard.reserve(1.0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cluster budget of $2.0000/h would be exceeded: $1.2000/h running, $0.0000/h in flight, $1.0000/h requested"
    );
    guard.release("ml/train");
    assert_eq!(guard.running_usd_per_hour(), 0.0);
}

#[test]
fn a_commit_never_records_more_than_was_reserved() {
    let guard = BudgetGuard::new(Some(1.0));
    guard.reserve(0.5).unwrap().commit("b", 0.9);
    assert_eq!(guard.running_usd_per_hour(), 0.5);
}

#[test]
fn an_uncapped_guard_tracks_without_refusing() {
    let guard = BudgetGuard::new(None);
    guard.reserve(1000.0).unwrap().commit("b", 1000.0);
    guard.record_existing("c", 5.0);
    assert_eq!(guard.running_usd_per_hour(), 1005.0);
}

#[test]
fn cost_accrues_per_binding_while_running_and_stops_when_deleted() {
    let t0 = Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, 0).unwrap();
    let ledger = CostLedger::new();
    ledger.start("ml/a", 2.0, t0);
    ledger.start("ml/b", 1.0, t0 + Duration::minutes(30));
    assert_eq!(ledger.burn_rate_usd_per_hour(), 3.0);
    assert_eq!(
        ledger.accrued_usd("ml/a", t0 + Duration::hours(1)),
        Some(2.0)
    );
    assert_eq!(
        ledger.accrued_usd("ml/b", t0 + Duration::hours(1)),
        Some(0.5)
    );
    ledger.stop("ml/a", t0 + Duration::minutes(90));
    assert_eq!(ledger.burn_rate_usd_per_hour(), 1.0);
    assert_eq!(
        ledger.accrued_usd("ml/a", t0 + Duration::hours(5)),
        Some(3.0)
    );
    ledger.start("ml/b", 4.0, t0 + Duration::minutes(90));
    let snapshot = ledger.snapshot(t0 + Duration::minutes(120));
    assert_eq!(snapshot[1].accrued_usd, 1.0 + 2.0);
    assert_eq!(snapshot[1].usd_per_hour, 4.0);
    assert_eq!(snapshot[0].usd_per_hour, 0.0);
    ledger.forget("ml/a");
    assert_eq!(ledger.accrued_usd("ml/a", t0), None);
}
