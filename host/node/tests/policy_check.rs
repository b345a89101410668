//! `neocloud-node policy check` through the real binary: a component that loads prints its
//! description and exits 0; every failure (a missing file, a core Wasm module, a component of
//! another world, a component without the role asked for) exits non-zero with one clear line.
//! And `policy eval` writes the guest's log lines to the binary's log at the guest's level,
//! without colour codes when stderr is not a terminal.
//!
//! Needs the guests built by `make policies` (or `NEOCLOUD_POLICIES_DIR`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn guest(name: &str) -> PathBuf {
    let dir = std::env::var_os("NEOCLOUD_POLICIES_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../policies/build"),
        PathBuf::from,
    );
    let path = dir.join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run `make policies`",
        path.display()
    );
    path
}

fn check(file: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .args(["policy", "check"])
        .arg(file)
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .expect("run neocloud-node")
}

/// Asserts a failed check: non-zero, nothing on stdout, one line on stderr holding `parts`.
fn assert_refused(out: &Output, parts: &[&str]) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit 0 for a failed check: {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one message expected:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for part in parts {
        assert!(lines[0].contains(part), "{part}: {stderr}");
    }
}

#[test]
fn a_placement_component_passes_the_check_with_its_role() {
    let out = check(&guest("placement-c"), &["--role", "placement"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["roles"], serde_json::json!(["placement"]));
}

#[test]
fn a_missing_file_fails_the_check_with_the_os_error_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.wasm");
    let out = check(&missing, &[]);
    assert_refused(&out, &["failed to read policy file", "nope.wasm"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
}

#[test]
fn a_core_wasm_module_fails_the_check_as_not_a_component() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("core.wasm");
    std::fs::write(&module, b"\0asm\x01\0\0\0").unwrap();
    let out = check(&module, &[]);
    assert_refused(
        &out,
        &[
            "core Wasm module, not a component",
            "wasm-tools component new",
        ],
    );
}

#[test]
fn a_component_of_another_world_fails_the_check() {
    let out = check(&guest("hostile-wrong-world"), &[]);
    assert_refused(
        &out,
        &["exports none of the neocloud:policy@0.1.0 roles", "greeter"],
    );
}

#[test]
fn a_component_without_the_role_asked_for_fails_the_check() {
    let out = check(&guest("pricing-c"), &["--role", "placement"]);
    assert_refused(
        &out,
        &[
            "does not implement the placement role",
            "it implements pricing",
        ],
    );
}

#[test]
fn guest_log_lines_reach_the_log_at_their_level_without_colour_codes_in_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let (workload, offers) = (dir.path().join("w.json"), dir.path().join("o.json"));
    std::fs::write(&workload, "{}").unwrap();
    let offer = serde_json::json!([{"provider": "vast", "gpu_model": "RTX 4090", "gpu_count": 1,
        "gpu_memory_gib": 24, "price_per_hour": 0.4, "spot": true, "region": "us-east-1"}]);
    std::fs::write(&offers, offer.to_string()).unwrap();
    let pricing = guest("pricing-c");
    let out = Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .args(["policy", "eval", "--workload"])
        .arg(&workload)
        .arg("--offers")
        .arg(&offers)
        .arg(&pricing)
        .env("RUST_LOG", "neocloud_policy::guest=debug")
        .env_remove("NO_COLOR")
        .output()
        .expect("run neocloud-node");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "colour codes in a pipe: {stderr:?}"
    );
    let line = stderr
        .lines()
        .find(|l| l.contains("neocloud_policy::guest"))
        .unwrap_or_else(|| panic!("no guest log line: {stderr}"));
    assert!(line.contains("DEBUG"), "the guest logs at debug: {line}");
    assert!(
        line.contains(&format!("policy={}", pricing.display())),
        "{line}"
    );
    assert!(line.contains("role=pricing"), "{line}");
}
