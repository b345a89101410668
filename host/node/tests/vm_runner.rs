//! The VM runner end to end: `neocloud-node run` on the real control plane with Lambda as its
//! only provider; the Lambda simulator boots each launched instance by running the
//! `neocloud-node runner` command of its `user_data`, which authenticates to the node's callback
//! server, fetches the workload (with a Secret in its environment) and runs it as a process.
//! The Pod goes Running only through the runner and `kubectl logs -f` streams its output through
//! the API server and the node's kubelet API; killing the runner leads to a heartbeat
//! timeout, the instance's termination and a replacement; no secret value reaches the node's
//! log, an event or a status.

use std::path::PathBuf;
use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};
use neocloud_node::crd::CloudPodBinding;
use neocloud_testenv::TestContext;
use serde_json::json;
use tokio::process::{Child, Command};

mod support;
use support::free_port;

const SECRET_VALUE: &str = "tok-7f3a9c0d-never-in-node-output";

struct World {
    ctx: TestContext,
    sims: CloudSim,
    node: String,
    dir: tempfile::TempDir,
    callback_port: u16,
    kubelet_port: u16,
    boot_timeout_seconds: u32,
}

impl World {
    /// A world whose Lambda VMs run their runner (`boots`), or never do.
    async fn new(prefix: &str, boots: bool) -> World {
        let ctx = TestContext::new(prefix).await;
        let lambda = if boots {
            SimConfig::fast().with_user_data_runner(env!("CARGO_BIN_EXE_neocloud-node"))
        } else {
            SimConfig::fast()
        };
        let sims = CloudSim::start(CloudSimConfig {
            runpod: SimConfig::fast(),
            lambda,
            vast: SimConfig::fast(),
        })
        .await
        .unwrap();
        let node = format!("neocloud-{}", ctx.namespace);
        World {
            ctx,
            sims,
            node,
            dir: tempfile::tempdir().unwrap(),
            callback_port: free_port(),
            kubelet_port: free_port(),
            boot_timeout_seconds: if boots { 900 } else { 3 },
        }
    }

    fn config(&self) -> PathBuf {
        let yaml = format!(
            "clusterId: vmtest\n\
             node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
             providers: [lambda]\n\
             installCrds: true\n\
             metricsAddress: 127.0.0.1:{metrics}\n\
             healthIntervalSeconds: 1\n\
             leaderElection: {{enabled: false}}\n\
             reconciler: {{pollIntervalMs: 300, retryIntervalMs: 1000}}\n\
             sweeper: {{intervalSeconds: 3600, graceSeconds: 3600}}\n\
             runner:\n\
             \x20 listen: 127.0.0.1:{cb}\n\
             \x20 callbackUrl: https://127.0.0.1:{cb}\n\
             \x20 executor: process\n\
             \x20 heartbeatIntervalSeconds: 1\n\
             \x20 heartbeatTimeoutSeconds: 3\n\
             \x20 bootTimeoutSeconds: {boot}\n",
            node = self.node,
            kubelet = self.kubelet_port,
            metrics = free_port(),
            cb = self.callback_port,
            boot = self.boot_timeout_seconds,
        );
        let path = self.dir.path().join("node.yaml");
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("node.log")
    }

    fn spawn(&self) -> Child {
        let log = std::fs::File::create(self.log_path()).unwrap();
        Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
            .args(["run", "--config"])
            .arg(self.config())
            .env("KUBECONFIG", self.ctx.control_plane.admin_kubeconfig())
            .env("LAMBDA_API_KEY", self.sims.lambda.api_key())
            .env(
                "LAMBDA_SSH_KEY_NAME",
                neocloud_cloudsim::config::DEFAULT_SSH_KEY,
            )
            .env("LAMBDA_API_BASE_URL", self.sims.lambda.base_url())
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    fn node_log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
    }

    fn bindings(&self) -> Api<CloudPodBinding> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
    }

    async fn create_workload(&self, name: &str) {
        let secrets: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "api"},
            "stringData": {"token": SECRET_VALUE}
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let script = "echo line-one; echo \"token has ${#API_TOKEN} chars\"; i=0; \
                      while true; do i=$((i+1)); echo tick $i; sleep 0.3; done";
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": self.node,
                "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                    "command": ["sh", "-c", script],
                    "env": [{"name": "API_TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    /// Waits until the Pod is Running on an instance other than `not_on`, and returns it.
    async fn wait_running_on_new(&self, name: &str, not_on: Option<&str>) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let pod = self.pods().get(name).await.unwrap();
            let binding = self.bindings().get_opt(name).await.ok().flatten();
            let instance = binding
                .clone()
                .and_then(|b| b.status)
                .and_then(|s| s.instance_id)
                .unwrap_or_default();
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running && !instance.is_empty() && Some(instance.as_str()) != not_on {
                return instance;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pod {name} is not Running on a new instance: {:?} {:?}\nbinding: {:#?}\n{}",
                pod.status.as_ref().and_then(|s| s.reason.clone()),
                pod.status.as_ref().and_then(|s| s.message.clone()),
                binding.and_then(|b| b.status),
                self.node_log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The pids of runner processes talking to this callback port.
fn runner_pids(callback_port: u16) -> Vec<i32> {
    let needle = format!("127.0.0.1:{callback_port}");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.get(1).map(String::as_str) == Some("runner")
            && args.iter().any(|a| a.contains(&needle))
        {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lambda_pod_runs_through_the_runner_and_is_replaced_when_its_heartbeats_stop() {
    let world = World::new("vmrun", true).await;
    let mut node = world.spawn();
    world.create_workload("trainer").await;

    // Running through the runner: the VM's runner authenticated, fetched the workload and
    // reported it running.
    let first = world.wait_running_on_new("trainer", None).await;
    let log = world.node_log();
    assert!(log.contains("runner reported"), "{log}");
    let pids = runner_pids(world.callback_port);
    assert_eq!(pids.len(), 1, "one runner for one Pod: {pids:?}");

    // `kubectl logs` through the API server, which calls the node's kubelet API, which reads
    // the runner's stream: the whole log so far, then following new lines as they come.
    let all = LogParams {
        container: Some("main".into()),
        ..LogParams::default()
    };
    let text = world.pods().logs("trainer", &all).await.unwrap();
    assert!(text.starts_with("line-one\n"), "{text}");
    let length = SECRET_VALUE.len();
    assert!(
        text.contains(&format!("token has {length} chars")),
        "{text}"
    );
    let follow = LogParams {
        follow: true,
        tail_lines: Some(1),
        ..all
    };
    let mut lines = world
        .pods()
        .log_stream("trainer", &follow)
        .await
        .unwrap()
        .lines();
    let mut ticks = Vec::new();
    while ticks.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next())
            .await
            .expect("a line in time")
            .expect("the stream is open")
            .unwrap();
        let n: u32 = line.strip_prefix("tick ").unwrap().parse().unwrap();
        ticks.push(n);
    }
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "{ticks:?}");
    drop(lines);

    // Kill the runner: its heartbeats stop, the node declares it lost after 3 s, terminates
    // the instance and places the Pod again (restartPolicy Always).
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let second = world.wait_running_on_new("trainer", Some(&first)).await;
    assert_ne!(first, second);

    let status = world
        .bindings()
        .get("trainer")
        .await
        .unwrap()
        .status
        .unwrap();
    let lost = status
        .attempts
        .iter()
        .find(|a| a.failure_class.as_deref() == Some("lost"))
        .unwrap_or_else(|| panic!("no lost attempt: {:#?}", status.attempts));
    assert!(
        lost.message
            .as_deref()
            .unwrap_or_default()
            .contains("heartbeats"),
        "{lost:?}"
    );
    let ledger = world.sims.ledger();
    let live: Vec<_> = ledger
        .live()
        .into_iter()
        .map(|e| e.instance_id.clone())
        .collect();
    assert_eq!(
        live,
        vec![second.clone()],
        "the lost instance is terminated: {ledger:?}"
    );

    let events: Api<Event> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let events = events.list(&ListParams::default()).await.unwrap();
    let replacing = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("Replacing"))
        .unwrap_or_else(|| panic!("no Replacing event: {:#?}", events.items));
    assert!(
        replacing
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("heartbeats"),
        "{replacing:?}"
    );

    // No secret value in the node's log, any event, the binding or the Pod.
    let pod = world.pods().get("trainer").await.unwrap();
    let binding = world.bindings().get("trainer").await.unwrap();
    for (what, text) in [
        ("node log", world.node_log()),
        ("events", serde_json::to_string(&events).unwrap()),
        ("binding", serde_json::to_string(&binding).unwrap()),
        ("pod status", serde_json::to_string(&pod.status).unwrap()),
    ] {
        assert!(
            !text.contains(SECRET_VALUE),
            "the secret value is in the {what}"
        );
    }

    // Deleting the Pod releases the instance and stops its runner.
    world
        .pods()
        .delete("trainer", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while world.pods().get_opt("trainer").await.unwrap().is_some()
        || !world.sims.ledger().live().is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Pod or its instance is still there\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !runner_pids(world.callback_port).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a runner outlived its instance"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vm_whose_runner_never_calls_back_is_terminated_and_replaced() {
    let world = World::new("vmboot", false).await;
    let mut node = world.spawn();
    world.create_workload("silent").await;

    // The VM comes up but nothing calls back: the Pod waits in ContainerCreating, never Running.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pod = world.pods().get("silent").await.unwrap();
        let reason = pod.status.as_ref().and_then(|s| s.reason.clone());
        if reason.as_deref() == Some("ContainerCreating") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ContainerCreating: {reason:?}\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // After the 3 s boot timeout the instance is terminated and another one rented.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let lost = loop {
        let status = world
            .bindings()
            .get("silent")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        let lost = status
            .attempts
            .iter()
            .find(|a| a.failure_class.as_deref() == Some("lost"))
            .cloned();
        if let Some(lost) = lost
            && status.instance_id.is_some()
        {
            break (lost, status);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the silent VM was not replaced: {status:?}\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (lost, status) = lost;
    let message = lost.message.unwrap_or_default();
    assert!(message.contains("never called back within 3s"), "{message}");
    let ledger = world.sims.ledger();
    let first = ledger.entries.first().unwrap();
    assert!(
        !first.is_live(),
        "the first instance is terminated: {ledger:?}"
    );
    assert_eq!(
        ledger.live().len(),
        1,
        "{ledger:#?}\n{status:#?}\n{}",
        world.node_log()
    );
    let pod = world.pods().get("silent").await.unwrap();
    assert_ne!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));

    world
        .pods()
        .delete("silent", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !world.sims.ledger().live().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the instance outlived its Pod\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    node.start_kill().unwrap();
    let _ = node.wait().await;
}
