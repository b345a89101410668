//! OTLP traces from `neocloud-node run` into a real OpenTelemetry Collector (OTLP receiver, file
//! exporter; `neocloud_testenv::Collector`): one trace per Pod placement with its translation,
//! planning, provider calls, rental and the wait to Running, the Kubernetes resource and span
//! attributes, the `traceparent` on the binding, and no Secret value anywhere in the export.
//! With the collector stopped, or hanging, the node keeps placing Pods, holds no more spans than
//! its queue's cap, and counts what it drops.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use neocloud_node::crd::CloudPodBinding;
use neocloud_testenv::{Collector, TestContext};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

mod support;
use support::{fast_sims, free_port, http_get, metric};

const SECRET_VALUE: &str = "s3cr3t-token-never-exported-9f2c";

/// The node, exporting to `endpoint` with a queue of `queue` spans; and its metrics port.
fn spawn(
    ctx: &TestContext,
    sims: &neocloud_cloudsim::CloudSim,
    node: &str,
    endpoint: &str,
    queue: usize,
    dir: &std::path::Path,
) -> (Child, u16) {
    let metrics = free_port();
    let yaml = format!(
        "clusterId: tracetest\n\
         node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
         providers: [runpod, vast]\n\
         installCrds: true\n\
         metricsAddress: 127.0.0.1:{metrics}\n\
         leaderElection: {{enabled: false}}\n\
         reconciler: {{pollIntervalMs: 300, retryIntervalMs: 1000}}\n\
         sweeper: {{intervalSeconds: 3600, graceSeconds: 3600}}\n",
        kubelet = free_port(),
    );
    let config: PathBuf = dir.join("node.yaml");
    std::fs::write(&config, yaml).unwrap();
    let log = std::fs::File::create(dir.join("node.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .args(["run", "--config"])
        .arg(&config)
        .env("KUBECONFIG", ctx.control_plane.admin_kubeconfig())
        .env("RUNPOD_API_KEY", sims.runpod.api_key())
        .env("RUNPOD_API_BASE_URL", sims.runpod.base_url())
        .env("VAST_API_KEY", sims.vast.api_key())
        .env("VAST_API_BASE_URL", sims.vast.base_url())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        .env("OTEL_BSP_MAX_QUEUE_SIZE", queue.to_string())
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "3000")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    (child, metrics)
}

async fn pod(ctx: &TestContext, node: &str, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(ctx.client.clone(), &ctx.namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

async fn wait_running(ctx: &TestContext, name: &str, log: &std::path::Path) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    for _ in 0..600 {
        let p = pods.get(name).await.unwrap();
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{name} never ran:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn attr_str(span: &Value, key: &str) -> Option<String> {
    let v = attr(span, key)?;
    v["stringValue"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn each_placement_is_one_trace_from_translation_to_running_without_secrets() {
    let ctx = TestContext::new("trace").await;
    let sims = fast_sims().await;
    let mut collector = Collector::start().await.expect("collector (make testenv)");
    let dir = tempfile::tempdir().unwrap();
    let node = format!("neocloud-{}", ctx.namespace);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([(
            "token".to_owned(),
            SECRET_VALUE.to_owned(),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(ctx.client.clone(), &ctx.namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let (_node, metrics) = spawn(
        &ctx,
        &sims,
        &node,
        &collector.otlp_http_endpoint(),
        512,
        dir.path(),
    );
    let log = dir.path().join("node.log");
    pod(&ctx, &node, "traced").await;
    wait_running(&ctx, "traced", &log).await;

    let bindings: Api<CloudPodBinding> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let binding = bindings.get("traced").await.unwrap();
    let traceparent = binding
        .status
        .unwrap()
        .traceparent
        .expect("traceparent on the binding");
    let trace_id = traceparent.split('-').nth(1).unwrap().to_owned();
    assert_eq!(trace_id.len(), 32, "{traceparent}");

    // Every span of the trace, once the wait to Running has been exported too.
    let mut spans = Vec::new();
    for _ in 0..300 {
        spans = collector
            .read_spans()
            .into_iter()
            .filter(|s| s["traceId"].as_str() == Some(trace_id.as_str()))
            .collect::<Vec<_>>();
        if spans.iter().any(|s| s["name"] == "wait for running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: BTreeSet<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    for wanted in [
        "place pod",
        "translate",
        "plan",
        "provider call",
        "rent",
        "wait for running",
    ] {
        assert!(names.contains(wanted), "no {wanted:?} span in {names:?}");
    }
    let root = spans.iter().find(|s| s["name"] == "place pod").unwrap();
    assert_eq!(
        attr_str(root, "k8s.namespace.name").as_deref(),
        Some(ctx.namespace.as_str())
    );
    assert_eq!(attr_str(root, "k8s.pod.name").as_deref(), Some("traced"));
    let traced = Api::<Pod>::namespaced(ctx.client.clone(), &ctx.namespace)
        .get("traced")
        .await
        .unwrap();
    assert_eq!(attr_str(root, "k8s.pod.uid"), traced.metadata.uid);
    assert_eq!(root["resource"]["k8s.cluster.name"], "tracetest", "{root}");
    assert_eq!(root["resource"]["service.name"], "neocloud-node", "{root}");
    // One root; everything else hangs under it (directly or through plan and rent).
    let ids: BTreeSet<&str> = spans.iter().filter_map(|s| s["spanId"].as_str()).collect();
    for s in &spans {
        if s["name"] != "place pod" {
            let parent = s["parentSpanId"].as_str().unwrap_or_default();
            assert!(
                ids.contains(parent),
                "{} has a parent outside the trace: {s}",
                s["name"]
            );
        }
    }
    let calls: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "provider call")
        .collect();
    assert!(
        calls.iter().any(
            |c| attr_str(c, "neocloud.operation").as_deref() == Some("create")
                && attr_str(c, "neocloud.outcome").as_deref() == Some("ok")
        ),
        "{calls:?}"
    );
    // In order: translated, planned, rented, then the wait.
    let start = |name: &str| -> u128 {
        let s = spans.iter().find(|s| s["name"] == name).unwrap();
        s["startTimeUnixNano"].as_str().unwrap().parse().unwrap()
    };
    assert!(start("translate") <= start("plan"));
    assert!(start("plan") <= start("rent"));
    // The wait starts at the rental's answer as the binding records it, to the second.
    let second = 1_000_000_000;
    assert!(start("rent") / second * second <= start("wait for running"));
    let export = std::fs::read_to_string(collector.traces_file()).unwrap();
    assert!(
        !export.contains(SECRET_VALUE),
        "a Secret value reached the traces"
    );

    let exported = metric(
        &http_get(metrics, "/metrics"),
        "neocloud_trace_spans_exported_total",
    );
    assert!(
        exported.is_some_and(|n| n >= spans.len() as f64),
        "{exported:?}"
    );
    let body = http_get(metrics, "/metrics");
    let placed: f64 = body
        .lines()
        .filter(|l| l.starts_with("neocloud_pod_time_to_running_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(placed, 1.0, "time to Running not observed once:\n{body}");

    // The same families arrive over OTLP, under their Prometheus names, with the resource.
    let wanted = [
        "neocloud_rentals",
        "neocloud_burn_rate_usd_per_hour",
        "neocloud_provider_call_duration",
        "neocloud_pod_time_to_running",
        "neocloud_trace_spans_exported",
    ];
    let mut metrics_seen = Vec::new();
    for _ in 0..100 {
        metrics_seen = collector.read_metrics();
        let names: BTreeSet<&str> = metrics_seen
            .iter()
            .filter_map(|m| m["name"].as_str())
            .collect();
        if wanted.iter().all(|w| names.contains(w)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let latest = |name: &str| {
        metrics_seen
            .iter()
            .rev()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no {name} over OTLP"))
            .clone()
    };
    let rentals = latest("neocloud_rentals");
    assert_eq!(
        rentals["resource"]["k8s.cluster.name"], "tracetest",
        "{rentals}"
    );
    assert_eq!(rentals["sum"]["isMonotonic"], true, "{rentals}");
    let created: f64 = rentals["sum"]["dataPoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| attr_str(p, "outcome").as_deref() == Some("created"))
        .map(|p| p["asDouble"].as_f64().unwrap_or_default())
        .sum();
    assert_eq!(created, 1.0, "{rentals}");
    let waited = latest("neocloud_pod_time_to_running");
    assert_eq!(waited["unit"], "s", "{waited}");
    let point = &waited["histogram"]["dataPoints"][0];
    assert_eq!(point["count"], "1", "{waited}");

    // The collector goes away: the node goes on placing Pods, and counts the spans it could
    // not deliver.
    collector.stop();
    pod(&ctx, &node, "untraced").await;
    wait_running(&ctx, "untraced", &log).await;
    let failed = r#"neocloud_trace_spans_dropped_total{reason="export_failed"}"#;
    let mut body = String::new();
    for _ in 0..100 {
        body = http_get(metrics, "/metrics");
        if metric(&body, failed).is_some_and(|n| n > 0.0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no dropped spans counted with the collector stopped:\n{body}");
}

/// A collector that accepts connections and never answers: every export waits out its timeout,
/// the queue fills, and what does not fit is dropped and counted while Pods keep being placed.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_collector_fills_the_capped_queue_and_placement_goes_on() {
    let ctx = TestContext::new("trace-hung").await;
    let sims = fast_sims().await;
    let dir = tempfile::tempdir().unwrap();
    let node = format!("neocloud-{}", ctx.namespace);
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", hole.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            open.push(socket);
        }
    });
    Api::<Secret>::namespaced(ctx.client.clone(), &ctx.namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "creds"},
                "stringData": {"token": SECRET_VALUE}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let (mut child, metrics) = spawn(&ctx, &sims, &node, &endpoint, 4, dir.path());
    let log = dir.path().join("node.log");
    let names: Vec<String> = (0..8).map(|i| format!("hung-{i}")).collect();
    for name in &names {
        pod(&ctx, &node, name).await;
    }
    for name in &names {
        wait_running(&ctx, name, &log).await;
    }
    // Eight placements make far more than four spans; with every export hanging, the queue
    // holds four and the rest are dropped.
    let full = r#"neocloud_trace_spans_dropped_total{reason="queue_full"}"#;
    let body = http_get(metrics, "/metrics");
    assert!(
        metric(&body, full).is_some_and(|n| n > 0.0),
        "no span counted as dropped on a full queue:\n{body}"
    );
    assert_eq!(
        metric(&body, "neocloud_trace_spans_exported_total"),
        Some(0.0),
        "{body}"
    );
    assert!(child.try_wait().unwrap().is_none(), "the node exited");
    held.abort();
}
