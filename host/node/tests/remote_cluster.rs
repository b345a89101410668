//! Another Kubernetes cluster as a burst target, end to end: the reconciler on the test binary's
//! control plane rents through the `kube` provider on a second, real control plane (with its own
//! scheduler and controller manager) beside the cloud simulators. KWOK plays the remote cluster's
//! kubelets: its GPU nodes carry `nvidia.com/gpu` and GPU feature discovery labels, their Pods go
//! Running once the remote scheduler binds them, end with the exit code a test writes on them,
//! and serve their logs through the remote API server.

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncBufReadExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use neocloud_broker::{Catalog, CatalogConfig};
use neocloud_cloudsim::NvkeSim;
use neocloud_core::ProviderId;
use neocloud_kube_target::{KubeTarget, KubeconfigSource, RemoteCluster};
use neocloud_node::naming::ClusterId;
use neocloud_node::sweeper::{Sweeper, SweeperConfig};
use neocloud_providers::Provider;
use neocloud_testenv::kwok::{ECHO_PORT, EXIT_CODE_ANNOTATION, MISSING_IMAGE, fake_gpu_node};
use neocloud_testenv::{ControlPlane, Kwok, Options, TestContext};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

mod support;
use neocloud_node::crd::BurstPolicy;
use support::world::{World, phase, providers};
use support::{exit_code, free_port, policy_loaded, wait_policy};

const PRODUCT: &str = "NVIDIA-A100-SXM4-80GB";
const REMOTE_NS: &str = "burst";
const SECRET_VALUE: &str = "tok_remote_never_in_a_spec_51c9";

/// The remote cluster on `second`: a namespace with its default ServiceAccount, and two GPU
/// nodes whose kubelets KWOK plays.
async fn remote_cluster(second: &ControlPlane) -> (Client, Kwok) {
    let client = second.client().await.unwrap();
    let kwok = Kwok::start(second).await.unwrap_or_else(|e| panic!("{e}"));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": REMOTE_NS}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), REMOTE_NS);
    for _ in 0..600 {
        if accounts.get_opt("default").await.unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // gpu-node-1 runs one Pod; gpu-node-2's GPU shows free but it takes no Pod, so a rental
    // that only it could hold is refused by the remote scheduler.
    gpu_node(&client, "gpu-node-1", 110).await;
    gpu_node(&client, "gpu-node-2", 0).await;
    // The remote control plane's node lifecycle controller taints new nodes until it has seen
    // them Ready: a settled cluster has both untainted.
    for _ in 0..600 {
        if remote_free_nodes(&client).await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(remote_free_nodes(&client).await, 2, "{}", kwok.log_tail(40));
    // KWOK made them Ready keeping what they were made with: gpu-node-2 still takes no Pod.
    let full = Api::<Node>::all(client.clone())
        .get("gpu-node-2")
        .await
        .unwrap();
    let allocatable = full.status.and_then(|s| s.allocatable).unwrap_or_default();
    assert_eq!(
        allocatable.get("pods").map(|q| q.0.as_str()),
        Some("0"),
        "{allocatable:?}"
    );
    (client, kwok)
}

async fn gpu_node(client: &Client, name: &str, pods: u32) {
    let labels = json!({"nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": "1"});
    let allocatable =
        json!({"nvidia.com/gpu": "1", "cpu": "64", "memory": "512Gi", "pods": pods.to_string()});
    fake_gpu_node(client, name, labels, allocatable)
        .await
        .unwrap();
}

/// The remote GPU nodes without a taint.
async fn remote_free_nodes(client: &Client) -> usize {
    let nodes: Api<Node> = Api::all(client.clone());
    let Ok(list) = nodes.list(&ListParams::default()).await else {
        return 0;
    };
    list.items
        .iter()
        .filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(|t| t.is_empty())
        })
        .count()
}

/// The workload of remote Pod `name` exits with `code`: KWOK ends its container so.
async fn exit(remote: &Api<Pod>, name: &str, code: i32) {
    let patch = json!({"metadata": {"annotations": {EXIT_CODE_ANNOTATION: code.to_string()}}});
    remote
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A local GPU Pod wanting an A100, with a value from a local Secret in its environment.
async fn create_pod(world: &World, name: &str, restart: &str) {
    let annotations = json!({"cloud.aibrix.ai/gpu-type": "A100"});
    create_annotated(
        world,
        name,
        restart,
        annotations,
        "registry.invalid/cuda:12",
    )
    .await;
}

async fn create_annotated(
    world: &World,
    name: &str,
    restart: &str,
    annotations: serde_json::Value,
    image: &str,
) {
    let pod = pod_of(world, name, restart, &annotations, image);
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// The Pod [`create_annotated`] makes.
fn pod_of(
    world: &World,
    name: &str,
    restart: &str,
    annotations: &serde_json::Value,
    image: &str,
) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": world.node,
            "restartPolicy": restart,
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "main", "image": image,
                "command": ["python", "train.py"],
                "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}],
                "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "32Gi"},
                    "requests": {"cpu": "4", "memory": "16Gi"}}}]
        }
    }))
    .unwrap()
}

/// The remote Pod of a local Pod's rental, once it exists and the remote scheduler bound it.
async fn remote_pod(world: &World, remote: &Api<Pod>, local: &str) -> Pod {
    for _ in 0..600 {
        if let Some(b) = world.bindings().get_opt(local).await.unwrap()
            && let Some(p) = remote.get_opt(&b.spec.external_name).await.unwrap()
            && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
        {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = world.bindings().get_opt(local).await.unwrap();
    panic!(
        "no bound remote Pod for {local}; binding: {:?}",
        b.and_then(|b| b.status)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_run_on_a_remote_cluster_end_with_its_exit_codes_and_fall_back_to_a_cloud_when_it_is_full()
 {
    let mut world = World::new("remote-cluster").await;
    let second = ControlPlane::start(Options::default()).await.unwrap();
    let (remote_client, _kwok) = remote_cluster(&second).await;
    let secrets: Api<Secret> = world.ctx.namespaced();
    let creds: Secret = serde_json::from_value(
        json!({"metadata": {"name": "creds"}, "stringData": {"token": SECRET_VALUE}}),
    )
    .unwrap();
    secrets
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();

    // The remote cluster's A100 is far cheaper than any cloud's, so it is tried first.
    let cluster = RemoteCluster {
        name: "gpu-west".into(),
        namespace: REMOTE_NS.into(),
        kubeconfig: KubeconfigSource {
            secret: None,
            key: None,
            path: Some(second.admin_kubeconfig()),
        },
        gpu_prices: [(PRODUCT.to_owned(), 0.05)].into_iter().collect(),
        surcharge_per_hour: 0.0,
        allow_insecure_skip_tls_verify: false,
    };
    let kube = Arc::new(KubeTarget::start(vec![(cluster, remote_client.clone())]));
    // The provider's watches have seen the settled cluster once its GPUs are offered.
    for _ in 0..600 {
        let offers = kube.list_offers(&query()).await.unwrap_or_default();
        if offers.iter().any(|o| o.id.ends_with(PRODUCT)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut all: Vec<Arc<dyn Provider>> = vec![kube];
    all.extend(providers(&world.sims));
    world.renter.catalog = Catalog::new(
        all,
        CatalogConfig {
            ttl: Duration::from_millis(200),
            fetch_timeout: Duration::from_secs(10),
        },
    );
    world.kill().await;
    world.start();
    let remote: Api<Pod> = Api::namespaced(remote_client.clone(), REMOTE_NS);

    // The cloud-first sample policy sends a Pod to a cloud although the cluster is cheaper.
    let sample = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../config/samples/burstpolicy-cloud-first.yaml"
    ))
    .unwrap();
    let policy: BurstPolicy = serde_yaml::from_str(&sample).unwrap();
    Api::<BurstPolicy>::all(world.ctx.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    wait_policy(
        &world.ctx.client,
        "cloud-first",
        "loaded",
        60,
        policy_loaded,
    )
    .await;
    let annotations =
        json!({"cloud.aibrix.ai/gpu-type": "A100", "cloud.aibrix.ai/policy": "cloud-first"});
    create_annotated(
        &world,
        "job-0",
        "Never",
        annotations,
        "registry.invalid/cuda:12",
    )
    .await;
    world
        .wait_pod("job-0", "Running", |p| phase(p) == Some("Running"))
        .await;
    let zero = world.binding("job-0").await.status.unwrap();
    assert_ne!(
        zero.provider.as_deref(),
        Some("kube"),
        "{:#?}",
        zero.attempts
    );
    assert!(
        remote
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // A Pod runs on the remote cluster: its environment's value only in the remote Secret.
    create_pod(&world, "job-a", "Never").await;
    let a = remote_pod(&world, &remote, "job-a").await;
    let a_name = a.metadata.name.clone().unwrap();
    let spec = serde_json::to_string(&a.spec).unwrap();
    assert!(!spec.contains(SECRET_VALUE), "{spec}");
    let resources = a.spec.as_ref().unwrap().containers[0]
        .resources
        .clone()
        .unwrap();
    let quantity = |m: &Option<std::collections::BTreeMap<String, _>>, k: &str| {
        m.as_ref()
            .and_then(|m| m.get(k))
            .map(|q: &Quantity| q.0.clone())
    };
    assert_eq!(
        (
            quantity(&resources.requests, "cpu"),
            quantity(&resources.requests, "memory"),
            quantity(&resources.limits, "memory"),
            quantity(&resources.limits, "nvidia.com/gpu"),
        ),
        (
            Some("4".into()),
            Some("16Gi".into()),
            Some("32Gi".into()),
            Some("1".into())
        ),
        "the remote Pod asks for what the local one does"
    );
    let running = world
        .wait_pod("job-a", "Running", |p| phase(p) == Some("Running"))
        .await;
    let pod_ip = running.status.as_ref().and_then(|s| s.pod_ip.clone());
    let remote_ip = remote.get(&a_name).await.unwrap().status.unwrap().pod_ip;
    assert!(
        remote_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10.20.")),
        "{remote_ip:?}"
    );
    assert_eq!(pod_ip, remote_ip, "the local Pod has the remote Pod's IP");
    // The remote kubelet's readiness is the local Pod's: its Ready condition turned False (as a
    // failing readiness probe turns it) makes the local Pod not Ready, and back.
    let ready = |p: &Pod| {
        let conditions = p.status.as_ref()?.conditions.as_ref()?;
        Some(
            conditions
                .iter()
                .find(|c| c.type_ == "Ready")?
                .status
                .clone(),
        )
    };
    assert_eq!(ready(&running).as_deref(), Some("True"));
    for (remote_ready, local) in [("False", "not Ready"), ("True", "Ready again")] {
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": remote_ready}]}});
        remote
            .patch_status(&a_name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .unwrap();
        world
            .wait_pod("job-a", local, |p| {
                ready(p).as_deref() == Some(remote_ready)
            })
            .await;
    }
    let binding = world.binding("job-a").await;
    let status = binding.status.clone().unwrap();
    assert_eq!(status.provider.as_deref(), Some("kube"));
    assert!(
        !serde_json::to_string(&binding)
            .unwrap()
            .contains(SECRET_VALUE)
    );
    for (reason, message) in world.events("job-a").await {
        assert!(!message.contains(SECRET_VALUE), "{reason}: {message}");
    }

    // With the remote cluster full, the next Pod is tried there, refused for capacity by the
    // remote scheduler, and runs on a cloud: both attempts are in its binding.
    create_pod(&world, "job-b", "Never").await;
    world
        .wait_pod("job-b", "Running", |p| phase(p) == Some("Running"))
        .await;
    let b = world.binding("job-b").await.status.unwrap();
    assert_ne!(b.provider.as_deref(), Some("kube"));
    let first = &b.attempts[0];
    assert_eq!(
        (first.provider.as_str(), first.failure_class.as_deref()),
        ("kube", Some("capacity")),
        "{:#?}",
        b.attempts
    );
    assert_eq!(
        b.attempts.last().unwrap().provider,
        b.provider.clone().unwrap()
    );

    // The remote Pod ends with 0: the local Pod Succeeded, the remote Pod and Secret are gone.
    exit(&remote, &a_name, 0).await;
    let done = world
        .wait_pod("job-a", "Succeeded", |p| phase(p) == Some("Succeeded"))
        .await;
    assert_eq!(exit_code(&done), Some(0));
    for _ in 0..300 {
        if remote.get_opt(&a_name).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(remote.get_opt(&a_name).await.unwrap().is_none());
    let remote_secrets: Api<Secret> = Api::namespaced(remote_client.clone(), REMOTE_NS);
    assert!(
        remote_secrets
            .get_opt(&format!("{a_name}-env"))
            .await
            .unwrap()
            .is_none()
    );

    // The GPU is free again: the next Pod runs there and fails with code 3.
    create_pod(&world, "job-c", "Never").await;
    let c = remote_pod(&world, &remote, "job-c").await;
    let c_name = c.metadata.name.clone().unwrap();
    world
        .wait_pod("job-c", "Running", |p| phase(p) == Some("Running"))
        .await;
    exit(&remote, &c_name, 3).await;
    let failed = world
        .wait_pod("job-c", "Failed", |p| phase(p) == Some("Failed"))
        .await;
    assert_eq!(exit_code(&failed), Some(3));

    // Deleting a local Pod removes its remote Pod and Secret.
    create_pod(&world, "job-d", "Never").await;
    let d = remote_pod(&world, &remote, "job-d").await;
    let d_name = d.metadata.name.clone().unwrap();
    world
        .wait_pod("job-d", "Running", |p| phase(p) == Some("Running"))
        .await;
    world
        .pods()
        .delete("job-d", &DeleteParams::default())
        .await
        .unwrap();
    world.wait_gone("job-d").await;
    assert!(remote.get_opt(&d_name).await.unwrap().is_none());
    assert!(
        remote_secrets
            .get_opt(&format!("{d_name}-env"))
            .await
            .unwrap()
            .is_none()
    );

    // An image the remote node cannot pull: the local Pod waits, saying so in the remote's words.
    let annotations = json!({"cloud.aibrix.ai/gpu-type": "A100"});
    create_annotated(&world, "job-p", "Never", annotations, MISSING_IMAGE).await;
    let pending = world
        .wait_pod("job-p", "waiting on ErrImagePull", |p| {
            let message = p.status.as_ref().and_then(|s| s.message.as_deref());
            message.is_some_and(|m| m.contains("ErrImagePull"))
        })
        .await;
    assert_eq!(phase(&pending), Some("Pending"));
    let said = pending.status.unwrap().message.unwrap();
    assert!(said.contains(&format!("\"{MISSING_IMAGE}\": ")), "{said}");
    let binding = world.binding("job-p").await.status.unwrap();
    let recorded = binding.message.unwrap_or_default();
    assert!(
        recorded.contains("ErrImagePull: failed to pull"),
        "{recorded}"
    );
    world
        .pods()
        .delete("job-p", &DeleteParams::default())
        .await
        .unwrap();
    world.wait_gone("job-p").await;

    // The node killed mid-rental and started again adopts the remote Pod it made.
    create_pod(&world, "job-e", "Never").await;
    let e = remote_pod(&world, &remote, "job-e").await;
    let e_name = e.metadata.name.clone().unwrap();
    world.kill().await;
    world.start();
    world
        .wait_pod("job-e", "Running", |p| phase(p) == Some("Running"))
        .await;
    let adopted = remote.get(&e_name).await.unwrap();
    assert_eq!(adopted.metadata.uid, e.metadata.uid);
    let ours = remote
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=neocloud-node"))
        .await
        .unwrap();
    assert_eq!(
        ours.items.len(),
        1,
        "only job-e's Pod is left on the remote cluster"
    );

    // A remote Pod under this cluster's prefix that no binding names is swept.
    let orphan = ClusterId::new("test").unwrap().external_name("orphan-0001");
    let kube_provider = world
        .renter
        .catalog
        .provider(ProviderId::Kube)
        .expect("the kube provider is in the catalog");
    // Left by a node that died after its binding went (made here as that node made it).
    let left: Pod = serde_json::from_value(json!({
        "metadata": {"name": orphan, "labels": {"app.kubernetes.io/managed-by": "neocloud-node"},
            "annotations": {"cloud.aibrix.ai/gpu-product": PRODUCT}},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"nvidia.com/gpu.product": PRODUCT},
            "containers": [{"name": "workload", "image": "registry.invalid/cuda:12"}]}
    }))
    .unwrap();
    remote.create(&PostParams::default(), &left).await.unwrap();
    // And the Secret of a rental whose node died before it created the Pod.
    let lone = ClusterId::new("test").unwrap().external_name("orphan-0002");
    let lone_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{lone}-env"),
            "labels": {"app.kubernetes.io/managed-by": "neocloud-node"}},
        "stringData": {"env-0": SECRET_VALUE}
    }))
    .unwrap();
    remote_secrets
        .create(&PostParams::default(), &lone_secret)
        .await
        .unwrap();
    let sweeper = Sweeper::new(
        world.ctx.client.clone(),
        vec![Arc::clone(&kube_provider)],
        ClusterId::new("test").unwrap(),
        SweeperConfig {
            grace: Duration::ZERO,
            ..SweeperConfig::default()
        },
    );
    let report = sweeper.sweep_once().await.unwrap();
    let mut deleted: Vec<&str> = report
        .deleted
        .iter()
        .map(|d| d.external_name.as_str())
        .collect();
    deleted.sort_unstable();
    assert_eq!(deleted, [orphan.as_str(), lone.as_str()], "{report:?}");
    assert!(
        report.kept_bound.iter().any(|k| k.external_name == e_name),
        "{report:?}"
    );
    for _ in 0..100 {
        if remote.get_opt(&orphan).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(remote.get_opt(&orphan).await.unwrap().is_none());
    let lone_left = remote_secrets
        .get_opt(&format!("{lone}-env"))
        .await
        .unwrap();
    assert!(lone_left.is_none(), "the orphan Secret is swept");
    // job-e's Secret, whose Pod lives, is not.
    let kept = remote_secrets
        .get_opt(&format!("{e_name}-env"))
        .await
        .unwrap();
    assert!(kept.is_some());

    // The remote API gone: the Pod running there stays Running, and new Pods go to a cloud.
    second.stop();
    // Once the node's watches have seen it go (they may hold the last listing for seconds after
    // the API server stopped), the cluster offers nothing. The node's catalog serves its last
    // copy of a query's offers once while it refreshes it, so the copy for job-f's own query is
    // refreshed here: a Pod planned on a cluster that is gone waits on kube's back-off (which
    // job-e's failing polls keep going), not what this step is about.
    let annotations = json!({"cloud.aibrix.ai/gpu-type": "A100"});
    let job_f = pod_of(
        &world,
        "job-f",
        "Never",
        &annotations,
        "registry.invalid/cuda:12",
    );
    let (workload, _) = world.current.as_ref().unwrap().plan_pod(&job_f).unwrap();
    let job_f_query = neocloud_core::OfferQuery::for_workload(&workload);
    let mut gone = false;
    for _ in 0..300 {
        gone = world
            .renter
            .catalog
            .fresh(ProviderId::Kube, &job_f_query)
            .await
            .is_ok_and(|o| o.is_empty());
        if gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the stopped cluster still offers GPUs after 30 s");
    create_pod(&world, "job-f", "Never").await;
    world
        .wait_pod("job-f", "Running", |p| phase(p) == Some("Running"))
        .await;
    let f = world.binding("job-f").await.status.unwrap();
    assert_ne!(f.provider.as_deref(), Some("kube"), "{:#?}", f.attempts);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = world.pods().get("job-e").await.unwrap();
    assert_eq!(phase(&still), Some("Running"));
    let e_binding = world.binding("job-e").await.status.unwrap();
    assert_eq!(e_binding.provider.as_deref(), Some("kube"));
}

/// `neocloud-node run` as installed, serving only the `kube` provider with `clusters` (the
/// config's `remoteClusters:` or `nvke:` section), for the test's namespace; killed on drop.
struct NodeProcess {
    node: String,
    log_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl NodeProcess {
    fn start(ctx: &TestContext, cluster_id: &str, clusters: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let node = format!("neocloud-{}", ctx.namespace);
        let yaml = format!(
            "clusterId: {cluster_id}\n\
             node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
             providers: [kube]\n\
             installCrds: true\n\
             metricsAddress: 127.0.0.1:{metrics}\n\
             healthIntervalSeconds: 1\n\
             leaderElection: {{namespace: {ns}, leaseDurationSeconds: 2, renewGraceSeconds: 1}}\n\
             reconciler: {{pollIntervalMs: 300, runningPollIntervalMs: 300, retryIntervalMs: 1000}}\n\
             kubeletApi: {{listenHost: 127.0.0.1}}\n\
             {clusters}",
            ns = ctx.namespace,
            kubelet = free_port(),
            metrics = free_port(),
        );
        let config_path = dir.path().join("node.yaml");
        std::fs::write(&config_path, yaml).unwrap();
        let log_path = dir.path().join("node.log");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
            .args(["run", "--config"])
            .arg(&config_path)
            .env("KUBECONFIG", ctx.control_plane.admin_kubeconfig())
            .env("POD_NAMESPACE", &ctx.namespace)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        NodeProcess {
            node,
            log_path,
            _dir: dir,
            _child: child,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

/// A local Pod on `node` wanting one A100, with `TOKEN` from Secret `creds` if there is one.
async fn gpu_pod(pods: &Api<Pod>, node: &str, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"cloud.aibrix.ai/gpu-type": "A100"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "command": ["python", "train.py"],
                "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef":
                    {"name": "creds", "key": "token", "optional": true}}}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

fn query() -> neocloud_core::OfferQuery {
    neocloud_core::OfferQuery {
        gpu_count: 1,
        ..Default::default()
    }
}

/// `neocloud-node run` as installed, with `remoteClusters` in its config file (the kubeconfig
/// from a file): a Pod runs on the remote cluster, and `kubectl logs` of the local Pod reads the
/// remote Pod's log (tail and timestamps, then following it as lines are written), `kubectl
/// exec` runs in it and `kubectl port-forward` reaches it, relayed by the node's kubelet API
/// through the remote API server to the remote node's kubelet (KWOK's server).
#[tokio::test(flavor = "multi_thread")]
async fn the_node_process_runs_a_pod_remotely_with_logs_exec_and_port_forward() {
    let ctx = TestContext::new("remote-logs").await;
    let second = ControlPlane::start(Options::default()).await.unwrap();
    let (remote_client, kwok) = remote_cluster(&second).await;
    kwok.write_log("2026-12-04T10:00:00.000000001Z", "step 10 loss 1.25")
        .unwrap();
    kwok.write_log("2026-12-04T10:00:05.000000001Z", "step 20 loss 0.75")
        .unwrap();

    // A kubeconfig file with its certificates inline: the node refuses file paths in one.
    let kubeconfig = second.dir().join("inline-admin.kubeconfig");
    let inline = second.inline_kubeconfig_as("remote-admin", &["system:masters"]);
    std::fs::write(&kubeconfig, inline.unwrap()).unwrap();
    let clusters = format!(
        "remoteClusters:\n\
         - {{name: gpu-west, namespace: {REMOTE_NS}, kubeconfig: {{path: {kubeconfig}}}, \
             gpuPrices: {{{PRODUCT}: 0.5}}}}\n",
        kubeconfig = kubeconfig.display(),
    );
    let process = NodeProcess::start(&ctx, "rlogs", &clusters);
    let node = process.node.clone();
    let node_log = || process.log();

    let creds: Secret = serde_json::from_value(
        json!({"metadata": {"name": "creds"}, "stringData": {"token": SECRET_VALUE}}),
    )
    .unwrap();
    ctx.namespaced::<Secret>()
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();
    let pods: Api<Pod> = ctx.namespaced();
    gpu_pod(&pods, &node, "trainer").await;
    let remote: Api<Pod> = Api::namespaced(remote_client.clone(), REMOTE_NS);
    let mut remote_name = None;
    for _ in 0..600 {
        let list = remote.list(&ListParams::default()).await.unwrap();
        if let Some(p) = list
            .items
            .into_iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("gpu-node-1"))
        {
            remote_name = p.metadata.name;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let remote_name = remote_name.unwrap_or_else(|| panic!("no remote Pod\n{}", node_log()));
    // The Secret's value travels in the remote Secret only: not in the remote Pod, nor in the
    // node's log.
    let there = remote.get(&remote_name).await.unwrap();
    assert!(
        !serde_json::to_string(&there)
            .unwrap()
            .contains(SECRET_VALUE)
    );
    let env_secret = Api::<Secret>::namespaced(remote_client.clone(), REMOTE_NS)
        .get(&format!("{remote_name}-env"))
        .await
        .unwrap();
    let carried = env_secret
        .data
        .unwrap_or_default()
        .into_values()
        .any(|v| v.0 == SECRET_VALUE.as_bytes());
    assert!(carried, "the remote Secret carries the value");
    for _ in 0..600 {
        let p = pods.get("trainer").await.unwrap();
        if phase(&p) == Some("Running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        phase(&pods.get("trainer").await.unwrap()),
        Some("Running"),
        "{}",
        node_log()
    );

    // kubectl logs --tail=1 --timestamps, through the local API server and the node.
    let params = LogParams {
        tail_lines: Some(1),
        timestamps: true,
        ..LogParams::default()
    };
    let tail = pods
        .logs("trainer", &params)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", node_log(), kwok.log_tail(20)));
    assert_eq!(tail, "2026-12-04T10:00:05.000000001Z step 20 loss 0.75\n");
    let direct = remote.logs(&remote_name, &params).await.unwrap();
    assert_eq!(tail, direct, "the relayed log is the remote Pod's");

    // kubectl logs -f: both lines, then a line the workload writes later, as it is written.
    let follow = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let mut lines = pods
        .log_stream("trainer", &follow)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", node_log()))
        .lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next())
            .await
            .expect("a followed line within 30 s")
            .expect("the stream stays open")
            .unwrap()
    };
    assert_eq!(next().await, "step 10 loss 1.25");
    assert_eq!(next().await, "step 20 loss 0.75");
    kwok.write_log("2026-12-04T10:00:10.000000001Z", "step 30 loss 0.5")
        .unwrap();
    assert_eq!(next().await, "step 30 loss 0.5");

    // kubectl exec: both streams and stdin, through the node to the remote Pod (KWOK runs the
    // command on this machine).
    let script = "echo out; echo err >&2; read x; echo got $x";
    let ok = kubectl(
        &ctx,
        &["exec", "-i", "trainer", "--", "sh", "-c", script],
        b"hello\n",
    )
    .await;
    assert!(ok.status.success(), "{}\n{}", text(&ok.stderr), node_log());
    assert_eq!(text(&ok.stdout), "out\ngot hello\n");
    assert_eq!(text(&ok.stderr), "err\n");
    // kubectl exec -it on a 31x97 terminal: the remote shell runs on a terminal of that size.
    let mut tty = ctx.control_plane.kubectl();
    tty.args(["-n", &ctx.namespace, "exec", "-it", "trainer", "--", "sh"]);
    // `exit` only once the output is on the screen: KWOK closes its terminal as soon as the
    // command ends, without reading what is left in it (kwok v0.8.0, debugging_exec_other.go),
    // which cut this screen short in CI.
    let steps: &[(&str, &[u8])] = &[("", b"stty size; tty\n"), ("/dev/pts/", b"exit\n")];
    let (_, screen) = support::on_a_terminal(tty, steps).await;
    assert!(screen.contains("31 97"), "{screen}\n{}", node_log());
    assert!(screen.contains("/dev/pts/"), "{screen}");
    // A failing command fails kubectl, with what the remote kubelet said (KWOK reports the exit
    // as an error; a kubelet's exit code is read as the code, see the session's unit test).
    let failed = kubectl(&ctx, &["exec", "trainer", "--", "sh", "-c", "exit 3"], b"").await;
    assert!(!failed.status.success());
    assert!(
        text(&failed.stderr).contains("exit status 3"),
        "{}",
        text(&failed.stderr)
    );

    // kubectl port-forward to the remote Pod's echo port: what is sent comes back.
    let local = free_port();
    let mut forward = ctx
        .control_plane
        .kubectl()
        .args(["-n", &ctx.namespace, "port-forward", "pod/trainer"])
        .arg(format!("{local}:{ECHO_PORT}"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut conn = None;
    for _ in 0..150 {
        if let Ok(c) = tokio::net::TcpStream::connect(("127.0.0.1", local)).await {
            conn = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut conn = conn.expect("kubectl port-forward listens");
    conn.write_all(b"ping through two clusters\n")
        .await
        .unwrap();
    let mut echoed = vec![0u8; 26];
    tokio::time::timeout(Duration::from_secs(30), conn.read_exact(&mut echoed))
        .await
        .expect("the echo within 30 s")
        .unwrap();
    assert_eq!(&echoed, b"ping through two clusters\n");
    forward.kill().unwrap();
    let _ = forward.wait();
    assert!(!node_log().contains(SECRET_VALUE), "the node never logs it");
    second.stop();
}

/// Runs kubectl in the test's namespace with `args` and `stdin`.
async fn kubectl(ctx: &TestContext, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut cmd = ctx.control_plane.kubectl();
    cmd.args(["-n", &ctx.namespace]).args(args);
    support::output_with_stdin(cmd, stdin).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `neocloud-node run` with NVKE discovery on: a workload cluster still provisioning receives
/// nothing (the Pod waits), once provisioned it runs the Pod; a token the management plane
/// refuses makes the node say so in its Ready condition, naming the status and never the token.
#[tokio::test(flavor = "multi_thread")]
async fn the_node_process_sends_work_to_an_nvke_cluster_once_provisioned_and_reports_a_refused_token()
 {
    let ctx = TestContext::new("remote-nvke").await;
    let second = ControlPlane::start(Options::default()).await.unwrap();
    let (remote_client, _kwok) = remote_cluster(&second).await;
    let sim = NvkeSim::start("jwt-one").await.unwrap();
    sim.add_cluster("wc-gpu", "gpu-east", Duration::from_secs(8));
    let secrets: Api<Secret> = ctx.namespaced();
    let kubeconfig = second
        .inline_kubeconfig_as("nvke-admin", &["system:masters"])
        .unwrap();
    for (name, key, value) in [
        ("wc-gpu", "kubeconfig", kubeconfig.as_str()),
        ("nvke-token", "token", "jwt-one"),
    ] {
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {key: value}}))
                .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let ca_file = second.dir().join("nvke-ca.pem");
    std::fs::write(&ca_file, sim.ca_pem()).unwrap();
    let nvke = format!(
        "nvke: {{url: {url}, caFile: {ca}, tokenSecret: nvke-token, namespace: {REMOTE_NS}, \
         gpuPrices: {{{PRODUCT}: 0.9}}, intervalSeconds: 1}}\n",
        url = sim.base_url(),
        ca = ca_file.display(),
    );
    let process = NodeProcess::start(&ctx, "rnvke", &nvke);
    let pods: Api<Pod> = ctx.namespaced();
    let remote: Api<Pod> = Api::namespaced(remote_client.clone(), REMOTE_NS);
    gpu_pod(&pods, &process.node, "early").await;

    // Provisioning: nothing is offered, the Pod waits, nothing is created there.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let early = pods.get("early").await.unwrap();
    assert_eq!(phase(&early), Some("Pending"), "{}", process.log());
    assert!(
        remote
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Provisioned: the Pod runs there.
    for _ in 0..600 {
        if phase(&pods.get("early").await.unwrap()) == Some("Running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = pods.get("early").await.unwrap();
    assert_eq!(phase(&running), Some("Running"), "{}", process.log());
    let there = remote.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(there.len(), 1, "one remote Pod on the discovered cluster");

    // The management plane refuses the token: the node's Ready condition says why.
    sim.set_token("jwt-two");
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut said = String::new();
    for _ in 0..300 {
        let node = nodes.get(&process.node).await.unwrap();
        said = node
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.message)
            .unwrap_or_default();
        if said.contains("NVKE discovery") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        said.contains("NVKE discovery") && said.contains("401"),
        "{said}\n{}",
        process.log()
    );
    assert!(!said.contains("jwt-"), "the token is never said: {said}");
    assert!(!process.log().contains("jwt-one"), "nor logged");
    // The Pod already running there is left alone.
    assert_eq!(phase(&pods.get("early").await.unwrap()), Some("Running"));
    second.stop();
}
