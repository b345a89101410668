//! What the VM runner's end-to-end tests share: a control plane, the simulators with Lambda
//! VMs that run their runner from `user_data`, and `neocloud-node run` replicas configured for
//! them (one without leader election, or several competing for the node's Lease).

#![allow(dead_code)] // each test binary uses a different part

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::PostParams;
use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};
use neocloud_node::crd::CloudPodBinding;
use neocloud_testenv::TestContext;
use serde_json::json;
use tokio::process::{Child, Command};

use crate::support::{free_port, runner_yaml};

pub const SECRET_VALUE: &str = "tok-7f3a9c0d-never-in-node-output";

pub struct World {
    pub ctx: TestContext,
    pub sims: CloudSim,
    pub node: String,
    dir: tempfile::TempDir,
    pub callback_port: u16,
    pub kubelet_port: u16,
    pub boot_timeout_seconds: u32,
    pub heartbeat_timeout_seconds: u32,
    /// The node's `providers:` list.
    pub providers: &'static str,
    /// More of the node's configuration, appended as it is (top-level YAML keys).
    pub extra_config: String,
}

impl World {
    /// A world whose Lambda VMs run their runner (`boots`), or never do.
    pub async fn new(prefix: &str, boots: bool) -> World {
        let runner = boots.then(crate::runner_bin::runner_binary);
        World::with_runner(prefix, runner).await
    }

    /// A world whose Lambda VMs start `runner` (a runner binary, or a script that starts one)
    /// from their `user_data`, or nothing.
    pub async fn with_runner(prefix: &str, runner: Option<PathBuf>) -> World {
        let boots = runner.is_some();
        let ctx = TestContext::new(prefix).await;
        let lambda = match runner {
            Some(runner) => SimConfig::fast().with_user_data_runner(runner),
            None => SimConfig::fast(),
        };
        let sims = CloudSim::start(CloudSimConfig {
            runpod: SimConfig::fast(),
            lambda,
            vast: SimConfig::fast(),
        })
        .await
        .unwrap();
        World::over(ctx, sims, if boots { 900 } else { 3 }, "[lambda]")
    }

    fn over(
        ctx: TestContext,
        sims: CloudSim,
        boot_timeout_seconds: u32,
        providers: &'static str,
    ) -> World {
        let node = format!("neocloud-{}", ctx.namespace);
        World {
            ctx,
            sims,
            node,
            dir: tempfile::tempdir().unwrap(),
            callback_port: free_port(),
            kubelet_port: free_port(),
            boot_timeout_seconds,
            heartbeat_timeout_seconds: 3,
            providers,
            extra_config: String::new(),
        }
    }

    /// A world whose RunPod and Vast containers run the runner from their start command, with
    /// a node renting from those two.
    pub async fn containers(prefix: &str) -> World {
        World::containers_with(prefix, crate::runner_bin::runner_binary()).await
    }

    /// [`World::containers`] whose containers start `runner` (a runner binary, or a script
    /// that starts one).
    pub async fn containers_with(prefix: &str, runner: PathBuf) -> World {
        let ctx = TestContext::new(prefix).await;
        let runner = || SimConfig::fast().with_user_data_runner(runner.clone());
        let sims = CloudSim::start(CloudSimConfig {
            runpod: runner(),
            lambda: SimConfig::fast(),
            vast: runner(),
        })
        .await
        .unwrap();
        World::over(ctx, sims, 900, "[runpod, vast]")
    }

    /// The configuration of replica `replica`: without leader election for `None`, else
    /// competing for the node's Lease (held 3 s) with the other replicas.
    pub fn config(&self, replica: Option<u32>) -> PathBuf {
        let election = match replica {
            None => "{enabled: false}".to_owned(),
            Some(_) => format!(
                "{{namespace: {ns}, leaseDurationSeconds: 3, renewGraceSeconds: 1}}",
                ns = self.ctx.namespace
            ),
        };
        let yaml = format!(
            "clusterId: vmtest\n\
             node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
             providers: {providers}\n\
             installCrds: true\n\
             metricsAddress: 127.0.0.1:{metrics}\n\
             healthIntervalSeconds: 1\n\
             leaderElection: {election}\n\
             reconciler: {{pollIntervalMs: 300, retryIntervalMs: 1000}}\n\
             sweeper: {{intervalSeconds: 3600, graceSeconds: 3600}}\n{runner}",
            node = self.node,
            kubelet = self.kubelet_port,
            metrics = free_port(),
            runner = runner_yaml(
                self.callback_port,
                &self.ctx.namespace,
                self.heartbeat_timeout_seconds,
                self.boot_timeout_seconds
            ),
            providers = self.providers,
        ) + &self.extra_config;
        let path = self
            .dir
            .path()
            .join(format!("node-{}.yaml", replica.unwrap_or(0)));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    /// The log of replica `replica` (`None`: the one without leader election).
    pub fn replica_log_path(&self, replica: Option<u32>) -> PathBuf {
        match replica {
            None => self.dir.path().join("node.log"),
            Some(n) => self.dir.path().join(format!("node-{n}.log")),
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.replica_log_path(None)
    }

    /// The node without leader election.
    pub fn spawn(&self) -> Child {
        self.spawn_replica(None)
    }

    /// Replica `replica` of the node (see [`World::config`]).
    pub fn spawn_replica(&self, replica: Option<u32>) -> Child {
        let log = std::fs::File::create(self.replica_log_path(replica)).unwrap();
        Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
            .args(["run", "--config"])
            .arg(self.config(replica))
            .env("KUBECONFIG", self.ctx.control_plane.admin_kubeconfig())
            .env("LAMBDA_API_KEY", self.sims.lambda.api_key())
            .env(
                "LAMBDA_SSH_KEY_NAME",
                neocloud_cloudsim::config::DEFAULT_SSH_KEY,
            )
            .env("LAMBDA_API_BASE_URL", self.sims.lambda.base_url())
            .env("RUNPOD_API_KEY", self.sims.runpod.api_key())
            .env("RUNPOD_API_BASE_URL", self.sims.runpod.base_url())
            .env("VAST_API_KEY", self.sims.vast.api_key())
            .env("VAST_API_BASE_URL", self.sims.vast.base_url())
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    pub fn node_log(&self) -> String {
        self.replica_log(None)
    }

    /// What replica `replica` has logged so far.
    pub fn replica_log(&self, replica: Option<u32>) -> String {
        std::fs::read_to_string(self.replica_log_path(replica)).unwrap_or_default()
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
    }

    /// A Pod on `provider` running `command`, never restarted; its command is run by the
    /// runner unless `runner` is false (`cloud.aibrix.ai/runner: "false"`).
    pub async fn command_pod(&self, name: &str, provider: &str, command: &[&str], runner: bool) {
        let mut annotations = json!({"cloud.aibrix.ai/providers": provider});
        if !runner {
            annotations["cloud.aibrix.ai/runner"] = json!("false");
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "nodeName": self.node,
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                    "command": command,
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    /// Waits up to 90 s for the Pod's phase to be one of `phases`; returns the Pod.
    pub async fn wait_phase(&self, name: &str, phases: &[&str]) -> Pod {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let pod = self.pods().get(name).await.unwrap();
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            if phase.as_deref().is_some_and(|p| phases.contains(&p)) {
                return pod;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} is {phase:?}, not {phases:?}: {:?}\n{}",
                pod.status,
                self.node_log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A client of the node's kubelet API as `user` in `groups` (a client certificate from the
    /// cluster's CA), calling it directly as metrics-server does. The node's self-signed serving
    /// certificate is not checked, as with metrics-server's `--kubelet-insecure-tls`.
    pub fn kubelet_client(&self, user: &str, groups: &[&str]) -> reqwest::Client {
        let pair = self.ctx.control_plane.client_cert(user, groups).unwrap();
        let pem = format!("{}{}", pair.cert_pem, pair.key_pem);
        reqwest::Client::builder()
            .use_rustls_tls()
            .danger_accept_invalid_certs(true)
            .identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap())
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap()
    }

    pub fn bindings(&self) -> Api<CloudPodBinding> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
    }

    pub async fn create_workload(&self, name: &str) {
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
    pub async fn wait_running_on_new(&self, name: &str, not_on: Option<&str>) -> String {
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
/// A script named `neocloud-runner` (the simulator and `runner_pids` know runners by that
/// name) that starts the real runner with its restart back-off shortened to `seconds`.
pub fn runner_with_backoff(dir: &std::path::Path, seconds: f64) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("neocloud-runner");
    let text = format!(
        "#!/bin/sh\nexport NEOCLOUD_RUNNER_RESTART_BACKOFF={seconds}s\nexec '{}' \"$@\"\n",
        crate::runner_bin::runner_binary().display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

pub fn runner_pids(callback_port: u16) -> Vec<i32> {
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
        let runner = args
            .first()
            .is_some_and(|a| std::path::Path::new(a).ends_with("neocloud-runner"));
        if runner && args.iter().any(|a| a.contains(&needle)) {
            pids.push(pid);
        }
    }
    pids
}

/// The value after `flag` on the command line of process `pid`.
/// The value of the environment variable `name` of process `pid`, as it started.
pub fn environ_var(pid: i32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|b| *b == 0).find_map(|entry| {
        let entry = String::from_utf8_lossy(entry);
        entry
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('='))
            .map(str::to_owned)
    })
}

pub fn cmdline_flag(pid: i32, flag: &str) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

/// A script named `neocloud-runner` that starts the real runner writing egress names to
/// `hosts` instead of the machine's `/etc/hosts`.
pub fn runner_with_hosts_file(
    dir: &std::path::Path,
    hosts: &std::path::Path,
) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("neocloud-runner");
    let text = format!(
        "#!/bin/sh\nexport {}='{}'\nexec '{}' \"$@\"\n",
        neocloud_runner::HOSTS_FILE_ENV,
        hosts.display(),
        crate::runner_bin::runner_binary().display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Polls `what` every 200 ms for up to `seconds`, until it returns `Some`.
pub async fn until<T, F, Fut>(seconds: u64, what: &str, world: &World, mut f: F) -> T
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
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
