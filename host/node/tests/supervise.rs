//! A dead task does not go unnoticed: with two replicas under leader election on the real control
//! plane, the leader's sweeper panics (a fault injected with `NEOCLOUD_TEST_FAULT`, which only
//! debug builds read); the leader stops readiness, exits non-zero naming the task, and the standby
//! takes the Lease and runs the node's Pods.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use neocloud_cloudsim::CloudSim;
use neocloud_node::run::FAULT_VAR;
use neocloud_testenv::TestContext;
use serde_json::json;
use tokio::process::{Child, Command};

mod support;
use support::{fast_sims, free_port};

struct World {
    ctx: TestContext,
    sims: CloudSim,
    node: String,
    dir: tempfile::TempDir,
}

impl World {
    fn config(&self, port: u16) -> PathBuf {
        let yaml = format!(
            "clusterId: supervisetest\n\
             node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
             providers: [runpod, vast]\n\
             installCrds: true\n\
             metricsAddress: 127.0.0.1:{port}\n\
             healthIntervalSeconds: 1\n\
             leaderElection: {{namespace: {ns}, leaseDurationSeconds: 2, renewGraceSeconds: 1}}\n\
             reconciler: {{pollIntervalMs: 300, retryIntervalMs: 1000}}\n\
             sweeper: {{intervalSeconds: 3600, graceSeconds: 3600}}\n",
            node = self.node,
            ns = self.ctx.namespace,
            kubelet = free_port(),
        );
        let path = self.dir.path().join(format!("node-{port}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn spawn(&self, port: u16, log: &str, fault: Option<&str>) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_neocloud-node"));
        cmd.args(["run", "--config"])
            .arg(self.config(port))
            .env("KUBECONFIG", self.ctx.control_plane.admin_kubeconfig())
            .env("RUNPOD_API_KEY", self.sims.runpod.api_key())
            .env("RUNPOD_API_BASE_URL", self.sims.runpod.base_url())
            .env("VAST_API_KEY", self.sims.vast.api_key())
            .env("VAST_API_BASE_URL", self.sims.vast.base_url())
            .env("RUST_LOG", "info")
            .env_remove(FAULT_VAR)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.log(log)).unwrap())
            .kill_on_drop(true);
        if let Some(fault) = fault {
            cmd.env(FAULT_VAR, fault);
        }
        cmd.spawn().unwrap()
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn logs(&self) -> String {
        ["leader.log", "standby.log"]
            .iter()
            .map(|l| {
                let text = std::fs::read_to_string(self.log(l)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(30)..];
                format!("----- {l}\n{}\n", tail.join("\n"))
            })
            .collect()
    }

    /// The Lease holder's identity, once there is one.
    async fn holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace);
        let lease = leases
            .get_opt(&format!("neocloud-node-{}", self.node))
            .await
            .unwrap()?;
        lease.spec?.holder_identity
    }

    async fn wait_for(&self, what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + within;
        while !done().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what} did not happen within {within:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The status line of `GET path`, or `None` when nothing listens.
fn status(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines().next().map(str::to_owned)
}

fn identity(node: &str, child: &Child) -> String {
    format!("{node}-{}", child.id().unwrap())
}

fn is_200(line: &Option<String>) -> bool {
    line.as_deref()
        .is_some_and(|l| l.starts_with("HTTP/1.1 200"))
}

async fn run_pod(world: &World, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": world.node,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap();
    let pods: Api<Pod> = world.ctx.namespaced();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    world
        .wait_for(
            &format!("pod {name} Running"),
            Duration::from_secs(60),
            async || {
                let pod = pods.get(name).await.unwrap();
                pod.status.and_then(|s| s.phase).as_deref() == Some("Running")
            },
        )
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_sweeper_stops_the_leader_naming_it_and_the_standby_takes_over() {
    let ctx = TestContext::new("supervise").await;
    let world = World {
        node: format!("neocloud-{}", ctx.namespace),
        sims: fast_sims().await,
        dir: tempfile::tempdir().unwrap(),
        ctx,
    };
    let ports = [free_port(), free_port()];
    // The sweeper panics 8 s after the leader starts its tasks.
    let mut leader = world.spawn(ports[0], "leader.log", Some("panic-task:sweeper:8000"));
    let leader_id = identity(&world.node, &leader);
    world
        .wait_for(
            "the first replica leading and ready",
            Duration::from_secs(30),
            async || {
                world.holder().await.as_deref() == Some(leader_id.as_str())
                    && is_200(&status(ports[0], "/readyz"))
            },
        )
        .await;
    let standby = world.spawn(ports[1], "standby.log", None);
    let standby_id = identity(&world.node, &standby);
    // A standby is ready: healthy and able to take over (a Service that must reach the leader
    // alone selects the leader's label instead).
    world
        .wait_for("the standby ready", Duration::from_secs(30), async || {
            is_200(&status(ports[1], "/readyz"))
        })
        .await;
    assert_ne!(world.holder().await.as_deref(), Some(standby_id.as_str()));
    run_pod(&world, "before").await;
    assert!(
        leader.try_wait().unwrap().is_none(),
        "the leader stopped before its fault\n{}",
        world.logs()
    );

    // Until it exits, the leader answers /readyz; its last answer must not be 200.
    let mut last = status(ports[0], "/readyz");
    let exited = loop {
        if let Some(exit) = leader.try_wait().unwrap() {
            break exit;
        }
        last = status(ports[0], "/readyz").or(last);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let exited_at = tokio::time::Instant::now();
    let log = std::fs::read_to_string(world.log("leader.log")).unwrap();
    assert_eq!(exited.code(), Some(1), "{exited}\n{log}");
    assert!(
        log.contains(&format!("task sweeper panicked: injected by {FAULT_VAR}")),
        "{log}"
    );
    assert!(log.contains("released the leader Lease"), "{log}");
    assert!(
        status(ports[0], "/readyz").is_none(),
        "the leader still serves"
    );
    eprintln!("the leader's last /readyz before exiting: {last:?}");

    world
        .wait_for(
            "the standby taking the Lease",
            Duration::from_secs(10),
            async || {
                world.holder().await.as_deref() == Some(standby_id.as_str())
                    && is_200(&status(ports[1], "/readyz"))
            },
        )
        .await;
    eprintln!(
        "the standby led {:?} after the leader exited",
        exited_at.elapsed()
    );
    run_pod(&world, "after").await;
    let ledger = world.sims.ledger();
    assert_eq!(ledger.live().len(), 2, "{:?}", ledger.live());
    assert!(ledger.duplicate_live_names().is_empty());
}
