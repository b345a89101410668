//! The workspace's layout, checked: which crate may not depend on what (the "Layout" of
//! docs/DEVELOPMENT.md says why). Reads `cargo metadata` and fails on a forbidden edge among normal dependencies at
//! any depth, naming the path that brings it in. Dev-dependencies are free: tests may use
//! anything.
//!
//! Not a check of what the code calls: a crate that links a dependency without using it still
//! fails, which is the point (it would be downloaded and built anyway).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::Command;

use serde_json::Value;

/// What each crate may not depend on, through normal dependencies at any depth. Add a line when
/// a crate is added; every name must be a package of the workspace's graph (a typo would make a
/// rule that cannot fail, so it fails instead).
///
/// Not here on purpose: `neocloud-core -> k8s-openapi` (core translates Pods: Kubernetes types,
/// no IO) and `neocloud-broker -> wasmtime` (the broker runs policies through `neocloud-policy`,
/// which owns wasmtime).
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "neocloud-runner",
        &[
            "wasmtime",
            "kube",
            "k8s-openapi",
            "neocloud-cloudsim",
            "neocloud-policy",
            "neocloud-broker",
            "neocloud-providers",
            "neocloud-node",
        ],
    ),
    (
        "neocloud-remote",
        &[
            "wasmtime",
            "neocloud-policy",
            "neocloud-broker",
            "neocloud-providers",
            "neocloud-cloudsim",
            "neocloud-node",
            "neocloud-kubelet",
        ],
    ),
    // The kubelet API and the relays: on top of the callback (neocloud-remote), under the node.
    (
        "neocloud-kubelet",
        &[
            "wasmtime",
            "neocloud-policy",
            "neocloud-broker",
            "neocloud-providers",
            "neocloud-cloudsim",
            "neocloud-node",
        ],
    ),
    (
        "neocloud-protocol",
        &["kube", "wasmtime", "reqwest", "hyper"],
    ),
    ("neocloud-core", &["kube", "wasmtime", "reqwest"]),
    // The CRD types: shared by the controller, its CLIs and the tests; no IO of their own.
    (
        "neocloud-api",
        &[
            "wasmtime",
            "reqwest",
            "neocloud-node",
            "neocloud-broker",
            "neocloud-policy",
            "neocloud-providers",
            "neocloud-remote",
            "neocloud-cloudsim",
        ],
    ),
    ("neocloud-broker", &["kube"]),
    ("neocloud-providers", &["kube", "wasmtime"]),
    (
        "neocloud-kube-target",
        &[
            "wasmtime",
            "neocloud-policy",
            "neocloud-broker",
            "neocloud-remote",
            "neocloud-cloudsim",
            "neocloud-node",
        ],
    ),
    (
        "neocloud-oci",
        &[
            "kube",
            "k8s-openapi",
            "wasmtime",
            "neocloud-policy",
            "neocloud-node",
        ],
    ),
    // Metrics and traces: record what happened, decide nothing, own no controller.
    (
        "neocloud-telemetry",
        &[
            "neocloud-node",
            "neocloud-controller",
            "neocloud-burst-policy",
            "neocloud-remote",
            "neocloud-kube-target",
            "neocloud-kubelet",
            "neocloud-oci",
        ],
    ),
    // The BurstPolicy controller: below the Pod controllers, which resolve policies through it.
    (
        "neocloud-burst-policy",
        &[
            "neocloud-node",
            "neocloud-controller",
            "neocloud-remote",
            "neocloud-kubelet",
            "neocloud-kube-target",
        ],
    ),
    // The Pod and binding controllers: below the binary that wires them, and below the
    // ProvisioningRequest controller, which holds the budget they take.
    (
        "neocloud-controller",
        &["neocloud-node", "neocloud-provisioning"],
    ),
    ("neocloud-provisioning", &["neocloud-node"]),
];

/// Crates only tests may use: a dev-dependency of anything, a normal dependency of nothing (so
/// the production binary carries no simulators and no test control plane).
const DEV_ONLY: &[&str] = &[
    "neocloud-testenv",
    "neocloud-fixtures",
    "neocloud-cloudsim",
    "neocloud-replay",
];

/// Tools built on the simulators, never part of the node: they may depend on the crates above
/// (the market replay runs the cloud simulators), and nothing may depend on them.
const SIMULATION_TOOLS: &[&str] = &["neocloud-replay"];

/// Package name -> the names of its normal (non-dev, non-build) dependencies.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// What `cargo <args>` prints, run at the workspace's root; fails the test when cargo fails.
fn cargo_stdout(args: &[&str]) -> Vec<u8> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("run cargo {args:?}: {e}"));
    assert!(
        out.status.success(),
        "cargo {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The workspace's resolved graph from `cargo metadata`, and its member names.
fn workspace_graph() -> (Graph, BTreeSet<String>) {
    let stdout = cargo_stdout(&["metadata", "--format-version", "1"]);
    let meta: Value = serde_json::from_slice(&stdout).expect("cargo metadata JSON");
    let name_of: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let members = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .map(|id| name_of[id.as_str().unwrap()].to_string())
        .collect();
    let mut graph = Graph::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve.nodes") {
        let from = name_of[node["id"].as_str().unwrap()].to_string();
        let normal = node["deps"].as_array().unwrap().iter().filter(|dep| {
            dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|kind| kind["kind"].is_null())
        });
        let deps = normal.map(|dep| name_of[dep["pkg"].as_str().unwrap()].to_string());
        graph.entry(from).or_default().extend(deps);
    }
    (graph, members)
}

/// The shortest path of normal dependencies from `from` to `to`, if there is one.
fn path(graph: &Graph, from: &str, to: &str) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(at) = queue.pop_front() {
        for next in graph.get(at).into_iter().flatten() {
            if next == from || came_from.contains_key(next.as_str()) {
                continue;
            }
            came_from.insert(next, at);
            if next == to {
                let mut out = vec![to.to_string()];
                while let Some(prev) = came_from.get(out.last().unwrap().as_str()) {
                    out.push(prev.to_string());
                }
                out.reverse();
                return Some(out);
            }
            queue.push_back(next);
        }
    }
    None
}

/// Every broken rule, one line each; rules naming an unknown package are broken too.
fn violations(graph: &Graph, members: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let known = |name: &str| graph.contains_key(name);
    let dev_only = DEV_ONLY.iter().flat_map(|to| {
        members
            .iter()
            .filter(|from| !SIMULATION_TOOLS.contains(&from.as_str()))
            .map(move |from| (from, *to))
    });
    let rules = FORBIDDEN
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |to| (*from, *to)));
    for (from, to) in rules.chain(dev_only.map(|(from, to)| (from.as_str(), to))) {
        if !members.contains(from) {
            out.push(format!(
                "rule {from} -> {to}: {from} is not a workspace member"
            ));
        } else if !known(to) {
            out.push(format!(
                "rule {from} -> {to}: no package {to} in the graph (a typo?)"
            ));
        } else if let Some(path) = path(graph, from, to) {
            out.push(format!(
                "{from} may not depend on {to}: {}",
                path.join(" -> ")
            ));
        }
    }
    out
}

#[test]
fn no_crate_has_a_forbidden_normal_dependency() {
    let (graph, members) = workspace_graph();
    let broken = violations(&graph, &members);
    assert!(
        broken.is_empty(),
        "forbidden dependencies (see docs/DEVELOPMENT.md's Layout and host/node/tests/layout.rs):\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_forbidden_edge_deep_in_a_made_up_graph_is_reported_with_its_path() {
    let edges = [
        ("neocloud-runner", "neocloud-protocol"),
        ("neocloud-protocol", "serde"),
        ("serde", "kube"),
        ("neocloud-core", "serde"),
        ("neocloud-node", "neocloud-testenv"),
        ("neocloud-api", "neocloud-node"),
        ("neocloud-controller", "neocloud-node"),
        ("neocloud-remote", "neocloud-kubelet"),
    ];
    let mut graph = Graph::new();
    for (from, to) in edges {
        graph.entry(from.into()).or_default().insert(to.into());
        graph.entry(to.into()).or_default();
    }
    for name in [
        "wasmtime",
        "k8s-openapi",
        "tokio",
        "reqwest",
        "hyper",
        "neocloud-broker",
    ] {
        graph.entry(name.into()).or_default();
    }
    for name in [
        "neocloud-cloudsim",
        "neocloud-policy",
        "neocloud-providers",
        "neocloud-fixtures",
        "neocloud-remote",
        "neocloud-kubelet",
        "neocloud-oci",
        "neocloud-kube-target",
        "neocloud-replay",
        "neocloud-api",
        "neocloud-telemetry",
        "neocloud-burst-policy",
        "neocloud-controller",
        "neocloud-provisioning",
    ] {
        graph.entry(name.into()).or_default();
    }
    let members = graph
        .keys()
        .filter(|n| n.starts_with("neocloud-"))
        .cloned()
        .collect();
    let broken = violations(&graph, &members);
    assert!(broken.contains(&"neocloud-runner may not depend on kube: neocloud-runner -> neocloud-protocol -> serde -> kube".to_string()), "{broken:#?}");
    assert!(
        broken.contains(
            &"neocloud-protocol may not depend on kube: neocloud-protocol -> serde -> kube"
                .to_string()
        ),
        "{broken:#?}"
    );
    assert!(
        broken.contains(
            &"neocloud-core may not depend on kube: neocloud-core -> serde -> kube".to_string()
        ),
        "{broken:#?}"
    );
    assert!(
        broken.contains(
            &"neocloud-node may not depend on neocloud-testenv: neocloud-node -> neocloud-testenv"
                .to_string()
        ),
        "{broken:#?}"
    );
    assert!(
        broken.contains(
            &"neocloud-api may not depend on neocloud-node: neocloud-api -> neocloud-node"
                .to_string()
        ),
        "{broken:#?}"
    );
    // And through it the test control plane, which no crate may link.
    assert!(
        broken.contains(&"neocloud-api may not depend on neocloud-testenv: neocloud-api -> neocloud-node -> neocloud-testenv".to_string()),
        "{broken:#?}"
    );
    // The controllers sit below the binary that wires them.
    assert!(
        broken.contains(
            &"neocloud-controller may not depend on neocloud-node: neocloud-controller -> neocloud-node"
                .to_string()
        ),
        "{broken:#?}"
    );
    // The callback may not reach back up to the kubelet API built on it.
    assert!(
        broken.contains(
            &"neocloud-remote may not depend on neocloud-kubelet: neocloud-remote -> neocloud-kubelet"
                .to_string()
        ),
        "{broken:#?}"
    );
    assert!(
        broken.contains(&"neocloud-controller may not depend on neocloud-testenv: neocloud-controller -> neocloud-node -> neocloud-testenv".to_string()),
        "{broken:#?}"
    );
    assert_eq!(broken.len(), 9, "{broken:#?}");
}

/// The lines of the TOML sections whose headers start with `prefix`, without blanks and
/// comments.
fn lint_lines(toml: &str, prefix: &str) -> Vec<String> {
    let mut inside = false;
    let mut lines = Vec::new();
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line.starts_with(prefix);
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            lines.push(line.to_owned());
        }
    }
    lines
}

/// The runner relaxes `unsafe_code` from `forbid` to `deny` (its pseudo-terminal code allows
/// it in one module) and must otherwise keep every workspace lint.
#[test]
fn the_runner_keeps_the_workspace_lints_but_unsafe_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let runner = std::fs::read_to_string(root.join("host/runner/Cargo.toml")).unwrap();
    let expected: Vec<String> = lint_lines(&workspace, "[workspace.lints.")
        .into_iter()
        .map(|l| l.replace("unsafe_code = \"forbid\"", "unsafe_code = \"deny\""))
        .collect();
    assert!(expected.len() > 5, "{expected:?}");
    assert_eq!(lint_lines(&runner, "[lints."), expected);
}

/// Each package of the workspace's graph and its features, from `cargo tree --workspace` with
/// `extra` arguments: package (name and version) -> its feature sets (a package built for the
/// host and for the target may appear with two).
fn tree_features(extra: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let mut args = vec![
        "tree",
        "--workspace",
        "--prefix",
        "none",
        "--format",
        "{p} [{f}]",
    ];
    args.extend_from_slice(extra);
    let stdout = cargo_stdout(&args);
    let mut packages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&stdout).lines() {
        let line = line.trim().trim_end_matches(" (*)");
        let Some((package, features)) = line.rsplit_once(" [") else {
            continue;
        };
        // A workspace member's path is left out: `name vX (/path)` -> `name vX`.
        let package = package.split(" (").next().unwrap_or(package);
        packages
            .entry(package.to_owned())
            .or_default()
            .insert(features.trim_end_matches(']').to_owned());
    }
    packages
}

/// A `cargo build --workspace` (what `make run-local` runs) gives every crate the features the
/// test build gives it, so that after `make test` it rebuilds nothing: a feature that only a
/// dev-dependency turns on (proptest's, criterion's) makes another build of that crate and of
/// every crate above it. `neocloud-replay` names those features as normal dependencies.
#[test]
fn a_workspace_build_has_the_test_build_s_features() {
    let normal = tree_features(&["--edges", "no-dev"]);
    let with_dev = tree_features(&[]);
    assert!(normal.len() > 100, "{} packages", normal.len());
    let differ: Vec<String> = normal
        .iter()
        .filter_map(|(package, features)| {
            let test = with_dev.get(package)?;
            (test != features).then(|| format!("{package}: {features:?} -> {test:?} in tests"))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "these crates get more features in the test build than in `cargo build --workspace`; \
         name the missing ones in host/replay/Cargo.toml:\n{}",
        differ.join("\n")
    );
}
