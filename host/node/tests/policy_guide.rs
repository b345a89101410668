//! docs/POLICIES.md, run as written: every `sh` block of the guide, in order, in one bash with
//! `set -euo pipefail`, from the repository's root, against a real API server where a policy
//! registry (the node's, in this process) loads what the guide applies. A command of the guide
//! that fails, a fixture its policies do not pass, or a policy that does not load fails this test.
//!
//! The registry steps run too, against the registry `make registry` starts for a reader (started
//! here in-process): the C component pushed, signed and loaded, and the Python one, too large for
//! a ConfigMap, pushed and loaded. The node here shares the CLI's compile cache, so it compiles
//! nothing the guide's commands compiled.
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
        "policy push \"$WORK/fallback-py.wasm\"",
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
    // The guide's CLI runs and this node share one compile cache (as a CLI and a node on one
    // machine may), kept across test runs so that only the first compiles the Python and
    // JavaScript components.
    let wasm_cache = std::env::temp_dir().join("neocloud-node-guide-test-cache");
    let wasm = WasmEngine::new(EngineConfig {
        cache_dir: Some(wasm_cache.clone()),
        ..EngineConfig::default()
    })
    .unwrap();
    let registry = PolicyRegistry::new(
        ctx.client.clone(),
        Arc::new(CelEngine::new(CelLimits::default())),
        wasm.clone(),
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
        .env("NEOCLOUD_BIN_DIR", &bin_dir)
        // Not XDG_CACHE_HOME: the guest toolchain's cache is found through it.
        .env("NEOCLOUD_WASM_CACHE_DIR", &wasm_cache)
        // The guide's `policy test` and `eval` check answers, not speed: beside other test
        // binaries on two cores, a Python guest's decision can pass the node's 100 ms.
        .env("NEOCLOUD_POLICY_DEADLINE_MS", "5000")
        .env_remove("NEOCLOUD_WASM_NO_CACHE")
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
    // And the Python component, too large for a ConfigMap, from the registry.
    assert!(
        stdout.contains(&format!("{}/team/fallback-py@sha256:", oci.host())),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("Wasm component (fallback)").count(),
        3,
        "{stdout}"
    );
    // The node compiled none of them: the guide's `policy check` and `policy test` had.
    let stats = wasm.stats();
    assert_eq!(stats.compiled, 0, "{stats:?}");
    for name in ["fallback-c.wasm", "fallback-js.wasm", "fallback-py.wasm"] {
        assert!(work.path().join(name).is_file(), "{name}");
    }
}
