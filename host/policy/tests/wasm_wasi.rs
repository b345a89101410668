//! A guest that imports WASI 0.2 (componentize-js with stdio, clocks and random enabled) loads
//! only when granted the deny-all WASI context, and what it prints is captured into the bounded
//! decision log instead of reaching the node's stdout.

mod wasm_support;

use neocloud_policy::wasm::bindings::{FailureClass, FallbackAction};
use neocloud_policy::wasm::{Capabilities, PolicySource, WasmError};
use wasm_support::{attempt, engine, fallback_input, guest, load, settings};

fn granted(log: bool, deny_all_wasi: bool) -> neocloud_policy::wasm::PolicySettings {
    let mut s = settings("wasi-js");
    s.capabilities = Capabilities { log, deny_all_wasi };
    s
}

#[test]
fn wasi_guest_without_the_grant_is_refused_at_load_naming_the_wasi_import() {
    let error = engine()
        .load(
            &PolicySource::file(guest("fallback-js-wasi")),
            granted(true, false),
        )
        .unwrap_err();
    let WasmError::Link { message, .. } = &error else {
        panic!("expected a link error, got {error}")
    };
    assert!(message.contains("wasi:"), "{message}");
}

#[test]
fn wasi_guest_with_the_deny_all_context_decides_and_its_stdout_lands_in_the_log() {
    let policy = load(&engine(), "fallback-js-wasi", granted(true, true));
    assert!(
        policy
            .info()
            .imports
            .iter()
            .any(|i| i.starts_with("wasi:cli/stdout")),
        "{:?}",
        policy.info().imports
    );
    let input = fallback_input(vec![attempt(FailureClass::Capacity, "o-1")], 2);
    let evaluation = policy.next(&input);
    assert_eq!(
        evaluation.verdict.applied(),
        Some(&FallbackAction::NextOffer)
    );
    let printed: Vec<&str> = evaluation
        .log
        .lines
        .iter()
        .map(|l| l.message.as_str())
        .collect();
    assert!(
        printed
            .iter()
            .any(|m| m.contains("fallback after 1 attempt(s)")),
        "{printed:?}"
    );
}
