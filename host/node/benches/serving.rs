//! Serving from a burst GPU: the same backend server reached three ways from the cluster
//! network, in one run, on the rig's real worker node (kubelet, containerd, kube-proxy in a
//! network namespace).
//!
//! - **direct**: the server in a Pod on the worker node, at its Pod IP (no relay);
//! - **relay**: the server as a burst Pod's workload (RunPod simulator, the real runner, process
//!   executor, listening on 127.0.0.1), at the burst Pod's podIP: relay Pod → TLS to the node's
//!   kubelet API → port-forward session → runner → workload;
//! - **kubectl port-forward** to the burst Pod: API server → the node's kubelet API → runner.
//!
//! The server and the load client are this binary itself (`serve ADDR`, `client ...`, see
//! [`wire`]): the direct Pod runs it from an image built by `hack/image/build.py --binary
//! <this binary>`, the runner runs it on the host, and the client runs it under `nsenter
//! --net` in the worker's network namespace, where Pod IPs are routed. For each path: p50/p99
//! of 1 KiB round trips on 1, 16 and 128 persistent connections, one stream of 1 GiB
//! (`SERVING_STREAM_MIB`), the time to the first of three events written 1 s apart, and the
//! CPU seconds the `neocloud-node run` process spent per GB of that stream.
//!
//! Needs root (the worker node) and the release runner next to the node binary:
//!
//! ```sh
//! cargo build --release -p neocloud-runner && cargo bench -p neocloud-node --bench serving
//! ```
//!
//! Not a test: it asserts only that every path serves, and prints what it measured.

#![allow(clippy::print_stdout, reason = "a benchmark binary reports on stdout")]
#![allow(clippy::print_stderr, reason = "the server says where it listens")]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use neocloud_testenv::WorkerNode;
use serde_json::json;

#[path = "load/proc_stats.rs"]
#[allow(dead_code)]
mod proc_stats;
#[path = "../tests/runner_bin/mod.rs"]
mod runner_bin;
#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;
#[path = "../tests/vm_support/mod.rs"]
mod vm_support;
#[path = "serving/wire.rs"]
mod wire;

use support::free_port;
use vm_support::World;

const RELAY_IMAGE: &str = "ghcr.io/aibrix/neocloud-node:e2e";
const SERVER_IMAGE: &str = "neocloud.invalid/serving-bench:1";
const WORKER: &str = "serving-worker";
const CONNECTIONS: [usize; 3] = [1, 16, 128];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    match args.first().map(String::as_str) {
        Some("serve") => rt.block_on(wire::serve(args[1].parse().unwrap())),
        Some("client") => rt.block_on(client(&args[1..])),
        _ => rt.block_on(run()),
    }
}

/// `client wait|latency|stream|events ADDR [ARG...]`, in the worker's network namespace.
async fn client(args: &[String]) {
    let address: SocketAddr = args[1].parse().unwrap();
    let number = |i: usize| args[i].parse::<u64>().unwrap();
    match args[0].as_str() {
        "wait" => assert!(wire::wait_until_served(address, number(2)).await),
        "latency" => wire::latency(address, number(2) as usize, number(3) as f64).await,
        "stream" => wire::stream(address, number(2)).await,
        "events" => wire::events(address).await,
        other => panic!("no client mode {other:?}"),
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One path's figures, as the client printed them (`key=value` words per line).
#[derive(Default)]
struct Figures {
    latency: Vec<HashMap<String, String>>,
    stream: HashMap<String, String>,
    events: HashMap<String, String>,
    node_cpu_seconds: f64,
    /// CPU seconds per process role during the 16-connection round and during the stream.
    cpu16: HashMap<&'static str, f64>,
    cpu_stream: HashMap<&'static str, f64>,
    /// How often kubectl port-forward had exited and was started again.
    restarts: u32,
}

/// The rig: a worker node, the node with relays, the direct Pod and the burst Pod.
struct Rig {
    world: World,
    worker: WorkerNode,
    node: tokio::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

async fn run() {
    let rig = start().await;
    let direct_ip = running_ip(&rig.world, "echo-direct").await;
    let relay_ip = burst_ready(&rig.world).await;
    let host_ip = rig.worker.host_ip().to_string();
    let mut forward = Forward::new(&rig, &host_ip);
    let paths = [
        (
            "direct (Pod on the worker)",
            format!("{direct_ip}:{}", rig.port),
        ),
        ("relay (burst podIP)", format!("{relay_ip}:{}", rig.port)),
        (
            "kubectl port-forward",
            format!("{host_ip}:{}", forward.port),
        ),
    ];
    let mut table = Vec::new();
    for (i, (name, address)) in paths.iter().enumerate() {
        eprintln!("measuring {name} at {address}");
        let forward = (i == 2).then_some(&mut forward);
        table.push((*name, measure(&rig, address, forward).await));
    }
    forward.stop();
    report(&table);
    drop(rig);
}

async fn start() -> Rig {
    let mut world = World::containers("serving-bench").await;
    let worker = WorkerNode::start(world.ctx.control_plane, WORKER)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node_binary = Path::new(env!("CARGO_BIN_EXE_neocloud-node"));
    let me = std::env::current_exe().unwrap();
    support::import_node_image(&worker, node_binary, RELAY_IMAGE, dir.path());
    support::import_node_image(&worker, &me, SERVER_IMAGE, dir.path());
    world.extra_config = format!(
        "kubeletApi:\n  relays: {{image: \"{RELAY_IMAGE}\", address: \"{}:{}\"}}\n",
        worker.host_ip(),
        world.kubelet_port
    );
    let node = world.spawn();
    let port = free_port();
    let direct: Pod = serde_json::from_value(json!({
        "metadata": {"name": "echo-direct"},
        "spec": {"nodeName": WORKER, "containers": [{"name": "main", "image": SERVER_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/usr/local/bin/neocloud-node", "serve", format!("0.0.0.0:{port}")]}]}
    }))
    .unwrap();
    let burst: Pod = serde_json::from_value(json!({
        "metadata": {"name": "echo-burst", "annotations": {"cloud.aibrix.ai/providers": "runpod"}},
        "spec": {"nodeName": world.node, "containers": [{"name": "main",
            "image": "registry.invalid/vllm:1",
            "command": [me.to_str().unwrap(), "serve", format!("127.0.0.1:{port}")],
            "ports": [{"containerPort": port, "name": "echo"}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    for pod in [direct, burst] {
        world
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }
    Rig {
        world,
        worker,
        node,
        port,
        _dir: dir,
    }
}

/// `kubectl port-forward --address <host> pod/echo-burst PORT:PORT`, started again whenever it
/// has exited: kubectl ends a port-forward when one of its connections fails (as those beyond
/// the node's sessions per Pod do).
struct Forward {
    command: std::process::Command,
    child: std::process::Child,
    port: u16,
    restarts: u32,
}

impl Forward {
    fn new(rig: &Rig, host_ip: &str) -> Forward {
        let port = free_port();
        let mut command = rig.world.ctx.control_plane.kubectl();
        command
            .args(["-n", &rig.world.ctx.namespace, "port-forward", "--address"])
            .arg(host_ip)
            .arg("pod/echo-burst")
            .arg(format!("{port}:{}", rig.port))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().unwrap();
        Forward {
            command,
            child,
            port,
            restarts: 0,
        }
    }

    /// Starts kubectl again if it has exited; returns whether it had.
    fn revive(&mut self) -> bool {
        if self.child.try_wait().unwrap().is_none() {
            return false;
        }
        self.child = self.command.spawn().unwrap();
        self.restarts += 1;
        true
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 300 ms for up to `seconds`, until it returns `Some`.
async fn until<T, F, Fut>(seconds: u64, what: &str, world: &World, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {seconds}s\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn running_ip(world: &World, name: &str) -> String {
    until(120, &format!("{name} runs"), world, || async {
        let status = world.pods().get(name).await.ok()?.status?;
        (status.phase.as_deref() == Some("Running")).then_some(())?;
        status.pod_ip
    })
    .await
}

/// The burst Pod's podIP once it is Ready at its relay's IP.
async fn burst_ready(world: &World) -> String {
    until(
        180,
        "the burst Pod is Ready at its relay",
        world,
        || async {
            let status = world.pods().get("echo-burst").await.ok()?.status?;
            let ready = status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip = status.pod_ip?;
            let relays = world.pods().list(&Default::default()).await.ok()?;
            let relayed = relays.items.iter().any(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("neocloud-relay-"))
                    && p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some(ip.as_str())
            });
            (ready && relayed).then_some(ip)
        },
    )
    .await
}

/// Runs this binary's client in the worker's network namespace; returns its output lines'
/// `key=value` words.
async fn in_worker(rig: &Rig, args: &[&str]) -> Vec<HashMap<String, String>> {
    let out = tokio::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", rig.worker.netns()))
        .arg(std::env::current_exe().unwrap())
        .arg("client")
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "client {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        rig.world.node_log()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            line.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

async fn measure(rig: &Rig, address: &str, mut forward: Option<&mut Forward>) -> Figures {
    let seconds = env_number("SERVING_SECONDS", 5).to_string();
    let bytes = (env_number("SERVING_STREAM_MIB", 1024) << 20).to_string();
    let revive = |forward: &mut Option<&mut Forward>| {
        if let Some(f) = forward.as_deref_mut()
            && f.revive()
        {
            eprintln!("kubectl port-forward had exited; started again");
        }
    };
    in_worker(rig, &["wait", address, "60"]).await;
    let mut figures = Figures::default();
    for c in CONNECTIONS {
        revive(&mut forward);
        in_worker(rig, &["wait", address, "60"]).await;
        let before = cpu_by_role();
        let line = in_worker(rig, &["latency", address, &c.to_string(), &seconds]).await;
        if c == 16 {
            figures.cpu16 = since(&before);
        }
        eprintln!("  {line:?}");
        figures.latency.push(line.into_iter().next().unwrap());
        // Let the closed connections' sessions end before the next round.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    revive(&mut forward);
    in_worker(rig, &["wait", address, "60"]).await;
    let pid = rig.node.id().unwrap();
    let before = proc_stats::Usage::read(pid).cpu_seconds;
    let roles = cpu_by_role();
    figures.stream = in_worker(rig, &["stream", address, &bytes]).await.remove(0);
    figures.node_cpu_seconds = proc_stats::Usage::read(pid).cpu_seconds - before;
    figures.cpu_stream = since(&roles);
    eprintln!(
        "  {:?} node CPU {:.2} s",
        figures.stream, figures.node_cpu_seconds
    );
    revive(&mut forward);
    in_worker(rig, &["wait", address, "60"]).await;
    figures.events = in_worker(rig, &["events", address]).await.remove(0);
    eprintln!("  {:?}", figures.events);
    figures.restarts = forward.map_or(0, |f| f.restarts);
    figures
}

/// CPU seconds (user and system) so far of the processes on the paths, by role: the node
/// (`neocloud-node run`), the relay Pod (`neocloud-node relay`), the runner, the backend
/// server, kubectl and the API server. A process gone meanwhile is skipped.
fn cpu_by_role() -> HashMap<&'static str, f64> {
    let mut roles = HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let program = args[0].rsplit('/').next().unwrap_or_default();
        let first = args.get(1).map(String::as_str).unwrap_or_default();
        let role = match (program, first) {
            ("neocloud-node", "run") => "node",
            ("neocloud-node", "relay") => "relay",
            ("neocloud-runner", _) => "runner",
            (_, "serve") => "server",
            ("kubectl", _) if args.iter().any(|a| a == "port-forward") => "kubectl",
            ("kube-apiserver", _) => "apiserver",
            _ => continue,
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        *roles.entry(role).or_default() += ticks as f64 / 100.0;
    }
    roles
}

/// CPU seconds by role since `before`.
fn since(before: &HashMap<&'static str, f64>) -> HashMap<&'static str, f64> {
    cpu_by_role()
        .into_iter()
        .map(|(role, now)| (role, now - before.get(role).copied().unwrap_or(0.0)))
        .collect()
}

fn roles_line(cpu: &HashMap<&'static str, f64>) -> String {
    let mut roles: Vec<_> = cpu.iter().filter(|(_, s)| **s > 0.0).collect();
    roles.sort_by(|a, b| b.1.total_cmp(a.1));
    roles
        .iter()
        .map(|(role, s)| format!("{role} {s:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn get(map: &HashMap<String, String>, key: &str) -> f64 {
    map.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn report(table: &[(&str, Figures)]) {
    let mut header = "| path |".to_owned();
    for c in CONNECTIONS {
        header += &format!(" {c} conn p50 / p99 ms |");
    }
    println!("{header} 1 stream MB/s | first event ms | node CPU s/GB |");
    println!("|---|---|---|---|---|---|---|");
    for (name, f) in table {
        let mut row = format!("| {name} |");
        for l in &f.latency {
            let open = get(l, "open");
            let c = get(l, "c");
            let partial = if open < c {
                format!(" ({open} of {c} opened)")
            } else {
                String::new()
            };
            row += &format!(
                " {:.2} / {:.2}{partial} |",
                get(l, "p50_us") / 1000.0,
                get(l, "p99_us") / 1000.0
            );
        }
        let bytes = get(&f.stream, "bytes");
        let mbps = bytes / 1e6 / get(&f.stream, "seconds");
        let cpu = f.node_cpu_seconds / (bytes / 1e9);
        println!(
            "{row} {mbps:.0} | {:.1} | {cpu:.2} |",
            get(&f.events, "first_ms")
        );
    }
    println!();
    for (name, f) in table {
        println!("{name}:");
        for l in &f.latency {
            println!("  latency {l:?}");
        }
        println!(
            "  stream {:?}, node CPU {:.2} s",
            f.stream, f.node_cpu_seconds
        );
        println!("  events {:?}", f.events);
        println!(
            "  CPU s during the 16-connection round: {}",
            roles_line(&f.cpu16)
        );
        println!("  CPU s during the stream: {}", roles_line(&f.cpu_stream));
        if f.restarts > 0 {
            println!("  kubectl port-forward started again {} times", f.restarts);
        }
    }
}
