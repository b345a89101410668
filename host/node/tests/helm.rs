//! The Helm chart and the Grafana dashboard. The chart (`deploy/helm/neocloud-node`) renders, with
//! its defaults, every object of the kustomize install (`config/default`) with the same ClusterRole
//! rules, container env, probes, security context and node configuration, and the rendering passes
//! a server-side dry run on the real control plane; its values reach the node's configuration as
//! fields the node accepts. The dashboard (`deploy/grafana/neocloud-node.json`) charts every metric
//! the node exports and no other.
//!
//! helm is built from the Go module proxy by `hack/helm/build.sh`, which these tests call (it
//! returns at once when helm is cached).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use neocloud_core::ProviderId;
use neocloud_node::metrics::Metrics;
use neocloud_node::run::RunConfig;
use neocloud_testenv::TestContext;
use serde_json::Value;

mod support;
use support::{can_i, helm, succeeded};

/// The node's metrics as Prometheus stores them: counters with `_total`, histograms as their base.
const METRICS: &[&str] = &[
    "neocloud_burn_rate_usd_per_hour",
    "neocloud_budget_in_flight_usd_per_hour",
    "neocloud_provisioning_held_usd_per_hour",
    "neocloud_budget_cap_usd_per_hour",
    "neocloud_instances",
    "neocloud_rentals_total",
    "neocloud_provider_call_duration_seconds",
    "neocloud_policy_evaluations_total",
    "neocloud_policy_evaluation_duration_seconds",
    "neocloud_sweeper_deletions_total",
    "neocloud_pods",
    "neocloud_reconcile_errors_total",
    "neocloud_spend_usd_total",
    "neocloud_pod_time_to_running_seconds",
    "neocloud_trace_spans_exported_total",
    "neocloud_trace_spans_dropped_total",
];
const HISTOGRAMS: &[&str] = &[
    "neocloud_provider_call_duration_seconds",
    "neocloud_policy_evaluation_duration_seconds",
    "neocloud_pod_time_to_running_seconds",
];
const CHART: &str = "deploy/helm/neocloud-node";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `helm template` of the chart as the release `neocloud-node` in aibrix-system, CRDs included.
fn render(set: &[&str]) -> String {
    let mut helm = Command::new(helm());
    helm.current_dir(repo()).args([
        "template",
        "neocloud-node",
        CHART,
        "--namespace",
        "aibrix-system",
        "--include-crds",
    ]);
    for s in set {
        helm.args(["--set", s]);
    }
    succeeded("helm template", helm.output().unwrap())
}

/// Every document of a YAML stream, as JSON values, skipping empty ones.
fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn identity(o: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        s(&o["kind"]),
        s(&o["metadata"]["name"]),
        s(&o["metadata"]["namespace"]),
    )
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let mut of_kind = objects.iter().filter(|o| o["kind"] == kind);
    let found = of_kind
        .next()
        .unwrap_or_else(|| panic!("no {kind} rendered"));
    assert!(of_kind.next().is_none(), "more than one {kind} rendered");
    found
}

fn container(objects: &[Value]) -> &Value {
    &find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

/// The node configuration file in the rendered ConfigMap.
fn node_config(objects: &[Value]) -> &str {
    find(objects, "ConfigMap")["data"]["node.yaml"]
        .as_str()
        .unwrap()
}

fn kubectl(ctx: &TestContext, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = ctx
        .control_plane
        .kubectl()
        .current_dir(repo())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .unwrap();
    drop(input);
    succeeded(
        &format!("kubectl {args:?}"),
        child.wait_with_output().unwrap(),
    )
}

/// Asserts that `parts` of the object at `path` (`/`-separated) match in both renderings, for
/// every object of `kind` (paired by name and namespace).
fn assert_same(kustomize: &[Value], chart: &[Value], kind: &str, path: &str, parts: &[&str]) {
    let at = |object: &Value| object.pointer(path).unwrap_or(object).clone();
    let mut compared = 0;
    for ours in kustomize.iter().filter(|o| o["kind"] == kind) {
        let theirs = chart
            .iter()
            .find(|o| identity(o) == identity(ours))
            .unwrap_or_else(|| panic!("the chart renders no {:?}", identity(ours)));
        let (k, c) = (at(ours), at(theirs));
        for part in parts {
            assert_eq!(
                k[part],
                c[part],
                "{:?} {path}/{part} differs from the kustomize install",
                identity(ours)
            );
        }
        compared += 1;
    }
    assert!(compared > 0, "no {kind} rendered");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_defaults_render_what_config_default_installs() {
    let ctx = TestContext::new("helm-parity").await;
    let kustomize = documents(&kubectl(&ctx, &["kustomize", "config/default"], None));
    let chart = documents(&render(&[]));
    let ours: BTreeSet<_> = kustomize.iter().map(identity).collect();
    let theirs: BTreeSet<_> = chart.iter().map(identity).collect();
    assert_eq!(ours, theirs, "objects (kind, name, namespace) differ");
    let env_names = |c: &Value| -> Vec<Value> {
        let env = c["env"].as_array().unwrap();
        env.iter().map(|e| e["name"].clone()).collect()
    };
    let (k, c) = (container(&kustomize), container(&chart));
    assert_eq!(env_names(k), env_names(c), "container env names differ");
    let (k, c) = (&kustomize, &chart);
    assert_same(k, c, "ClusterRole", "", &["rules"]);
    assert_same(k, c, "ClusterRoleBinding", "", &["roleRef", "subjects"]);
    assert_same(k, c, "Deployment", "/spec", &["replicas", "selector"]);
    let pod = "/spec/template/spec";
    let pod_parts = ["securityContext", "serviceAccountName", "volumes"];
    assert_same(k, c, "Deployment", pod, &pod_parts);
    let container_parts = [
        "env",
        "args",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "securityContext",
        "resources",
        "volumeMounts",
    ];
    assert_same(
        k,
        c,
        "Deployment",
        &format!("{pod}/containers/0"),
        &container_parts,
    );
    let config = |o: &[Value]| serde_yaml::from_str::<Value>(node_config(o)).unwrap();
    assert_eq!(config(k), config(c), "the node's configuration differs");
    let cfg = RunConfig::from_yaml(node_config(c)).unwrap();
    assert_eq!(
        cfg.cluster_id, None,
        "the default install derives its clusterId"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_with_watch_namespaces_renders_what_config_namespaced_installs() {
    let ctx = TestContext::new("helm-ns-parity").await;
    let kustomize = documents(&kubectl(&ctx, &["kustomize", "config/namespaced"], None));
    let chart = documents(&render(&["watchNamespaces={gpu-jobs}"]));
    // The overlay creates its example namespace; the chart expects it to exist.
    let ours: BTreeSet<_> = kustomize
        .iter()
        .map(identity)
        .filter(|(kind, name, _)| !(kind == "Namespace" && name == "gpu-jobs"))
        .collect();
    let theirs: BTreeSet<_> = chart.iter().map(identity).collect();
    assert_eq!(ours, theirs, "objects (kind, name, namespace) differ");
    let (k, c) = (&kustomize, &chart);
    assert_same(k, c, "ClusterRole", "", &["rules"]);
    assert_same(k, c, "ClusterRoleBinding", "", &["roleRef", "subjects"]);
    assert_same(k, c, "RoleBinding", "", &["roleRef", "subjects"]);
    let config = |o: &[Value]| serde_yaml::from_str::<Value>(node_config(o)).unwrap();
    assert_eq!(config(k), config(c), "the node's configuration differs");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_with_watch_namespaces_grants_secrets_only_there() {
    let ctx = TestContext::new("helm-ns-rbac").await;
    let ns = ctx.namespace.clone();
    // Its own names, so no other install in this control plane grants the same account.
    let name = format!("ncn-{ns}");
    let rendered = render(&[
        &format!("fullname={name}"),
        &format!("watchNamespaces={{{ns}}}"),
        "createNamespace=false",
    ]);
    let rbac: Vec<&str> = rendered
        .split("\n---")
        .filter(|d| {
            d.contains("\nkind: ServiceAccount\n") || d.contains("rbac.authorization.k8s.io/v1")
        })
        .collect();
    let apply = ["apply", "--server-side", "--force-conflicts", "-f", "-"];
    let namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: aibrix-system\n";
    kubectl(&ctx, &apply, Some(namespace));
    kubectl(&ctx, &apply, Some(&rbac.join("\n---\n")));
    let sa = format!("system:serviceaccount:aibrix-system:{name}");
    let can = |args: &[&str]| can_i(&ctx, &sa, args);
    let allowed: [&[&str]; 4] = [
        &["get", "secrets", "-n", &ns],
        &["get", "configmaps", "-n", &ns],
        &["create", "secrets", "-n", "aibrix-system"],
        &["watch", "pods", "-A"],
    ];
    for args in allowed {
        assert!(can(args), "the chart should allow {args:?}");
    }
    let refused: [&[&str]; 4] = [
        &["get", "secrets", "-n", "default"],
        &["get", "configmaps", "-n", "kube-system"],
        &["get", "secrets", "-A"],
        &["list", "secrets", "-n", &ns],
    ];
    for args in refused {
        assert!(!can(args), "the chart allows {args:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rendered_chart_passes_a_server_side_dry_run() {
    let ctx = TestContext::new("helm-dry-run").await;
    let rendered = render(&[]);
    // A dry run creates nothing, so the namespaced objects need their namespace for real.
    let namespace = rendered
        .split("\n---")
        .find(|d| d.contains("\nkind: Namespace\n"))
        .expect("the chart renders the Namespace");
    let args = ["apply", "--server-side", "-f", "-"];
    kubectl(&ctx, &args, Some(namespace));
    let said = kubectl(
        &ctx,
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&rendered),
    );
    for object in [
        "namespace/aibrix-system",
        "customresourcedefinition.apiextensions.k8s.io/cloudpodbindings.cloud.aibrix.ai",
        "customresourcedefinition.apiextensions.k8s.io/burstpolicies.cloud.aibrix.ai",
        "serviceaccount/aibrix-neocloud-node",
        "clusterrole.rbac.authorization.k8s.io/aibrix-neocloud-node",
        "clusterrolebinding.rbac.authorization.k8s.io/aibrix-neocloud-node",
        "configmap/aibrix-neocloud-node-config",
        "deployment.apps/aibrix-neocloud-node",
    ] {
        assert!(
            said.contains(&format!("{object} serverside-applied (server dry run)")),
            "{object} missing from:\n{said}"
        );
    }
}

/// `helm` run against the test control plane, with its own config and cache directories.
fn helm_on(ctx: &TestContext, home: &Path, args: &[&str]) -> String {
    support::helm_on(&ctx.control_plane.admin_kubeconfig(), home, args)
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_installs_and_uninstalls_the_chart_in_an_existing_namespace() {
    let ctx = TestContext::new("helm-install").await;
    let home = tempfile::tempdir().unwrap();
    let ns = ctx.namespace.as_str();
    let release = ["neocloud-node", "--namespace", ns];
    let installed = helm_on(
        &ctx,
        home.path(),
        &[
            &["install"],
            &release[..],
            &[CHART, "--set", "createNamespace=false"],
        ]
        .concat(),
    );
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    let objects = [
        "deployment/aibrix-neocloud-node",
        "configmap/aibrix-neocloud-node-config",
    ];
    let get = |objects: &[&str]| {
        let mut args = vec!["-n", ns, "get", "--ignore-not-found", "-o", "name"];
        args.extend(objects);
        kubectl(&ctx, &args, None)
    };
    assert_eq!(
        get(&objects).lines().count(),
        2,
        "the install created too little"
    );
    helm_on(&ctx, home.path(), &[&["uninstall"], &release[..]].concat());
    assert_eq!(get(&objects), "", "the uninstall left objects behind");
}

#[test]
fn the_chart_crds_are_the_generated_ones() {
    let generated =
        std::fs::read_to_string(repo().join("config/crd/cloud.aibrix.ai.yaml")).unwrap();
    let chart = repo().join(CHART).join("crds/cloud.aibrix.ai.yaml");
    assert!(
        std::fs::read_to_string(chart).unwrap() == generated,
        "{CHART}/crds/cloud.aibrix.ai.yaml is stale: run `make manifests`"
    );
}

#[test]
fn the_chart_values_reach_the_node_as_fields_it_accepts() {
    let objects = documents(&render(&[
        "provider=runpod\\,vast",
        "clusterId=prod7",
        "nodeName=gpu-burst",
        "budgetUsdPerHour=25.5",
        "sweeper.intervalSeconds=120",
        "sweeper.dryRun=true",
        "replicas=3",
        "secrets.vast=my-vast",
        "createNamespace=false",
        "wasmCacheSizeLimit=2Gi",
    ]));
    assert!(objects.iter().all(|o| o["kind"] != "Namespace"));
    let cfg = RunConfig::from_yaml(node_config(&objects)).unwrap();
    assert_eq!(cfg.cluster_id.as_deref(), Some("prod7"));
    assert_eq!(cfg.node.name, "gpu-burst");
    assert_eq!(cfg.budget_usd_per_hour, Some(25.5));
    assert_eq!(cfg.sweeper.interval, Duration::from_secs(120));
    assert!(cfg.sweeper.dry_run);
    assert_eq!(cfg.metrics_address, "0.0.0.0:8080");
    assert!(
        cfg.providers.is_empty(),
        "providers come from GPU_BURST_PROVIDER"
    );
    let env = container(&objects)["env"].as_array().unwrap().clone();
    let var = |name: &str| env.iter().find(|e| e["name"] == name).unwrap().clone();
    assert_eq!(var("GPU_BURST_PROVIDER")["value"], "runpod,vast");
    let ids = cfg
        .provider_ids(var("GPU_BURST_PROVIDER")["value"].as_str())
        .unwrap();
    assert_eq!(ids, [ProviderId::Runpod, ProviderId::Vast]);
    assert_eq!(
        var("VAST_API_KEY")["valueFrom"]["secretKeyRef"]["name"],
        "my-vast"
    );
    assert_eq!(find(&objects, "Deployment")["spec"]["replicas"], 3);
    // Compiled policies go to the emptyDir mounted at policies.cacheDir.
    let cache_dir = cfg
        .policies
        .cache_dir
        .clone()
        .expect("policies.cacheDir set");
    let mounts = container(&objects)["volumeMounts"]
        .as_array()
        .unwrap()
        .clone();
    let mount = mounts.iter().find(|m| m["name"] == "wasm-cache").unwrap();
    assert_eq!(mount["mountPath"].as_str(), cache_dir.to_str());
    let pod = &find(&objects, "Deployment")["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_array().unwrap();
    let volume = volumes.iter().find(|v| v["name"] == "wasm-cache").unwrap();
    assert_eq!(volume["emptyDir"]["sizeLimit"], "2Gi");
}

/// Every metric name in the dashboard's panel expressions, in order of appearance.
fn dashboard_metrics() -> Vec<String> {
    let path = repo().join("deploy/grafana/neocloud-node.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(dashboard["templating"]["list"][0]["name"], "datasource");
    let mut names = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{target}");
            names.extend(metric_names(target["expr"].as_str().unwrap()));
        }
    }
    names
}

/// The `neocloud_[a-z_]+` words of a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("neocloud_") {
        let word = &rest[at..];
        let end = word
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(word.len());
        names.push(word[..end].to_owned());
        rest = &word[end..];
    }
    names
}

#[test]
fn the_dashboard_charts_every_node_metric_and_no_other() {
    let used = dashboard_metrics();
    let known = |name: &str| {
        METRICS.contains(&name)
            || name
                .strip_suffix("_bucket")
                .is_some_and(|base| HISTOGRAMS.contains(&base))
    };
    for name in &used {
        assert!(
            known(name),
            "the dashboard queries {name}, which the node does not export"
        );
    }
    for metric in METRICS {
        let bucket = format!("{metric}_bucket");
        assert!(
            used.iter().any(|u| u == metric || *u == bucket),
            "no dashboard panel charts {metric}"
        );
    }
}

#[test]
fn the_listed_metrics_are_what_the_node_exports() {
    let exported = Metrics::every_family_name();
    let listed: BTreeSet<String> = METRICS.iter().map(|m| m.to_string()).collect();
    assert_eq!(
        exported, listed,
        "the node's metrics and this test's list differ"
    );
}
