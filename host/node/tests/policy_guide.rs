//! docs/POLICIES.md, run as written: every `sh` block of the guide, in order, in one bash with
//! `set -euo pipefail`, from the repository's root, against a real API server where a policy
//! registry (the node's, in this process) loads what the guide applies. A command of the guide
//! that fails, a fixture its policies do not pass, or a policy that does not load fails this test.
//!
//! Needs the guest toolchain (`make policies` installs it), the binary (`cargo test` builds it)
//! and the OCI registry (`make testenv` builds it; the test starts it for the guide's push and
//! sign steps).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use neocloud_node::crd;
use neocloud_node::metrics::Metrics;
use neocloud_node::policies::PolicyRegistry;
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_policy::wasm::{EngineConfig, WasmEngine};
use neocloud_testenv::{Registry, TestContext};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The guide's `sh` blocks, in order.
fn commands(guide: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in guide.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(block), "```") => {
                blocks.push(block.join("\n"));
                current = None;
            }
            (Some(block), _) => block.push(line),
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn the_guide_has_runnable_blocks_for_every_language_and_the_cluster() {
    let guide = std::fs::read_to_string(repo().join("docs/POLICIES.md")).unwrap();
    let blocks = commands(&guide).join("\n");
    for part in [
        "clang ",
        "componentize.mjs",
        "$COMPONENTIZE_PY",
        "policy test",
        "kubectl apply",
        "policy push",
        "policy sign",
        "requireSignature",
    ] {
        assert!(blocks.contains(part), "{part}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_policy_guide_runs_as_written() {
    let ctx = TestContext::new("guide").await;
    crd::install(&ctx.client, "guide-test", Duration::from_secs(30))
        .await
        .unwrap();
    let registry = PolicyRegistry::new(
        ctx.client.clone(),
        Arc::new(CelEngine::new(CelLimits::default())),
        WasmEngine::new(EngineConfig::default()).unwrap(),
        PathBuf::from("/etc/neocloud-node/policies"),
        Arc::new(Metrics::new()),
    );
    let policies = tokio::spawn(Arc::clone(&registry).run());
    let oci = Registry::start()
        .await
        .expect("OCI registry (make testenv)");
    let guide = std::fs::read_to_string(repo().join("docs/POLICIES.md")).unwrap();
    let script = format!("set -euo pipefail\n{}\n", commands(&guide).join("\n"));
    let kubectl = ctx.control_plane.kubectl();
    let kubectl_dir = Path::new(kubectl.get_program())
        .parent()
        .unwrap()
        .to_owned();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}:{}",
        bin_dir.display(),
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let work = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(repo())
        .env("PATH", path)
        .env("KUBECONFIG", ctx.control_plane.admin_kubeconfig())
        .env("WORK", work.path())
        .env("REGISTRY", oci.host())
        .env("REGISTRY_CA", oci.ca_file())
        .env("NEOCLOUD_REGISTRY_USERNAME", oci.username())
        .env("NEOCLOUD_REGISTRY_PASSWORD", oci.password())
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    policies.abort();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the guide failed:\n{stdout}\n{stderr}"
    );
    // Three languages pass the same five fixtures; the policy loaded from the ConfigMap.
    assert_eq!(stdout.matches("5 passed, 0 failed").count(), 3, "{stdout}");
    assert!(stdout.contains("\"skip-provider\": \"vast\""), "{stdout}");
    assert!(stdout.contains("Wasm component (fallback)"), "{stdout}");
    // The signed artifact from the registry loaded too.
    assert!(
        stdout.contains(&format!("{}/team/fallback@sha256:", oci.host())),
        "{stdout}"
    );
    assert!(stdout.contains("\"verified\": true"), "{stdout}");
    assert_eq!(
        stdout.matches("Wasm component (fallback)").count(),
        2,
        "{stdout}"
    );
    for name in ["fallback-c.wasm", "fallback-js.wasm", "fallback-py.wasm"] {
        assert!(work.path().join(name).is_file(), "{name}");
    }
}
