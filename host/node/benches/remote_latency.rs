//! What the node adds between a local Pod's create and its remote Pod's create on another
//! cluster (the `kube` provider), beside the same Pods created on the remote cluster directly.
//!
//! Two real control planes on loopback: the local one (the reconciler, as the tests run it) and
//! a remote one with 80 GPU nodes of 8 GPUs (room for every round). A watch on the remote
//! namespace stamps each remote Pod's arrival. First `REMOTE_LATENCY_PODS` (200) Pods are
//! created directly on the remote cluster, one after another, timed from the call to the watch
//! event; then as many local Pods through the node, one at a time (each waits for its remote
//! Pod: the latency the node adds), and as many again in a burst (created back to back: the
//! latency with the node's queue).
//!
//! ```sh
//! cargo bench -p neocloud-node --bench remote_latency
//! ```

#![allow(clippy::print_stdout, reason = "a benchmark binary reports on stdout")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use neocloud_broker::{Catalog, CatalogConfig};
use neocloud_kube_target::{KubeTarget, KubeconfigSource, RemoteCluster};
use neocloud_providers::Provider;
use neocloud_testenv::nodes::ready_node;
use neocloud_testenv::{ControlPlane, Options};
use parking_lot::Mutex;
use serde_json::json;

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;
use support::world::World;

const PRODUCT: &str = "NVIDIA-A100-SXM4-80GB";
const REMOTE_NS: &str = "burst";

type Seen = Arc<Mutex<HashMap<String, Instant>>>;

async fn prepare_remote(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [REMOTE_NS, "direct"] {
        let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        namespaces
            .create(&PostParams::default(), &body)
            .await
            .unwrap();
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        while accounts.get_opt("default").await.unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for i in 0..80 {
        let labels = json!({"nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.memory": "81920"});
        let allocatable =
            json!({"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"});
        ready_node(client, &format!("gpu-{i:02}"), labels, allocatable)
            .await
            .unwrap();
    }
}

/// Stamps the first sight of every Pod created in `namespace` of the remote cluster.
fn stamp_arrivals(client: Client, namespace: &str) -> Seen {
    let seen = Seen::default();
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let out = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = event
                && let Some(name) = p.metadata.name
            {
                out.lock().entry(name).or_insert_with(Instant::now);
            }
        }
    });
    seen
}

async fn wait_for(seen: &Seen, names: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let missing = names
            .iter()
            .filter(|n| !seen.lock().contains_key(*n))
            .count();
        if missing == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} remote Pods never appeared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(what: &str, mut latencies: Vec<Duration>, total: Duration) {
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what}: {} Pods in {:.1} s, create-to-remote-Pod p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        total.as_secs_f64(),
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(*latencies.last().unwrap()),
    );
}

fn main() {
    let count: usize = std::env::var("REMOTE_LATENCY_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(count));
}

async fn run(count: usize) {
    let mut world = World::new("remote-latency").await;
    let second = ControlPlane::start(Options::default()).await.unwrap();
    let remote_client = second.client().await.unwrap();
    prepare_remote(&remote_client).await;
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
    let query = neocloud_core::OfferQuery {
        gpu_count: 1,
        ..Default::default()
    };
    // Settled: the node lifecycle controller untaints new nodes once it has seen them Ready.
    while kube
        .list_offers(&query)
        .await
        .unwrap_or_default()
        .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    world.renter.catalog = Catalog::new(
        vec![kube as Arc<dyn Provider>],
        CatalogConfig {
            ttl: Duration::from_millis(200),
            fetch_timeout: Duration::from_secs(10),
        },
    );
    world.kill().await;
    world.start();

    // Directly on the remote cluster, the same spec, one after another.
    let direct_seen = stamp_arrivals(remote_client.clone(), "direct");
    let direct: Api<Pod> = Api::namespaced(remote_client.clone(), "direct");
    let mut direct_starts = Vec::with_capacity(count);
    let started = Instant::now();
    for i in 0..count {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("direct-{i:04}")},
            "spec": {"restartPolicy": "Never",
                "nodeSelector": {"nvidia.com/gpu.product": PRODUCT},
                "containers": [{"name": "workload", "image": "registry.invalid/cuda:12",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .unwrap();
        direct_starts.push((format!("direct-{i:04}"), Instant::now()));
        direct.create(&PostParams::default(), &pod).await.unwrap();
    }
    let names: Vec<String> = direct_starts.iter().map(|(n, _)| n.clone()).collect();
    wait_for(&direct_seen, &names).await;
    let direct_total = started.elapsed();
    let seen = direct_seen.lock().clone();
    let latencies = direct_starts
        .iter()
        .map(|(n, t)| seen[n].saturating_duration_since(*t))
        .collect();
    report("direct on the remote cluster", latencies, direct_total);

    // Through the node: local Pods whose remote Pods are named by the external name,
    // `ncn-test-<local Pod uid>`; one at a time, then a burst.
    let node_seen = stamp_arrivals(remote_client.clone(), REMOTE_NS);
    for (round, wait_each) in [("one at a time", true), ("in a burst", false)] {
        let pods = world.pods();
        let mut node_starts = Vec::with_capacity(count);
        let started = Instant::now();
        for i in 0..count {
            let name = format!("job-{}-{i:04}", if wait_each { "seq" } else { "burst" });
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name,
                    "annotations": {"cloud.aibrix.ai/gpu-type": "A100"}},
                "spec": {"nodeName": world.node, "restartPolicy": "Never",
                    "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                    "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
            }))
            .unwrap();
            let at = Instant::now();
            let created = pods.create(&PostParams::default(), &pod).await.unwrap();
            let remote_name = format!("ncn-test-{}", created.metadata.uid.unwrap());
            if wait_each {
                wait_for(&node_seen, std::slice::from_ref(&remote_name)).await;
            }
            node_starts.push((remote_name, at));
        }
        let names: Vec<String> = node_starts.iter().map(|(n, _)| n.clone()).collect();
        wait_for(&node_seen, &names).await;
        let node_total = started.elapsed();
        let seen = node_seen.lock().clone();
        let latencies = node_starts
            .iter()
            .map(|(n, t)| seen[n].saturating_duration_since(*t))
            .collect();
        report(
            &format!("through NeoCloud Node, {round}"),
            latencies,
            node_total,
        );
    }
    second.stop();
}
