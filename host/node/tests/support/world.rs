//! The reconciler on the real control plane with the three cloud simulators, as the
//! reconciler tests drive it: a node registered under the node's own RBAC identity, a
//! reconciler that can be killed and restarted with fresh in-memory state, and helpers to make
//! Pods and wait for them.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use neocloud_broker::{
    BudgetGuard, Catalog, CatalogConfig, CostLedger, DefaultFallback, LadderLimits, Planner, Renter,
};
use neocloud_cloudsim::CloudSim;
use neocloud_node::crd::{self, CloudPodBinding};
use neocloud_node::metrics::Metrics;
use neocloud_node::naming::ClusterId;
use neocloud_node::policies::PolicyRegistry;
use neocloud_node::reconcile::{Reconciler, ReconcilerConfig};
use neocloud_node::vnode::{Health, Heartbeat, NodeConfig};
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_providers::Provider;
use neocloud_testenv::TestContext;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{fast_sims, node_identity, sim_providers};

pub struct World {
    pub ctx: TestContext,
    /// The node's own client: the ClusterRole in config/rbac/role.yaml and nothing more.
    pub client: kube::Client,
    pub sims: CloudSim,
    pub node: String,
    pub renter: Renter,
    pub metrics: Arc<Metrics>,
    pub reconciler: Option<JoinHandle<()>>,
    /// The reconciler the last `start` made, for calls a test makes on it directly.
    pub current: Option<Arc<Reconciler>>,
    pub policies: Option<JoinHandle<()>>,
    pub _heartbeat: JoinHandle<()>,
    pub _health: watch::Sender<Health>,
    /// The cluster budget each (re)started reconciler enforces.
    pub cap: Option<f64>,
    /// How long a Pod with no offer or over the budget waits before planning again.
    pub retry_interval: Duration,
    /// The namespaces each (re)started reconciler serves; `None`: every one.
    pub watch_namespaces: Option<Vec<String>>,
}

pub fn providers(sims: &CloudSim) -> Vec<Arc<dyn Provider>> {
    let p = sim_providers(sims, None);
    vec![p.runpod, p.lambda, p.vast]
}

impl World {
    pub async fn new(prefix: &str) -> World {
        World::with_sims(prefix, fast_sims().await).await
    }

    /// A world over simulators started by the test.
    pub async fn with_sims(prefix: &str, sims: CloudSim) -> World {
        // The node's own log, shown with a failing test's output.
        let _ = tracing_subscriber::fmt()
            .with_env_filter("neocloud_node=debug,neocloud_broker=debug,warn")
            .with_test_writer()
            .try_init();
        let ctx = TestContext::new(prefix).await;
        crd::install(&ctx.client, "neocloud-node-tests", Duration::from_secs(30))
            .await
            .unwrap();
        let node = format!("neocloud-{}", ctx.namespace);
        let client = node_identity(&ctx).await;
        let mut cfg = NodeConfig::named(&node);
        cfg.providers = vec!["runpod".into(), "lambda".into(), "vast".into()];
        cfg.lease_renew_seconds = 2;
        let (tx, rx) = watch::channel(Health {
            healthy: true,
            message: "simulators answer".into(),
            gpus: 16,
            since: k8s_openapi::jiff::Timestamp::now(),
        });
        let hb = Heartbeat::new(client.clone(), cfg, rx);
        hb.register().await.unwrap();
        let heartbeat = tokio::spawn(hb.run());
        let catalog = Catalog::new(
            providers(&sims),
            CatalogConfig {
                ttl: Duration::from_millis(200),
                fetch_timeout: Duration::from_secs(10),
            },
        );
        let renter = Renter {
            catalog,
            fallback: Arc::new(DefaultFallback::default()),
            limits: LadderLimits::default(),
            budget: BudgetGuard::new(None),
            ledger: Arc::new(CostLedger::new()),
        };
        let mut world = World {
            ctx,
            client,
            sims,
            node,
            renter,
            metrics: Arc::new(Metrics::new()),
            reconciler: None,
            current: None,
            policies: None,
            _heartbeat: heartbeat,
            _health: tx,
            cap: None,
            retry_interval: Duration::from_secs(1),
            watch_namespaces: None,
        };
        world.start();
        world
    }

    /// Starts (or restarts) the reconciler with fresh in-memory state, as a new process would.
    pub fn start(&mut self) {
        let mut cfg = ReconcilerConfig::new(&self.node, ClusterId::new("test").unwrap());
        cfg.poll_interval = Duration::from_millis(300);
        cfg.running_poll_interval = Duration::from_millis(300);
        cfg.retry_interval = self.retry_interval;
        cfg.release_poll = Duration::from_millis(200);
        cfg.watch_namespaces = self.watch_namespaces.clone();
        let renter = Renter {
            budget: BudgetGuard::new(self.cap),
            ledger: Arc::new(CostLedger::new()),
            ..self.renter.clone()
        };
        self.renter.budget = Arc::clone(&renter.budget);
        self.renter.ledger = Arc::clone(&renter.ledger);
        let cel = Arc::new(CelEngine::new(CelLimits::default()));
        let registry = PolicyRegistry::new(
            self.client.clone(),
            Arc::clone(&cel),
            super::wasm_engine(),
            policies_dir(),
            Arc::clone(&self.metrics),
        );
        let policies = tokio::spawn(Arc::clone(&registry).run());
        let r = Reconciler::new(
            self.client.clone(),
            cfg,
            Planner::default(),
            renter,
            cel,
            Arc::clone(&self.metrics),
            Some(registry),
        );
        self.policies = Some(policies);
        self.current = Some(Arc::clone(&r));
        self.reconciler = Some(tokio::spawn(r.run(None)));
    }

    /// Kills the reconciler wherever it is.
    pub async fn kill(&mut self) {
        for task in [self.reconciler.take(), self.policies.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
            let _ = task.await;
        }
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
    }

    pub fn bindings(&self) -> Api<CloudPodBinding> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
    }

    pub async fn create_pod(&self, name: &str, annotations: serde_json::Value) -> Pod {
        self.create_pod_restarting(name, annotations, "Never").await
    }

    pub async fn create_pod_restarting(
        &self,
        name: &str,
        annotations: serde_json::Value,
        restart_policy: &str,
    ) -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "nodeName": self.node,
                "restartPolicy": restart_policy,
                "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    pub async fn wait_pod(&self, name: &str, what: &str, f: impl Fn(&Pod) -> bool) -> Pod {
        for _ in 0..600 {
            if let Some(p) = self.pods().get_opt(name).await.unwrap()
                && f(&p)
            {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let now = self.pods().get_opt(name).await.unwrap();
        let binding = self.bindings().get_opt(name).await.unwrap();
        panic!(
            "timed out waiting for pod {name} to be {what}; it is {:?}\nits binding: {:?}",
            now.and_then(|p| p.status),
            binding.and_then(|b| b.status)
        );
    }

    pub async fn wait_gone(&self, name: &str) {
        for _ in 0..600 {
            let pod = self.pods().get_opt(name).await.unwrap();
            let binding = self.bindings().get_opt(name).await.unwrap();
            if pod.is_none() && binding.is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("pod {name} or its binding was never removed");
    }

    pub async fn binding(&self, name: &str) -> CloudPodBinding {
        self.bindings().get(name).await.unwrap()
    }

    pub async fn events(&self, pod: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace);
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(pod))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }
}

pub fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref().and_then(|s| s.phase.as_deref())
}

pub fn reason(p: &Pod) -> Option<&str> {
    p.status.as_ref().and_then(|s| s.reason.as_deref())
}

pub fn running(p: &Pod) -> bool {
    phase(p) == Some("Running")
}

/// The guest policies' build directory (`make policies`): the registry's `policies.wasmDir`.
pub fn policies_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/build");
    dir.canonicalize().unwrap_or(dir)
}
