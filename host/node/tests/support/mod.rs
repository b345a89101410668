//! What the node's integration tests share: the three cloud simulators with fast timings, the
//! real provider adapters pointed at them, and renting straight at a provider.

#![allow(dead_code)] // each test binary uses a different part

pub mod world;

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams};
use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};
use neocloud_core::{CapacityType, InstanceState, OfferQuery, WorkloadSpec};
use neocloud_providers::{
    ApiKey, CreateRequest, HttpConfig, LambdaConfig, LambdaProvider, Provider, RunpodConfig,
    RunpodProvider, VastConfig, VastProvider,
};
use neocloud_testenv::TestContext;
use serde_json::json;

/// The Wasm engine of every policy registry this test binary starts. A BurstPolicy is
/// cluster-wide, so each registry on the binary's control plane loads every test's policies: with
/// an engine per registry, the 12 MB JavaScript guest was compiled once per registry (`decisions`
/// took 209 s of CPU with its five tests side by side, 60 s one at a time). One engine compiles a
/// component once and makes the other loads wait for it; its disk cache, in the target
/// directory's scratch space, lets the next test binary read the compiled code back.
pub fn wasm_engine() -> neocloud_policy::wasm::WasmEngine {
    use neocloud_policy::wasm::{EngineConfig, WasmEngine};
    static ENGINE: std::sync::OnceLock<WasmEngine> = std::sync::OnceLock::new();
    ENGINE
        .get_or_init(|| {
            WasmEngine::new(EngineConfig {
                cache_dir: Some(wasm_cache_dir()),
                ..EngineConfig::default()
            })
            .expect("the tests' Wasm engine")
        })
        .clone()
}

/// The compiled-component cache the node's integration tests share: [`wasm_engine`]'s, and the
/// policy CLI's (`NEOCLOUD_WASM_CACHE_DIR`) in the tests that run it; never the user's.
/// `policy_test.rs`, which does not include this module, names the same directory.
pub fn wasm_cache_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache")
}

/// RunPod, Lambda and Vast simulators whose instances change state within milliseconds.
pub async fn fast_sims() -> CloudSim {
    CloudSim::start(CloudSimConfig {
        runpod: SimConfig::fast(),
        lambda: SimConfig::fast(),
        vast: SimConfig::fast(),
    })
    .await
    .unwrap()
}

/// `neocloud-node run --config config` as a process of the test (killed when dropped), against
/// `ctx`'s control plane and the simulators of `sims`, logging (`$NEOCLOUD_TEST_NODE_LOG`,
/// `info` by default) to `log`.
/// The node configuration's `runner:` section for tests: a callback on loopback port `port`,
/// the identity Secret in `namespace`, the process executor, a heartbeat every second, and
/// the given timeouts.
pub fn runner_yaml(
    port: u16,
    namespace: &str,
    heartbeat_timeout: u32,
    boot_timeout: u32,
) -> String {
    format!(
        "runner:\n\
         \x20 listen: 127.0.0.1:{port}\n\
         \x20 callbackUrl: https://127.0.0.1:{port}\n\
         \x20 identitySecretNamespace: {namespace}\n\
         \x20 executor: process\n\
         \x20 heartbeatIntervalSeconds: 1\n\
         \x20 heartbeatTimeoutSeconds: {heartbeat_timeout}\n\
         \x20 bootTimeoutSeconds: {boot_timeout}\n"
    )
}

pub fn node_process(
    config: &std::path::Path,
    ctx: &TestContext,
    sims: &CloudSim,
    log: std::fs::File,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .args(["run", "--config"])
        .arg(config)
        .env("KUBECONFIG", ctx.control_plane.admin_kubeconfig())
        .env("RUNPOD_API_KEY", sims.runpod.api_key())
        .env("RUNPOD_API_BASE_URL", sims.runpod.base_url())
        .env("VAST_API_KEY", sims.vast.api_key())
        .env("VAST_API_BASE_URL", sims.vast.base_url())
        .env("LAMBDA_API_KEY", sims.lambda.api_key())
        .env("LAMBDA_API_BASE_URL", sims.lambda.base_url())
        .env(
            "LAMBDA_SSH_KEY_NAME",
            neocloud_cloudsim::config::DEFAULT_SSH_KEY,
        )
        .env(
            "RUST_LOG",
            std::env::var("NEOCLOUD_TEST_NODE_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The adapters, one per simulator.
pub struct SimProviders {
    pub runpod: Arc<RunpodProvider>,
    pub lambda: Arc<LambdaProvider>,
    pub vast: Arc<VastProvider>,
}

/// Adapters for `sims`, with `http` (timeouts and retries) when given.
pub fn sim_providers(sims: &CloudSim, http: Option<HttpConfig>) -> SimProviders {
    let mut runpod = RunpodConfig::new(ApiKey::new(sims.runpod.api_key()));
    runpod.base_url = sims.runpod.base_url();
    let mut lambda = LambdaConfig::new(
        ApiKey::new(sims.lambda.api_key()),
        neocloud_cloudsim::config::DEFAULT_SSH_KEY,
    );
    lambda.base_url = sims.lambda.base_url();
    lambda.launch_interval_ms = 0;
    let mut vast = VastConfig::new(ApiKey::new(sims.vast.api_key()));
    vast.base_url = sims.vast.base_url();
    if let Some(http) = http {
        runpod.http = http.clone();
        lambda.http = http.clone();
        vast.http = http;
    }
    SimProviders {
        runpod: Arc::new(RunpodProvider::new(runpod).unwrap()),
        lambda: Arc::new(LambdaProvider::new(lambda).unwrap()),
        vast: Arc::new(VastProvider::new(vast).unwrap()),
    }
}

/// A free loopback port (free when asked; the caller binds it soon after).
pub fn free_port() -> u16 {
    neocloud_testenv::free_port().unwrap()
}

/// A client for a user bound to the project's ClusterRoles as the default install binds them:
/// config/rbac/role.yaml and the Secrets and ConfigMaps of config/rbac/env_role.yaml.
pub async fn node_identity(ctx: &TestContext) -> kube::Client {
    let user = format!("neocloud-node-{}", ctx.namespace);
    let roles = [
        include_str!("../../../../config/rbac/role.yaml"),
        include_str!("../../../../config/rbac/env_role.yaml"),
    ];
    let pp = PatchParams::apply("neocloud-node-tests").force();
    for (i, text) in roles.iter().enumerate() {
        // The first document of each file is its ClusterRole.
        let first = serde_yaml::Deserializer::from_str(text).next().unwrap();
        let role: ClusterRole = serde::Deserialize::deserialize(first).unwrap();
        let name = role.metadata.name.clone().unwrap();
        Api::<ClusterRole>::all(ctx.client.clone())
            .patch(&name, &pp, &Patch::Apply(&role))
            .await
            .unwrap();
        bind(ctx, &format!("{user}-{i}"), &name, "User", &user).await;
    }
    ctx.control_plane.client_as(&user, &[]).await.unwrap()
}

/// Whether `who` may do what `kubectl auth can-i ARGS` asks.
pub fn can_i(ctx: &TestContext, who: &str, args: &[&str]) -> bool {
    let out = ctx
        .control_plane
        .kubectl()
        .args(["auth", "can-i", "--as", who])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// Binds ClusterRole `role` to a `kind` subject (`User`, or `ServiceAccount` in the test's
/// namespace) with a ClusterRoleBinding called `name`.
pub async fn bind(ctx: &TestContext, name: &str, role: &str, kind: &str, subject: &str) {
    let subject = match kind {
        "ServiceAccount" => json!({"kind": kind, "name": subject, "namespace": ctx.namespace}),
        _ => json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}),
    };
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject]
    }))
    .unwrap();
    let pp = PatchParams::apply("neocloud-node-tests").force();
    Api::<ClusterRoleBinding>::all(ctx.client.clone())
        .patch(name, &pp, &Patch::Apply(&binding))
        .await
        .unwrap();
}

/// A one-GPU on-demand workload that sleeps for an hour.
pub fn workload() -> WorkloadSpec {
    let mut workload = neocloud_fixtures::workload();
    workload.command = vec!["sleep".into()];
    workload.args = vec!["3600".into()];
    workload
}

/// Rents the cheapest single-GPU on-demand offer under `name`, straight at the provider.
pub async fn rent(provider: &Arc<dyn Provider>, name: &str) -> InstanceState {
    let query = OfferQuery {
        gpu_models: vec![],
        gpu_count: 1,
        capacity: Some(CapacityType::OnDemand),
    };
    let offers = provider.list_offers(&query).await.unwrap();
    let offer = offers
        .into_iter()
        .min_by(|a, b| a.rent_price_per_hour().total_cmp(&b.rent_price_per_hour()))
        .expect("the simulator has a single-GPU on-demand offer");
    let request = CreateRequest {
        external_name: name.to_owned(),
        offer,
        workload: workload(),
        env: vec![],
        bid_per_hour: None,
        boot: None,
        registry_login: None,
    };
    provider.create(&request).await.unwrap()
}

/// The built guest policy `file` under `policies/build/` (`make policies` builds them).
pub fn policy_build(file: &str) -> std::path::PathBuf {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join("policies/build").join(file);
    assert!(
        path.exists(),
        "{} is missing: run `make policies` first",
        path.display()
    );
    path.canonicalize().unwrap()
}

/// Creates the cluster-wide BurstPolicy `name` running the built guest policy `file`, and waits
/// up to 180 s for it to load. Every test's registry in this control plane compiles the 12 MB
/// component; on a loaded machine that takes longer than a Pod's wait, so the Pod comes once it
/// has loaded.
pub async fn create_wasm_policy(client: &kube::Client, name: &str, file: &str) {
    use kube::api::PostParams;
    use neocloud_node::crd::BurstPolicy;
    let policy: BurstPolicy = serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": name},
        "spec": {"wasm": {"path": policy_build(file)}}
    }))
    .unwrap();
    Api::<BurstPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    wait_policy(client, name, "loaded", 180, policy_loaded).await;
}

/// BurstPolicy `name` once `f` holds of it, polled every 100 ms for up to `seconds`; panics
/// saying `what` it waited for and its last status.
pub async fn wait_policy(
    client: &kube::Client,
    name: &str,
    what: &str,
    seconds: u64,
    f: impl Fn(&neocloud_node::crd::BurstPolicy) -> bool,
) -> neocloud_node::crd::BurstPolicy {
    let api: Api<neocloud_node::crd::BurstPolicy> = Api::all(client.clone());
    let mut last = None;
    for _ in 0..seconds * 10 {
        let bp = api.get(name).await.unwrap();
        if f(&bp) {
            return bp;
        }
        last = bp.status;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("BurstPolicy {name} is not {what} after {seconds}s; its status: {last:?}");
}

/// Whether `bp`'s status describes its current generation.
pub fn policy_observed(bp: &neocloud_node::crd::BurstPolicy) -> bool {
    bp.status
        .as_ref()
        .is_some_and(|s| s.observed_generation == bp.metadata.generation)
}

/// Whether `bp` loaded.
pub fn policy_loaded(bp: &neocloud_node::crd::BurstPolicy) -> bool {
    bp.status.as_ref().is_some_and(|s| s.loaded)
}

/// `GET path` on `127.0.0.1:port` over plain HTTP/1.1: the raw response, head and body. A
/// refused connection is tried again for up to 30 s: a node process started moments ago (a
/// standby replica on a loaded machine) may not be listening yet.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut s = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => panic!("GET {path} on 127.0.0.1:{port}: {e}"),
        }
    };
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of the sample `series` (name and labels as exposed) in a `/metrics` body, if any.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The exit code of a Pod's first container, once it terminated.
pub fn exit_code(pod: &k8s_openapi::api::core::v1::Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// Runs `cmd` (a kubectl) with `stdin` written to it, off the runtime's threads.
pub async fn output_with_stdin(
    mut cmd: std::process::Command,
    stdin: &[u8],
) -> std::process::Output {
    use std::io::Write as _;
    use std::process::Stdio;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let input = stdin.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().unwrap();
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(&input).unwrap();
        drop(pipe);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

/// Runs `cmd` (a `kubectl exec -it ...`) on a 31x97 pseudo-terminal and types each step's
/// input once the screen shows its text (an empty text: once the remote shell shows anything,
/// its prompt); its exit code (`None` if it did not end within 30 s of the last step) and
/// everything the terminal showed.
pub async fn on_a_terminal(
    mut cmd: std::process::Command,
    steps: &'static [(&'static str, &'static [u8])],
) -> (Option<i32>, String) {
    use nix::pty::{Winsize, openpty};
    use std::io::{Read as _, Write as _};
    use std::os::fd::OwnedFd;
    use std::process::Stdio;
    use std::time::Duration;
    let size = Winsize {
        ws_row: 31,
        ws_col: 97,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(Some(&size), None).unwrap();
    let slave: OwnedFd = pty.slave;
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    let master = std::fs::File::from(pty.master);
    tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().unwrap();
        // The terminal's other end is then only kubectl's: once it exits, reading this end
        // fails (EIO) after the last byte it wrote, so the reader below ends with all of it.
        drop(cmd);
        let mut reader = master.try_clone().unwrap();
        let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = screen.clone();
        let (read_all, all_read) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            let _ = read_all.send(());
        });
        // Type only once the screen shows what a step waits for: for the first, the remote
        // shell's prompt, so the session is open and kubectl has sent the terminal's size, which
        // a fixed pause did not promise on a loaded machine. A bit more for the size to reach
        // the remote terminal.
        let mut writer = master;
        for (after, input) in steps {
            let shown = |screen: &[u8]| {
                !screen.is_empty() && String::from_utf8_lossy(screen).contains(after)
            };
            let by = std::time::Instant::now() + Duration::from_secs(60);
            while !shown(&screen.lock().unwrap()) && std::time::Instant::now() < by {
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(500));
            writer.write_all(input).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // Everything kubectl wrote before it exited, however loaded the machine (a fixed pause
        // here once cut the last line off).
        let _ = all_read.recv_timeout(Duration::from_secs(20));
        drop(writer);
        let screen = String::from_utf8_lossy(&screen.lock().unwrap()).into_owned();
        (status, screen)
    })
    .await
    .unwrap()
}

/// helm from `hack/helm/build.sh`: built on first use, cached afterwards. Once per test binary,
/// so that concurrent tests do not build it side by side on a cold cache.
pub fn helm() -> std::path::PathBuf {
    static HELM: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    HELM.get_or_init(|| {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = std::process::Command::new("bash")
            .arg(repo.join("hack/helm/build.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap();
        let stdout = succeeded("hack/helm/build.sh", out);
        let path = std::path::PathBuf::from(stdout.lines().last().unwrap_or_default());
        assert!(path.is_file(), "hack/helm/build.sh printed {path:?}");
        path
    })
    .clone()
}

/// `helm` against the cluster of `kubeconfig`, run from the repository, with its own config,
/// cache and data directories under `home`; fails the test unless it succeeds, and returns its
/// standard output.
pub fn helm_on(kubeconfig: &std::path::Path, home: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(helm())
        .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .args(args)
        .output()
        .unwrap();
    succeeded(&format!("helm {args:?}"), out)
}

/// Fails the test unless `out` (of `what`) succeeded, showing its output; returns its stdout.
pub fn succeeded(what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Builds the node's image as `make image` does (`hack/image/build.py`, reproducibly) from
/// `binary`, tagged `reference`, and imports it into `worker`'s containerd.
pub fn import_node_image(
    worker: &neocloud_testenv::WorkerNode,
    binary: &std::path::Path,
    reference: &str,
    scratch: &std::path::Path,
) {
    let image_dir = scratch.join("image");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = std::process::Command::new("python3")
        .arg(repo.join("hack/image/build.py"))
        .arg("--binary")
        .arg(binary)
        .arg("--out")
        .arg(&image_dir)
        .args(["--ref", reference])
        .env("SOURCE_DATE_EPOCH", "0")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    worker.import_archive(&image_dir.join("image.tar")).unwrap();
    std::fs::remove_dir_all(&image_dir).unwrap();
}
