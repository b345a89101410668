//! `failurePolicy` (Fail, Ignore) and `mode` (Enforce, Audit) behave as documented in
//! `neocloud_policy::wasm::Verdict`, and guest errors arrive as values.

mod wasm_support;

use neocloud_policy::wasm::bindings::{ErrorCode, PlacementDecision};
use neocloud_policy::wasm::{FailurePolicy, Mode, PolicySettings, Role, Verdict, WasmError};
use wasm_support::{
    engine, fallback_input, load, placement_input, pricing_input, settings, with_log,
};

fn with(failure_policy: FailurePolicy, mode: Mode) -> PolicySettings {
    PolicySettings {
        failure_policy,
        mode,
        ..settings("modes")
    }
}

#[test]
fn fail_turns_a_trap_into_a_failed_decision() {
    let policy = load(
        &engine(),
        "hostile-trap",
        with(FailurePolicy::Fail, Mode::Enforce),
    );
    let verdict = policy.place(&placement_input(5)).verdict;
    assert!(
        matches!(verdict, Verdict::Failed(WasmError::Trap { .. })),
        "{verdict:?}"
    );
    assert!(!verdict.uses_host_default());
}

#[test]
fn ignore_turns_a_trap_into_the_host_default_and_keeps_the_error() {
    let policy = load(
        &engine(),
        "hostile-trap",
        with(FailurePolicy::Ignore, Mode::Enforce),
    );
    let verdict = policy.place(&placement_input(5)).verdict;
    assert!(
        matches!(verdict, Verdict::Ignored(WasmError::Trap { .. })),
        "{verdict:?}"
    );
    assert!(verdict.uses_host_default() && verdict.applied().is_none());
}

#[test]
fn audit_reports_a_good_answer_without_applying_it() {
    let policy = load(
        &engine(),
        "placement-c",
        with(FailurePolicy::Fail, Mode::Audit),
    );
    let verdict = policy.place(&placement_input(5)).verdict;
    let Verdict::Audited(Ok(PlacementDecision::Scores(scores))) = &verdict else {
        panic!("expected audited scores, got {verdict:?}")
    };
    assert_eq!(scores.len(), 5);
    assert!(verdict.applied().is_none() && verdict.uses_host_default());
}

#[test]
fn audit_reports_a_failure_even_under_fail() {
    let policy = load(
        &engine(),
        "hostile-loop",
        with(FailurePolicy::Fail, Mode::Audit),
    );
    let verdict = policy.place(&placement_input(5)).verdict;
    assert!(
        matches!(verdict, Verdict::Audited(Err(WasmError::Trap { .. }))),
        "{verdict:?}"
    );
    assert!(verdict.uses_host_default());
}

#[test]
fn enforce_applies_a_good_answer() {
    let policy = load(
        &engine(),
        "placement-c",
        with(FailurePolicy::Ignore, Mode::Enforce),
    );
    let evaluation = policy.place(&placement_input(5));
    assert!(evaluation.verdict.applied().is_some(), "{evaluation:?}");
}

#[test]
fn guest_error_is_a_value_with_its_code_and_message() {
    let policy = load(&engine(), "placement-c", settings("c"));
    let verdict = policy.place(&placement_input(0)).verdict;
    let Some(WasmError::Guest { code, message, .. }) = verdict.error() else {
        panic!("expected a guest error, got {verdict:?}")
    };
    assert_eq!(*code, ErrorCode::InvalidInput);
    assert!(message.contains("no offers"), "{message}");
}

#[test]
fn javascript_guest_error_is_a_value() {
    let policy = load(&engine(), "fallback-js", with_log(settings("js")));
    let verdict = policy.next(&fallback_input(vec![], 3)).verdict;
    let Some(WasmError::Guest { code, message, .. }) = verdict.error() else {
        panic!("expected a guest error, got {verdict:?}")
    };
    assert_eq!(*code, ErrorCode::InvalidInput);
    assert!(message.contains("no attempts"), "{message}");
}

#[test]
fn calling_a_role_the_policy_does_not_export_fails_under_fail() {
    let policy = load(&engine(), "placement-c", settings("c"));
    let verdict = policy.price(&pricing_input(1.0, false)).verdict;
    let Verdict::Failed(WasmError::NotImplemented { role, .. }) = verdict else {
        panic!("expected not implemented, got {verdict:?}")
    };
    assert_eq!(role, Role::Pricing);
}
