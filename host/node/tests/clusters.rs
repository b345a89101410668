//! Two clusters installed with the defaults (no `clusterId`) that share one cloud account: each
//! node derives its cluster id from its own `kube-system` namespace, so the ids differ, each
//! sweeper deletes orphans under its own prefix only, and neither deletes the other's running
//! instances. Two real control planes (the test binary's shared one and one of this test's own),
//! one set of simulators, one node process per control plane. Without `clusterId` and without
//! the right to read `kube-system`, the node refuses to start and says what to set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::PostParams;
use kube::{Api, Client};
use neocloud_cloudsim::CloudSim;
use neocloud_node::crd::CloudPodBinding;
use neocloud_node::naming::ClusterId;
use neocloud_node::run::IDENTITY_NAMESPACE;
use neocloud_providers::Provider;
use neocloud_testenv::{ControlPlane, Options, TestContext};
use serde_json::json;
use tokio::process::{Child, Command};

mod support;
use support::{fast_sims, free_port, rent, sim_providers};

/// One cluster: its control plane's admin access, a namespace for the test's Pod, and the id
/// its `kube-system` UID derives.
struct Cluster {
    kubeconfig: PathBuf,
    client: Client,
    namespace: String,
    derived: ClusterId,
}

impl Cluster {
    async fn new(cp: &ControlPlane, namespace: &str) -> Cluster {
        let client = cp.client().await.unwrap();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
        if namespaces.get_opt(namespace).await.unwrap().is_none() {
            namespaces
                .create(&PostParams::default(), &ns)
                .await
                .unwrap();
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        let mut uid = None;
        for _ in 0..300 {
            uid = namespaces
                .get_opt(IDENTITY_NAMESPACE)
                .await
                .unwrap()
                .and_then(|n| n.metadata.uid);
            if uid.is_some() && accounts.get_opt("default").await.unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let uid = uid.expect("kube-system has a UID");
        Cluster {
            kubeconfig: cp.admin_kubeconfig(),
            client,
            namespace: namespace.to_owned(),
            derived: ClusterId::derived_from_uid(&uid),
        }
    }

    /// The node's configuration with every default of an install: no `clusterId`.
    fn config(&self, dir: &Path, node: &str) -> PathBuf {
        let yaml = format!(
            "node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
             providers: [runpod, vast]\n\
             installCrds: true\n\
             metricsAddress: 127.0.0.1:{metrics}\n\
             healthIntervalSeconds: 1\n\
             leaderElection: {{namespace: {ns}, leaseDurationSeconds: 2, renewGraceSeconds: 1}}\n\
             reconciler: {{pollIntervalMs: 300, retryIntervalMs: 1000}}\n\
             sweeper: {{intervalSeconds: 1, graceSeconds: 1}}\n",
            ns = self.namespace,
            kubelet = free_port(),
            metrics = free_port(),
        );
        let path = dir.join(format!("{}.yaml", self.derived));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn spawn(&self, sims: &CloudSim, config: &Path, log: &Path) -> Child {
        Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
            .args(["run", "--config"])
            .arg(config)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUNPOD_API_KEY", sims.runpod.api_key())
            .env("RUNPOD_API_BASE_URL", sims.runpod.base_url())
            .env("VAST_API_KEY", sims.vast.api_key())
            .env("VAST_API_BASE_URL", sims.vast.base_url())
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    async fn create_pod(&self, node: &str, name: &str) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }))
        .unwrap();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }

    /// The binding of a Running Pod `name`, once the Pod runs.
    async fn running_binding(&self, name: &str, logs: &dyn Fn() -> String) -> CloudPodBinding {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        for _ in 0..600 {
            let pod = pods.get(name).await.unwrap();
            if pod.status.and_then(|s| s.phase).as_deref() == Some("Running") {
                let bindings: Api<CloudPodBinding> =
                    Api::namespaced(self.client.clone(), &self.namespace);
                return bindings.get(name).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "pod {name} in cluster {} is not Running after 60s\n{}",
            self.derived,
            logs()
        );
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "----- {}\n{}\n",
        path.display(),
        lines[lines.len().saturating_sub(40)..].join("\n")
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn two_default_installs_sharing_an_account_do_not_sweep_each_other() {
    let ctx = TestContext::new("clusters-a").await;
    let second = ControlPlane::start(Options::default()).await.unwrap();
    let clusters = [
        Cluster::new(ctx.control_plane, &ctx.namespace).await,
        Cluster::new(&second, "clusters-b").await,
    ];
    assert_ne!(clusters[0].derived, clusters[1].derived);
    let sims = fast_sims().await;
    let dir = tempfile::tempdir().unwrap();
    // The same node name in both clusters, as two default installs have.
    let node = format!("neocloud-{}", ctx.namespace);
    let logs: Vec<PathBuf> = (0..2)
        .map(|i| dir.path().join(format!("node-{i}.log")))
        .collect();
    let all_logs = || logs.iter().map(|l| tail(l)).collect::<String>();
    let _nodes: Vec<Child> = clusters
        .iter()
        .zip(&logs)
        .map(|(c, log)| c.spawn(&sims, &c.config(dir.path(), &node), log))
        .collect();

    let mut running = Vec::new();
    for cluster in &clusters {
        cluster.create_pod(&node, "job").await;
        let binding = cluster.running_binding("job", &all_logs).await;
        assert_eq!(binding.spec.cluster_id, cluster.derived.as_str());
        assert!(
            binding
                .spec
                .external_name
                .starts_with(&cluster.derived.prefix())
        );
        running.push(binding.spec.external_name);
    }
    // An orphan under each cluster's prefix, rented behind the nodes' backs: each sweeper must
    // delete its own, which shows it sweeps (the Pods' instances are older than the orphans).
    let providers = sim_providers(&sims, None);
    let orphans = [
        clusters[0].derived.external_name("orphan"),
        clusters[1].derived.external_name("orphan"),
    ];
    let runpod: std::sync::Arc<dyn Provider> = providers.runpod;
    let vast: std::sync::Arc<dyn Provider> = providers.vast;
    rent(&runpod, &orphans[0]).await;
    rent(&vast, &orphans[1]).await;
    let live = |name: &str| sims.ledger().named(name).iter().any(|e| e.is_live());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while orphans.iter().any(|o| live(o)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the orphans were not swept within 30s: {:?}\n{}",
            sims.ledger().live(),
            all_logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A few more sweeps, each past the grace period of both Pods' instances.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut still: Vec<String> = sims
        .ledger()
        .live()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    still.sort();
    running.sort();
    assert_eq!(
        still,
        running,
        "a cluster swept the other's instance\n{}",
        all_logs()
    );
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(
            text.contains("clusterId derived from namespace kube-system"),
            "{text}"
        );
    }
    drop(second);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_cluster_id_or_the_right_to_read_kube_system_the_node_refuses_to_start() {
    let ctx = TestContext::new("clusters-norbac").await;
    let cluster = Cluster::new(ctx.control_plane, &ctx.namespace).await;
    let sims = fast_sims().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("node.log");
    let stranger = Cluster {
        kubeconfig: ctx
            .control_plane
            .kubeconfig_as("node-without-rbac", &[])
            .unwrap(),
        ..cluster
    };
    let config = stranger.config(dir.path(), &format!("neocloud-{}", ctx.namespace));
    let mut node = stranger.spawn(&sims, &config, &log);

    let status = tokio::time::timeout(Duration::from_secs(30), node.wait())
        .await
        .expect("the node did not stop within 30s")
        .unwrap();

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{status}\n{text}");
    assert!(
        text.contains(
            "clusterId: not set, and it cannot be derived from the UID of namespace kube-system"
        ),
        "{text}"
    );
    assert!(text.contains("forbidden"), "{text}");
    assert!(
        text.contains("set clusterId in the node's configuration"),
        "{text}"
    );
}
