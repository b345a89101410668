//! `neocloud-node policy test`, `policy eval --attempts` and `policy bench` of a fallback policy
//! through the real binary: every sample policy (C, JavaScript and Python) passes the fixtures it
//! ships (`policies/*/fixtures.yaml`), a case whose decision differs
//! fails the command with the case, the expectation and the decision, and a malformed fixture is
//! refused naming the field.
//!
//! Needs the guests built by `make policies`.

use std::path::{Path, PathBuf};
use std::process::Output;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn guest(name: &str) -> PathBuf {
    let path = repo().join(format!("policies/build/{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run `make policies`",
        path.display()
    );
    path
}

fn node(args: &[&str], paths: &[&Path]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .arg("policy")
        .args(args)
        .args(paths)
        .env_remove("RUST_LOG")
        // What a decision is checked for here is its answer, not its speed: beside other test
        // binaries on the two cores, a Python guest's decision went past the node's 100 ms
        // deadline (instantiation included). `--deadline-ms` still wins over it.
        .env("NEOCLOUD_POLICY_DEADLINE_MS", "5000")
        // The compiled components of every test binary's run, not the user's cache: a debug build
        // compiles the JavaScript and Python guests in about 15 s each.
        .env("NEOCLOUD_WASM_CACHE_DIR", test_cache())
        .output()
        .expect("run neocloud-node")
}

/// The compiled-component cache the node's integration tests share (`support::wasm_cache_dir`;
/// this binary does not include `support`).
fn test_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache")
}

fn text(out: &Output) -> (String, String) {
    let o = String::from_utf8_lossy(&out.stdout).into_owned();
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    (o, e)
}

#[test]
fn every_sample_policy_passes_the_fixtures_it_ships() {
    let cases = [
        ("fallback-js", "fallback-js", 12),
        ("placement-c", "placement-c", 4),
        // The JavaScript placement guest implements the C one's rules: the same fixtures.
        ("placement-js", "placement-c", 4),
        ("pricing-c", "pricing-c", 2),
        // The Python fallback guest implements the JavaScript one's rules.
        ("fallback-py", "fallback-js", 12),
    ];
    for (guest_name, fixtures, count) in cases {
        let fixtures = repo().join(format!("policies/{fixtures}/fixtures.yaml"));
        let out = node(&["test"], &[&guest(guest_name), &fixtures]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{guest_name}: {stderr}");
        assert_eq!(stdout.matches("PASS  ").count(), count, "{stdout}");
        assert!(
            stdout.ends_with(&format!("{count} passed, 0 failed\n")),
            "{stdout}"
        );
    }
}

#[test]
fn a_case_whose_decision_differs_fails_the_command_showing_both() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = dir.path().join("wrong.yaml");
    let yaml = "tests:\n\
        - name: right\n  fallback: {attempts: [{provider: vast, failure: auth}]}\n  expect: {skip-provider: vast}\n\
        - name: wrong on purpose\n  fallback: {attempts: [{provider: vast, failure: auth}]}\n  expect: next-offer\n\
        - name: wrong role\n  offers: []\n  expect: {order: []}\n";
    std::fs::write(&fixtures, yaml).unwrap();
    let out = node(&["test"], &[&guest("fallback-js"), &fixtures]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    for part in [
        "PASS  right",
        "FAIL  wrong on purpose",
        "expected \"next-offer\"",
        "got      {\"decision\":{\"skip-provider\":\"vast\"}}",
        "FAIL  wrong role",
        "does not implement the placement role",
        "1 passed, 2 failed",
    ] {
        assert!(stderr.contains(part), "{part}:\n{stderr}");
    }
}

#[test]
fn a_malformed_fixture_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "tests:\n- name: x\n  fallback: {attempts: [{provider: vast, failure: on-fire}]}\n  expect: next-offer\n",
            "tests[0].fallback.attempts[0].failure: unknown variant `on-fire`",
        ),
        (
            "tests:\n- name: x\n  offers: []\n  expect: {first: 1}\n",
            "tests[0].expect: unknown variant `first`",
        ),
        ("tests: []\n", "tests: [] has no case"),
    ];
    for (i, (yaml, want)) in cases.into_iter().enumerate() {
        let fixtures = dir.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&fixtures, yaml).unwrap();
        let out = node(&["test"], &[&guest("fallback-js"), &fixtures]);
        let (_, stderr) = text(&out);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(want), "{want}:\n{stderr}");
    }
}

#[test]
fn bench_measures_a_fallback_policy_when_it_has_no_placement() {
    // The bench measures under the deadline `node` gives it (5 s, from the environment).
    let out = node(&["bench", "--iterations", "20"], &[&guest("fallback-py")]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let zero = node(&["bench", "--deadline-ms", "0"], &[&guest("fallback-py")]);
    let (_, refused) = text(&zero);
    assert!(!zero.status.success());
    assert!(
        refused.contains("'0'") && refused.contains("--deadline-ms"),
        "{refused}"
    );
    // The same bound holds for the environment's value.
    let zero = std::process::Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .args(["policy", "bench"])
        .arg(guest("fallback-py"))
        .env("NEOCLOUD_POLICY_DEADLINE_MS", "0")
        .output()
        .expect("run neocloud-node");
    let (_, refused) = text(&zero);
    assert!(!zero.status.success());
    assert!(
        refused.contains("'0'") && refused.contains("--deadline-ms"),
        "{refused}"
    );
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["role"], "fallback");
    assert_eq!(json["iterations"], 20);
    assert!(
        json["decisions_per_second"].as_f64().unwrap() > 0.0,
        "{json}"
    );
    let out = node(&["bench", "--iterations", "1"], &[&guest("pricing-c")]);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("policy bench measures placement, else fallback"),
        "{stderr}"
    );
}

#[test]
fn eval_with_attempts_prints_the_fallback_decision() {
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("workload.json");
    let attempts = dir.path().join("attempts.json");
    std::fs::write(&workload, "{}").unwrap();
    let body = r#"{"attempts": [{"provider": "lambda", "offer_id": "gpu_1x_h100",
        "failure": "rate-limited"}, {"provider": "lambda", "offer_id": "gpu_1x_h100",
        "failure": "rate-limited"}], "remaining_offers": 1}"#;
    std::fs::write(&attempts, body).unwrap();
    let (w, a) = (workload.to_str().unwrap(), attempts.to_str().unwrap());
    let out = node(
        &["eval", "--workload", w, "--attempts", a],
        &[&guest("fallback-js")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["decision"], serde_json::json!({"retry-same": 2000}));
    let out = node(
        &["eval", "--workload", w, "--attempts", a],
        &[&guest("pricing-c")],
    );
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("does not implement the fallback role"),
        "{stderr}"
    );
}
