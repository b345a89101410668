//! NVKE discovery against the management API simulator and a real API server: the workload
//! cluster is the test binary's control plane, its kubeconfig is in a Secret named by the
//! cluster's id, and the JWT in another Secret.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use neocloud_cloudsim::NvkeSim;
use neocloud_core::{FailureClass, OfferQuery};
use neocloud_kube_target::{KubeTarget, NvkeDiscovery, discover};
use neocloud_providers::Provider;
use neocloud_testenv::TestContext;
use neocloud_testenv::nodes::ready_node;
use serde_json::json;

const PRODUCT: &str = "NVIDIA-H200";

async fn secret(client: &Client, namespace: &str, name: &str, key: &str, value: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let body: Secret = serde_json::from_value(json!({
        "metadata": {"name": name}, "stringData": {key: value}
    }))
    .unwrap();
    secrets
        .patch(
            name,
            &PatchParams::apply("nvke-test").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
}

async fn h200_node(client: &Client, name: &str) {
    let labels = json!({"nvidia.com/gpu.product": PRODUCT});
    let allocatable = json!({"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"});
    ready_node(client, name, labels, allocatable).await.unwrap();
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn regions(target: &KubeTarget) -> Vec<String> {
    let query = OfferQuery {
        gpu_count: 1,
        ..OfferQuery::default()
    };
    let mut r: Vec<String> = target
        .list_offers(&query)
        .await
        .unwrap()
        .into_iter()
        .filter(|o| o.id.ends_with(PRODUCT))
        .map(|o| o.region)
        .collect();
    r.sort();
    r
}

#[tokio::test]
async fn provisioned_clusters_are_used_and_a_refused_token_makes_discovery_unhealthy() {
    let ctx = TestContext::new("nvke-discovery").await;
    let ns = ctx.namespace.clone();
    h200_node(&ctx.client, &format!("{ns}-h200")).await;
    let kubeconfig = ctx
        .control_plane
        .inline_kubeconfig_as("nvke-admin", &["system:masters"])
        .unwrap();
    // wc-ready is provisioned from the start; wc-late only after 3 s; wc-nokey never gets a
    // kubeconfig Secret.
    let sim = NvkeSim::start("jwt-first").await.unwrap();
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), sim.ca_pem()).unwrap();
    sim.add_cluster("wc-ready", "west", Duration::ZERO);
    sim.add_cluster("wc-late", "east", Duration::from_secs(3));
    sim.add_cluster("wc-nokey", "north", Duration::ZERO);
    secret(&ctx.client, &ns, "wc-ready", "kubeconfig", &kubeconfig).await;
    secret(&ctx.client, &ns, "wc-late", "kubeconfig", &kubeconfig).await;
    secret(&ctx.client, &ns, "nvke-token", "token", "jwt-first\n").await;

    let target = Arc::new(KubeTarget::start(Vec::new()));
    let cfg = NvkeDiscovery {
        url: sim.base_url(),
        ca_file: Some(ca_file.path().to_owned()),
        token_secret: "nvke-token".into(),
        token_key: "token".into(),
        namespace: ns.clone(),
        gpu_prices: BTreeMap::from([(PRODUCT.to_owned(), 3.2)]),
        surcharge_per_hour: 0.0,
        kubeconfig_key: "kubeconfig".into(),
        interval_seconds: 1,
    };
    cfg.validate().unwrap();
    discover(&target, cfg, ctx.client.clone(), ns.clone()).unwrap();

    // The provisioned cluster is used at once; the one still provisioning receives nothing.
    eventually("wc-ready offered", || async {
        regions(&target).await == ["wc-ready"]
    })
    .await;
    target.health().await.unwrap();
    let names = target.cluster_names();
    assert!(!names.contains(&"wc-late".to_owned()), "{names:?}");
    assert!(!names.contains(&"wc-nokey".to_owned()), "{names:?}");

    // Once provisioned, it receives work too.
    eventually("wc-late offered", || async {
        regions(&target).await == ["wc-late", "wc-ready"]
    })
    .await;

    // The management plane now wants another token: discovery is unhealthy and says why,
    // while the clusters already found keep serving.
    sim.set_token("jwt-rotated");
    eventually("discovery unhealthy", || async {
        target.health().await.is_err()
    })
    .await;
    let e = target.health().await.unwrap_err();
    assert_eq!(e.class, FailureClass::Auth, "{e}");
    assert!(e.message.contains("NVKE discovery"), "{e}");
    assert!(e.message.contains("401"), "{e}");
    assert!(
        !e.message.contains("jwt-"),
        "the token is never in a message: {e}"
    );
    assert_eq!(regions(&target).await, ["wc-late", "wc-ready"]);

    // The rotated token in the Secret: healthy again.
    secret(&ctx.client, &ns, "nvke-token", "token", "jwt-rotated").await;
    eventually("discovery healthy", || async {
        target.health().await.is_ok()
    })
    .await;
    let requests = sim.requests();
    assert!(requests >= 4, "{requests} listings");
    Api::<Node>::all(ctx.client.clone())
        .delete(&format!("{ns}-h200"), &Default::default())
        .await
        .unwrap();
}
