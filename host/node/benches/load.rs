//! Load benchmark: N Pods (default 1,000; `LOAD_PODS`) bound by `spec.nodeName` to NeoCloud Node
//! (the fake provider) and, on the same real control plane, to virtual-kubelet (its Go library
//! with a trivial in-memory provider, `hack/vkbench`). For each, it times the first create to all
//! Pods Running and then to all Pods gone, and reads the node process's CPU time and resident
//! memory from `/proc`. Prints a Markdown table and writes it to `<target>/loadbench.md`.
//!
//! Run: `cargo bench -p neocloud-node --bench load`. Knobs: `LOAD_PODS`, `LOAD_IN_FLIGHT`
//! (concurrent creates, default 24), `LOAD_CONCURRENCY` (NeoCloud reconciler concurrency and
//! virtual-kubelet workers, default 32), `LOAD_TIMEOUT_SECS` (per phase, default 600) and
//! `LOAD_RUST_LOG` (NeoCloud's log filter, default the node's own), `LOAD_NODE_WRAPPER` (a profiler
//! command to run NeoCloud under, such as `heaptrack -o /tmp/ncn`), `LOAD_POLL_MS` (NeoCloud's `reconciler.pollIntervalMs`, default 250) and `LOAD_IMPLS`
//! (comma-separated, default `neocloud,vk`). `neocloud-otel` exports traces to a real
//! OpenTelemetry Collector (`neocloud_testenv::Collector`); `neocloud-otel-hung` to one that
//! accepts connections and never answers (every export times out, the queue stays full). `vk` is virtual-kubelet with as many workers as
//! NeoCloud's concurrency and client QPS 1000, but the library's default work-queue limiter
//! (10/s, burst 100); `vk-fast` also lifts that limiter to 1000/s; `vk-defaults` keeps every
//! default (client-go's 5 QPS, burst 10; 10 workers).
//!
//! It measures the nodes, not the control plane: both run against the same API server, one after
//! the other, each in its own namespace and under its own node name.

#![allow(clippy::print_stdout, reason = "a benchmark binary reports on stdout")]

#[path = "load/apiserver.rs"]
mod apiserver;
#[path = "load/proc_stats.rs"]
mod proc_stats;
#[path = "load/tracker.rs"]
mod tracker;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use neocloud_testenv::TestContext;
use serde_json::json;
use tokio::process::{Child, Command};

use apiserver::Requests;
use proc_stats::Usage;
use tracker::Tracker;

/// The implementations a run can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    NeoCloud,
    NeoCloudOtel,
    NeoCloudOtelHung,
    Vk,
    VkFast,
    VkDefaults,
}

impl Impl {
    fn parse(s: &str) -> Impl {
        match s.trim() {
            "neocloud" => Impl::NeoCloud,
            "neocloud-otel" => Impl::NeoCloudOtel,
            "neocloud-otel-hung" => Impl::NeoCloudOtelHung,
            "vk" => Impl::Vk,
            "vk-fast" => Impl::VkFast,
            "vk-defaults" => Impl::VkDefaults,
            other => panic!(
                "LOAD_IMPLS: {other:?} is not neocloud, neocloud-otel, neocloud-otel-hung, vk, \
                 vk-fast or vk-defaults"
            ),
        }
    }

    fn label(self, concurrency: u16, poll_ms: u64) -> String {
        match self {
            Impl::NeoCloud => format!(
                "NeoCloud Node (fake provider, concurrency {concurrency}, poll {poll_ms} ms)"
            ),
            Impl::NeoCloudOtel => format!(
                "NeoCloud Node, traces to a live collector (concurrency {concurrency}, poll {poll_ms} ms)"
            ),
            Impl::NeoCloudOtelHung => format!(
                "NeoCloud Node, traces to a hung collector (concurrency {concurrency}, poll {poll_ms} ms)"
            ),
            Impl::Vk => format!(
                "virtual-kubelet v1.14.1 (in-memory, {concurrency} workers, QPS 1000/burst 2000)"
            ),
            Impl::VkFast => format!(
                "virtual-kubelet v1.14.1 (in-memory, {concurrency} workers, QPS 1000/burst 2000, queues 1000/s)"
            ),
            Impl::VkDefaults => {
                "virtual-kubelet v1.14.1 (in-memory, 10 workers, client-go QPS 5/burst 10)".into()
            }
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Impl::NeoCloud => "load-neocloud",
            Impl::NeoCloudOtel => "load-otel",
            Impl::NeoCloudOtelHung => "load-otelhung",
            Impl::Vk => "load-vk",
            Impl::VkFast => "load-vkfast",
            Impl::VkDefaults => "load-vkdef",
        }
    }
}

/// The run's settings, from the environment.
#[derive(Debug, Clone)]
struct Settings {
    pods: usize,
    in_flight: usize,
    concurrency: u16,
    poll_ms: u64,
    timeout: Duration,
    impls: Vec<Impl>,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not a valid value")),
        Err(_) => default,
    }
}

impl Settings {
    fn from_env() -> Settings {
        let impls = std::env::var("LOAD_IMPLS").unwrap_or_else(|_| "neocloud,vk".into());
        Settings {
            pods: env_or("LOAD_PODS", 1000),
            in_flight: env_or("LOAD_IN_FLIGHT", 24),
            concurrency: env_or("LOAD_CONCURRENCY", 32),
            poll_ms: env_or("LOAD_POLL_MS", 250),
            timeout: Duration::from_secs(env_or("LOAD_TIMEOUT_SECS", 600)),
            impls: impls.split(',').map(Impl::parse).collect(),
        }
    }
}

/// What one implementation measured.
#[derive(Debug)]
struct Row {
    label: String,
    pods: usize,
    /// First create to all Running; `None` when the phase timed out.
    up: Option<Duration>,
    running_at_end: usize,
    at_running: Usage,
    idle: Usage,
    /// Delete request to all gone; `None` when the phase timed out.
    down: Option<Duration>,
    at_end: Usage,
    log: PathBuf,
    log_warnings: usize,
    /// Requests the API server served from the first create to all Running, without the
    /// bench's own creates.
    requests_up: Requests,
    /// Requests it served from the delete to all gone, without the bench's own delete.
    requests_down: Requests,
    /// NeoCloud's trace span counters at the end: exported, dropped.
    spans: Option<(f64, f64)>,
}

impl Impl {
    fn is_neocloud(self) -> bool {
        matches!(
            self,
            Impl::NeoCloud | Impl::NeoCloudOtel | Impl::NeoCloudOtelHung
        )
    }
}

/// Where a NeoCloud run sends its spans, kept alive for the run.
enum SpanSink {
    None,
    Collector(neocloud_testenv::Collector),
    Hung(String, tokio::task::JoinHandle<()>),
}

impl SpanSink {
    async fn start(imp: Impl) -> SpanSink {
        match imp {
            Impl::NeoCloudOtel => SpanSink::Collector(
                neocloud_testenv::Collector::start()
                    .await
                    .expect("the OpenTelemetry Collector (make testenv)"),
            ),
            Impl::NeoCloudOtelHung => {
                let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let endpoint = format!("http://{}", hole.local_addr().unwrap());
                let held = tokio::spawn(async move {
                    let mut open = Vec::new();
                    while let Ok((socket, _)) = hole.accept().await {
                        open.push(socket);
                    }
                });
                SpanSink::Hung(endpoint, held)
            }
            _ => SpanSink::None,
        }
    }

    fn endpoint(&self) -> Option<String> {
        match self {
            SpanSink::None => None,
            SpanSink::Collector(c) => Some(c.otlp_http_endpoint()),
            SpanSink::Hung(endpoint, _) => Some(endpoint.clone()),
        }
    }
}

impl Drop for SpanSink {
    fn drop(&mut self) {
        match self {
            SpanSink::None => {}
            SpanSink::Collector(c) => c.stop(),
            SpanSink::Hung(_, held) => held.abort(),
        }
    }
}

/// `neocloud_trace_spans_exported_total` and the sum of `neocloud_trace_spans_dropped_total`.
fn span_counts(metrics_port: u16) -> Option<(f64, f64)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics_port)).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let value = |l: &str| l.rsplit(' ').next()?.parse::<f64>().ok();
    let exported = body
        .lines()
        .find(|l| l.starts_with("neocloud_trace_spans_exported_total "))
        .and_then(value)?;
    let dropped = body
        .lines()
        .filter(|l| l.starts_with("neocloud_trace_spans_dropped_total{"))
        .filter_map(value)
        .fold(0.0, |a, b| a + b);
    Some((exported, dropped))
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument would be meaningless here.
    let settings = Settings::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rows = runtime.block_on(run(&settings));
    let table = markdown(&settings, &rows);
    println!("\n{table}");
    let out = target_dir().join("loadbench.md");
    std::fs::write(&out, &table).unwrap();
    println!("written to {}", out.display());
}

async fn run(settings: &Settings) -> Vec<Row> {
    let vkbench = vkbench_binary();
    let mut rows = Vec::new();
    for &imp in &settings.impls {
        let ctx = TestContext::new(imp.slug()).await;
        let node = format!("{}-node", ctx.namespace);
        eprintln!(
            "== {} on node {node}",
            imp.label(settings.concurrency, settings.poll_ms)
        );
        rows.push(measure(&ctx, imp, &node, settings, &vkbench).await);
    }
    rows
}

async fn measure(
    ctx: &TestContext,
    imp: Impl,
    node: &str,
    settings: &Settings,
    vkbench: &Path,
) -> Row {
    let dir = target_dir().join("loadbench");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join(format!("{}.log", ctx.namespace));
    let sink = SpanSink::start(imp).await;
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let launch = Launch {
        vkbench,
        dir: &dir,
        log: &log,
        metrics_port,
        otlp: sink.endpoint(),
    };
    let mut child = spawn(ctx, imp, node, settings, &launch);
    let pid = child.id().unwrap();
    wait_registered(ctx, node, &mut child, &log).await;
    let idle = Usage::read(pid);
    let pods: Api<Pod> = ctx.namespaced();
    let tracker = Tracker::start(pods.clone());
    tracker.wait_synced().await;

    let served_before = Requests::read(&ctx.client).await;
    let started = Instant::now();
    create_pods(&pods, node, settings).await;
    eprintln!(
        "   {} creates sent after {:.1}s",
        settings.pods,
        secs(started.elapsed())
    );
    let done = tracker
        .wait(settings.timeout, |c| c.running >= settings.pods)
        .await;
    let up = done.then(|| started.elapsed());
    let at_running = Usage::read(pid);
    let served_up = Requests::read(&ctx.client).await;
    let running_at_end = tracker.counts().running;
    if !done {
        report_stuck(&pods, &log).await;
    }
    eprintln!(
        "   running: {running_at_end}/{} after {:.1}s",
        settings.pods,
        secs(started.elapsed())
    );

    let deleting = Instant::now();
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    let gone = tracker.wait(settings.timeout, |c| c.total == 0).await;
    let down = gone.then(|| deleting.elapsed());
    if !gone {
        report_stuck(&pods, &log).await;
    }
    let at_end = Usage::read(pid);
    let served_down = Requests::read(&ctx.client).await;
    eprintln!("   deleted after {:.1}s", secs(deleting.elapsed()));
    let spans = if imp.is_neocloud() {
        span_counts(metrics_port)
    } else {
        None
    };
    stop(child).await;
    drop(sink);
    Row {
        label: imp.label(settings.concurrency, settings.poll_ms),
        pods: settings.pods,
        up,
        running_at_end,
        at_running,
        idle,
        down,
        at_end,
        log_warnings: count_warnings(&log),
        log,
        requests_up: served_up.since(&served_before, &[("POST pods", settings.pods as f64)]),
        requests_down: served_down.since(&served_up, &[("DELETE pods", 1.0)]),
        spans,
    }
}

/// How a node process is started.
struct Launch<'a> {
    vkbench: &'a Path,
    dir: &'a Path,
    log: &'a Path,
    metrics_port: u16,
    /// The OTLP endpoint NeoCloud exports traces to, if any.
    otlp: Option<String>,
}

fn spawn(
    ctx: &TestContext,
    imp: Impl,
    node: &str,
    settings: &Settings,
    launch: &Launch<'_>,
) -> Child {
    let (vkbench, log) = (launch.vkbench, launch.log);
    let kubeconfig = ctx.control_plane.admin_kubeconfig();
    let mut cmd = match imp {
        Impl::NeoCloud | Impl::NeoCloudOtel | Impl::NeoCloudOtelHung => {
            let config = launch.dir.join(format!("{}.yaml", ctx.namespace));
            std::fs::write(
                &config,
                neocloud_config(node, settings, launch.metrics_port),
            )
            .unwrap();
            let node_bin = env!("CARGO_BIN_EXE_neocloud-node");
            // `LOAD_NODE_WRAPPER="heaptrack -o /tmp/ncn"` runs the node under a profiler; the
            // table's CPU and memory are then the wrapper's, not the node's.
            let wrapper = std::env::var("LOAD_NODE_WRAPPER").unwrap_or_default();
            let mut words = wrapper.split_whitespace();
            let mut cmd = match words.next() {
                Some(program) => {
                    let mut cmd = Command::new(program);
                    cmd.args(words).arg(node_bin);
                    cmd
                }
                None => Command::new(node_bin),
            };
            cmd.args(["run", "--config"]).arg(config);
            cmd.env("GPU_BURST_PROVIDER", "fake");
            match &launch.otlp {
                Some(endpoint) => cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
                None => cmd.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT"),
            };
            // The node's own default filter unless a run asks for another.
            match std::env::var("LOAD_RUST_LOG") {
                Ok(filter) => cmd.env("RUST_LOG", filter),
                Err(_) => cmd.env_remove("RUST_LOG"),
            };
            cmd
        }
        Impl::Vk | Impl::VkFast | Impl::VkDefaults => {
            let mut cmd = Command::new(vkbench);
            cmd.arg("--kubeconfig").arg(&kubeconfig);
            cmd.args(["--node-name", node, "--log-level", "info"]);
            if imp != Impl::VkDefaults {
                let workers = settings.concurrency.to_string();
                cmd.args(["--workers", &workers, "--qps", "1000", "--burst", "2000"]);
            }
            if imp == Impl::VkFast {
                cmd.args(["--queue-qps", "1000"]);
            }
            cmd
        }
    };
    cmd.env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log.with_extension("stdout")).unwrap())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        // Its own process group, so that a wrapper's child (the node under heaptrack) is
        // stopped with it.
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start the {imp:?} node: {e}"))
}

/// Stops the implementation's process group: SIGTERM first (the node hands its Lease back and a
/// profiler wrapping it writes its data), SIGKILL after 10 s.
async fn stop(mut child: tokio::process::Child) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let group = Pid::from_raw(pid);
        let _ = killpg(group, Signal::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
    let _ = child.kill().await;
}

fn neocloud_config(node: &str, settings: &Settings, port: u16) -> String {
    let (concurrency, poll) = (settings.concurrency, settings.poll_ms);
    format!(
        "clusterId: loadbench\n\
         node: {{name: {node}, maxPods: 2000, maxGpus: 2000}}\n\
         providers: [fake]\n\
         installCrds: true\n\
         metricsAddress: 127.0.0.1:{port}\n\
         leaderElection: {{enabled: false}}\n\
         reconciler: {{concurrency: {concurrency}, pollIntervalMs: {poll}, retryIntervalMs: 1000}}\n\
         sweeper: {{intervalSeconds: 3600, graceSeconds: 3600}}\n"
    )
}

/// Waits until the Node exists with condition Ready=True; panics with the log if the process
/// exits or two minutes pass.
async fn wait_registered(ctx: &TestContext, node: &str, child: &mut Child, log: &Path) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("node {node} exited with {status}:\n{}", tail(log, 40));
        }
        let ready = nodes.get_opt(node).await.unwrap().is_some_and(|n| {
            n.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} not Ready after 120s:\n{}",
            tail(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn create_pods(pods: &Api<Pod>, node: &str, settings: &Settings) {
    futures::stream::iter(0..settings.pods)
        .map(|i| {
            let pod = gpu_pod(&format!("p-{i:05}"), node);
            async move { pods.create(&PostParams::default(), &pod).await }
        })
        .buffer_unordered(settings.in_flight)
        .try_for_each(|_| async { Ok(()) })
        .await
        .unwrap();
}

fn gpu_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "loadbench"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap()
}

/// Prints Pods by phase, a few that are not Running, and the node log's tail.
async fn report_stuck(pods: &Api<Pod>, log: &Path) {
    let list = pods.list(&ListParams::default()).await.unwrap();
    let mut by_phase = std::collections::BTreeMap::<String, usize>::new();
    for p in &list.items {
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        *by_phase
            .entry(phase.unwrap_or_else(|| "-".into()))
            .or_default() += 1;
    }
    eprintln!("   STUCK: pods by phase {by_phase:?}");
    for p in list
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running"))
        .take(3)
    {
        eprintln!(
            "   {}: {:?}",
            p.metadata.name.as_deref().unwrap_or("?"),
            p.status
        );
    }
    eprintln!("   node log tail ({}):\n{}", log.display(), tail(log, 40));
}

/// Lines logged at WARN or ERROR: tracing's `LEVEL` column (colours stripped) or slog's `level=`.
fn count_warnings(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(strip_ansi)
        .filter(|l| {
            let tracing_level = l.split_whitespace().nth(1);
            matches!(tracing_level, Some("WARN" | "ERROR"))
                || l.contains("level=WARN")
                || l.contains("level=ERROR")
        })
        .count()
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An SGR sequence: ESC [ ... m
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The vkbench binary, built by `hack/vkbench/build.sh` if missing (its progress shows on stderr).
fn vkbench_binary() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/vkbench/build.sh");
    let out = std::process::Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("failed to run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({}); see its output above",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(stdout.lines().last().unwrap().trim())
}

/// `<target>`: the parent of Cargo's per-target temporary directory.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_path_buf()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn markdown(settings: &Settings, rows: &[Row]) -> String {
    let mut out = format!(
        "Load: {} Pods, {} creates in flight, one real control plane on {} cores.\n\n",
        settings.pods,
        settings.in_flight,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    out.push_str(
        "| implementation | pods | s to all Running | pods/s | CPU s | peak RSS MiB | RSS MiB at Running | RSS MiB idle | s to all gone | CPU s incl. deletes | log warn/error lines |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (up, rate) = match r.up {
            Some(d) => (
                format!("{:.1}", secs(d)),
                format!("{:.1}", r.pods as f64 / secs(d)),
            ),
            None => (
                format!("timeout ({} Running)", r.running_at_end),
                "-".into(),
            ),
        };
        let down = r
            .down
            .map_or("timeout".into(), |d| format!("{:.1}", secs(d)));
        out.push_str(&format!(
            "| {} | {} | {up} | {rate} | {:.2} | {:.1} | {:.1} | {:.1} | {down} | {:.2} | {} |\n",
            r.label,
            r.pods,
            r.at_running.cpu_seconds,
            r.at_running.peak_rss_mib,
            r.at_running.rss_mib,
            r.idle.rss_mib,
            r.at_end.cpu_seconds,
            r.log_warnings,
        ));
    }
    out.push_str(
        "\nAPI requests per Pod (`apiserver_request_total`, without the bench's own creates and \
         delete):\n\n| implementation | to all Running | by verb and resource | to all gone | by verb and resource |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.2} | {} | {:.2} | {} |\n",
            r.label,
            r.requests_up.total() / r.pods as f64,
            r.requests_up.per_pod(r.pods),
            r.requests_down.total() / r.pods as f64,
            r.requests_down.per_pod(r.pods),
        ));
    }
    for r in rows {
        if let Some((exported, dropped)) = r.spans {
            out.push_str(&format!(
                "\nTrace spans, {}: {exported:.0} exported, {dropped:.0} dropped.\n",
                r.label
            ));
        }
    }
    out.push_str("\nCPU s: user+system time of the node process from its start. Logs: ");
    let logs: Vec<String> = rows.iter().map(|r| r.log.display().to_string()).collect();
    out.push_str(&logs.join(", "));
    out.push('\n');
    out
}
