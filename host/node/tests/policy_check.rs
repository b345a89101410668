//! `neocloud-node policy check` through the real binary: a component that loads prints its
//! description and exits 0; every failure (a missing file, a directory, an empty file, a file
//! that is not Wasm, a core Wasm module, a broken component, a component of another world, a
//! component without the role asked for) exits non-zero with one clear line. A second check of
//! the same component reads it from the disk cache instead of compiling it. And `policy eval`
//! writes the guest's log lines to the binary's log at the guest's level, without colour codes
//! when stderr is not a terminal.
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

/// `policy check FILE EXTRA...`, with a cache shared by the tests' runs (not the user's).
fn check(file: &Path, extra: &[&str]) -> Output {
    let cache = std::env::temp_dir().join("neocloud-node-policy-check-test-cache");
    check_with(
        file,
        extra,
        &[("NEOCLOUD_WASM_CACHE_DIR", cache.as_os_str())],
    )
}

fn check_with(file: &Path, extra: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_neocloud-node"));
    command
        .args(["policy", "check"])
        .arg(file)
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("NEOCLOUD_WASM_CACHE_DIR")
        .env_remove("NEOCLOUD_WASM_NO_CACHE");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run neocloud-node")
}

/// The compiled entries in a cache directory (wasmtime's `modules/<version>/<hash>`).
fn cache_entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(versions) = std::fs::read_dir(dir.join("modules")) else {
        return vec![];
    };
    let mut found = Vec::new();
    for version in versions {
        for entry in std::fs::read_dir(version.unwrap().path()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none() {
                found.push(path);
            }
        }
    }
    found
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
fn a_file_that_is_not_wasm_fails_the_check_on_one_line_with_its_first_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 3] = [
        (
            "binary.wasm",
            b"\x7fELF\x02\x01\x01\0",
            "it begins with 7f454c46",
        ),
        ("empty.wasm", b"", "it begins with nothing"),
        // A CEL expression handed to the Wasm check, lines and all.
        (
            "rank.cel",
            b"offers.filter(o,\n  o.price < 2.0)\n  .map(o, o.id)\n",
            "it begins with 6f666665",
        ),
    ];
    for (name, bytes, says) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, bytes).unwrap();
        assert_refused(&check(&file, &[]), &["is not Wasm", says, name]);
    }
}

#[test]
fn a_directory_fails_the_check_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    assert_refused(&check(dir.path(), &[]), &["failed to read policy file"]);
}

#[test]
fn a_broken_component_fails_the_check_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.wasm");
    // A component's header, then a section that is not one.
    let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
    bytes.extend_from_slice(&[0x42; 64]);
    std::fs::write(&broken, bytes).unwrap();
    assert_refused(
        &check(&broken, &[]),
        &["failed to compile policy", "broken.wasm"],
    );
    // And a real component cut short.
    let cut = dir.path().join("cut.wasm");
    let whole = std::fs::read(guest("placement-c")).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    assert_refused(&check(&cut, &[]), &["failed to compile policy", "cut.wasm"]);
}

#[test]
fn a_second_check_of_the_same_component_is_read_from_the_disk_cache() {
    let cache = tempfile::tempdir().unwrap();
    let env = [
        ("NEOCLOUD_WASM_CACHE_DIR", cache.path().as_os_str()),
        ("RUST_LOG", std::ffi::OsStr::new("neocloud_policy=debug")),
    ];
    let first = check_with(&guest("placement-c"), &[], &env);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    assert!(stderr.contains("wasm component compiled"), "{stderr}");
    assert_eq!(cache_entries(cache.path()).len(), 1, "one compiled entry");
    let second = check_with(&guest("placement-c"), &[], &env);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert!(
        stderr.contains("wasm component read from the disk cache"),
        "{stderr}"
    );
    assert!(!stderr.contains("wasm component compiled"), "{stderr}");
    assert_eq!(first.stdout, second.stdout, "the same description");
}

#[test]
fn the_default_cache_is_under_xdg_cache_home_and_no_cache_keeps_nothing() {
    let home = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", home.path().as_os_str())];
    let out = check_with(&guest("placement-c"), &[], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = home.path().join("neocloud-node/wasm");
    assert_eq!(cache_entries(&dir).len(), 1, "{}", dir.display());

    let other = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", other.path().as_os_str())];
    let out = check_with(&guest("placement-c"), &["--no-cache"], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = [
        ("XDG_CACHE_HOME", other.path().as_os_str()),
        ("NEOCLOUD_WASM_NO_CACHE", std::ffi::OsStr::new("true")),
    ];
    let out = check_with(&guest("placement-c"), &[], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(other.path()).unwrap().collect();
    assert!(left.is_empty(), "--no-cache wrote {left:?}");
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
