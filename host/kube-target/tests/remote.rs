//! The `kube` provider against a real API server standing in for the remote cluster (the test
//! binary's control plane, with its scheduler and controller manager). Its GPU nodes are Node
//! objects with `nvidia.com/gpu` allocatable and GPU feature discovery labels; as no kubelet runs
//! for them, the tests write the remote Pods' status themselves where a kubelet would.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use neocloud_core::{
    FailureClass, GpuModel, InstancePhase, Offer, OfferCapacity, OfferQuery, ProviderId,
};
use neocloud_kube_target::config::validate;
use neocloud_kube_target::{KubeTarget, KubeconfigSource, RemoteCluster};
use neocloud_kubelet::{
    KubeAccessReview, KubeletConfig, KubeletServer, LogError, PodRef, Workloads,
};
use neocloud_providers::{CreateRequest, LogRequest, Provider};
use neocloud_remote::callback::LogOptions;
use neocloud_remote::tls::TlsMaterial;
use neocloud_testenv::TestContext;
use neocloud_testenv::nodes::ready_node;
use serde_json::json;
use std::sync::Arc;

fn cluster(name: &str, namespace: &str, prices: &[(&str, f64)]) -> RemoteCluster {
    let c = RemoteCluster {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        kubeconfig: KubeconfigSource {
            secret: Some(format!("{name}-kubeconfig")),
            key: None,
            path: None,
        },
        gpu_prices: prices.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        surcharge_per_hour: 0.1,
        allow_insecure_skip_tls_verify: false,
    };
    validate(std::slice::from_ref(&c), "remoteClusters").expect("valid cluster");
    c
}

/// A Ready GPU node with `gpus` allocatable GPUs of `product`, as GPU feature discovery labels it.
async fn gpu_node(client: &Client, name: &str, product: &str, gpus: u32) {
    gpu_node_holding(client, name, product, gpus, 110).await;
}

/// [`gpu_node`] that holds at most `pods` Pods, whatever its GPUs.
async fn gpu_node_holding(client: &Client, name: &str, product: &str, gpus: u32, pods: u32) {
    let labels = json!({
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": gpus.to_string(),
    });
    let allocatable = json!({"nvidia.com/gpu": gpus.to_string(), "cpu": "64",
        "memory": "512Gi", "pods": pods.to_string()});
    ready_node(client, name, labels, allocatable).await.unwrap();
}

fn request(external_name: &str, offer: &Offer) -> CreateRequest {
    let mut workload = neocloud_fixtures::workload();
    workload.image = "ghcr.io/acme/train:1".into();
    workload.command = vec!["python".into(), "train.py".into()];
    workload.gpu.count = offer.gpu_count;
    CreateRequest {
        external_name: external_name.to_owned(),
        offer: offer.clone(),
        workload,
        env: vec![
            ("HF_TOKEN".into(), "hf_do_not_leak_7f3a".into()),
            ("EPOCHS".into(), "3".into()),
        ],
        bid_per_hour: None,
        boot: None,
        registry_login: None,
    }
}

fn query(gpus: u32) -> OfferQuery {
    OfferQuery {
        gpu_count: gpus,
        ..OfferQuery::default()
    }
}

/// Polls `check` every 100 ms for up to 30 s.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..300 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn offers_of(target: &KubeTarget, product: &str, gpus: u32) -> Vec<Offer> {
    target
        .list_offers(&query(gpus))
        .await
        .unwrap()
        .into_iter()
        .filter(|o| o.id.ends_with(product))
        .collect()
}

#[tokio::test]
async fn a_rental_is_one_remote_pod_whose_status_reads_as_the_instance_and_whose_delete_cleans_up()
{
    let ctx = TestContext::new("kube-target-rental").await;
    let product = "NVIDIA-A100-SXM4-80GB";
    let node = format!("{}-a100", ctx.namespace);
    gpu_node(&ctx.client, &node, product, 2).await;
    let target = KubeTarget::start(vec![(
        cluster("gpu-west", &ctx.namespace, &[(product, 1.5)]),
        ctx.client.clone(),
    )]);

    // Offers: the node's two free GPUs, priced by the table plus the surcharge.
    let offer = eventually("an A100 offer", || async {
        offers_of(&target, product, 2).await.into_iter().next()
    })
    .await;
    assert_eq!(offer.provider, ProviderId::Kube);
    assert_eq!(offer.id, format!("gpu-west/{product}"));
    assert_eq!(offer.region, "gpu-west");
    assert_eq!(offer.gpu, GpuModel::from_provider("A100 SXM 80GB", None));
    assert!((offer.price_per_hour - 3.1).abs() < 1e-9, "{offer:?}");
    assert_eq!(offer.capacity, OfferCapacity::OnDemand);
    assert!(offers_of(&target, product, 3).await.is_empty());

    // A rental: one Pod and its Secret; the environment's values only in the Secret.
    let name = "nc-test-0001";
    let rented = target.create(&request(name, &offer)).await.unwrap();
    assert_eq!(rented.id, format!("gpu-west/{name}"));
    assert_eq!(rented.gpu_count, 2);
    assert!((rented.price_per_hour - 3.1).abs() < 1e-9);
    let pods: Api<Pod> = ctx.namespaced();
    let secrets: Api<Secret> = ctx.namespaced();
    let pod = pods.get(name).await.unwrap();
    let spec_text = serde_json::to_string(&pod.spec).unwrap();
    assert!(!spec_text.contains("hf_do_not_leak_7f3a"), "{spec_text}");
    assert!(spec_text.contains("HF_TOKEN"));
    let secret = secrets.get(&format!("{name}-env")).await.unwrap();
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", pod.metadata.uid.as_deref().unwrap())
    );
    assert_eq!(
        secret.data.as_ref().unwrap()["env-0"].0,
        b"hf_do_not_leak_7f3a".to_vec()
    );

    // Idempotent by name: the same rental again is the same Pod, nothing new.
    let again = target.create(&request(name, &offer)).await.unwrap();
    assert_eq!(again.id, rented.id);
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    // The remote scheduler binds it to the GPU node, and the node's GPUs are no longer offered.
    let bound = eventually("the remote Pod bound", || async {
        let p = pods.get(name).await.ok()?;
        p.spec.as_ref()?.node_name.clone()
    })
    .await;
    assert_eq!(bound, node);
    eventually("the A100s no longer offered", || async {
        offers_of(&target, product, 1)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let starting = target.get(&rented.id).await.unwrap().unwrap();
    assert_eq!(starting.phase, InstancePhase::Starting);

    // A second rental of the same GPUs is refused for capacity, and creates nothing.
    let e = target
        .create(&request("nc-test-0002", &offer))
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Capacity, "{e}");
    assert!(pods.get_opt("nc-test-0002").await.unwrap().is_none());
    assert!(secrets.get_opt("nc-test-0002-env").await.unwrap().is_none());

    // What a kubelet would write: Running with an address, then the exit code.
    let status = |s: serde_json::Value| {
        let pods = pods.clone();
        async move {
            pods.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": s})),
            )
            .await
            .unwrap();
        }
    };
    status(json!({"phase": "Running", "podIP": "10.20.0.7"})).await;
    let running = target.get(&rented.id).await.unwrap().unwrap();
    assert_eq!(
        (running.phase, running.public_ip.as_deref()),
        (InstancePhase::Running, Some("10.20.0.7"))
    );
    status(json!({"phase": "Failed", "containerStatuses": [{
        "name": "workload", "ready": false, "restartCount": 0, "image": "ghcr.io/acme/train:1",
        "imageID": "", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}))
    .await;
    let failed = target.get(&rented.id).await.unwrap().unwrap();
    assert_eq!(failed.phase, InstancePhase::Failed);
    assert_eq!(
        failed.message.as_deref(),
        Some("the workload exited with code 3 (Error)")
    );

    // Listed under our prefix, found by name; deleted with its Secret; deleting again is fine.
    let ours = target.list_ours("nc-test-").await.unwrap();
    assert_eq!(
        ours.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        [rented.id.as_str()]
    );
    assert!(target.list_ours("nc-other-").await.unwrap().is_empty());
    assert_eq!(
        target.find_by_name(name).await.unwrap().unwrap().id,
        rented.id
    );
    target.delete(&rented.id).await.unwrap();
    eventually("the remote Pod gone", || async {
        pods.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(
        secrets
            .get_opt(&format!("{name}-env"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(target.get(&rented.id).await.unwrap().is_none());
    target.delete(&rented.id).await.unwrap();

    // The GPUs are offered again once the Pod is gone.
    eventually("the A100s offered again", || async {
        (!offers_of(&target, product, 2).await.is_empty()).then_some(())
    })
    .await;
    Api::<Node>::all(ctx.client.clone())
        .delete(&node, &Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_ids_and_unknown_clusters_are_refused_naming_the_value() {
    let ctx = TestContext::new("kube-target-bad-input").await;
    let target = KubeTarget::start(vec![(
        cluster("gpu-east", &ctx.namespace, &[("NVIDIA-L4", 0.4)]),
        ctx.client.clone(),
    )]);
    let mut offer = neocloud_fixtures::offer(ProviderId::Kube, "no-slash", "L4", 0.4);
    let e = target
        .create(&request("nc-bad-0001", &offer))
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::InvalidRequest);
    assert!(e.message.contains("\"no-slash\""), "{e}");
    offer.id = "gpu-north/NVIDIA-L4".into();
    let e = target
        .create(&request("nc-bad-0001", &offer))
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::InvalidRequest);
    assert!(e.message.contains("\"gpu-north\""), "{e}");
    for id in ["nope", "gpu-east/a/b"] {
        let e = target.get(id).await.unwrap_err();
        assert!(e.message.contains(&format!("{id:?}")), "{e}");
    }
    let e = target.delete("gpu-north/x").await.unwrap_err();
    assert_eq!(e.class, FailureClass::InvalidRequest);
    let pods: Api<Pod> = ctx.namespaced();
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn a_cluster_that_refuses_us_or_does_not_answer_is_left_out_and_the_others_serve() {
    let ctx = TestContext::new("kube-target-health").await;
    let product = "NVIDIA-H100-80GB-HBM3";
    let node = format!("{}-h100", ctx.namespace);
    gpu_node(&ctx.client, &node, product, 1).await;
    // A user with no RBAC at all: authenticated, refused everything.
    let refused = ctx.control_plane.client_as("no-rights", &[]).await.unwrap();
    let mut unreachable = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
    unreachable.connect_timeout = Some(Duration::from_millis(500));
    let unreachable = Client::try_from(unreachable).unwrap();
    let prices = [(product, 2.5)];

    let alone = KubeTarget::start(vec![(
        cluster("denied", &ctx.namespace, &prices),
        refused.clone(),
    )]);
    let e = alone.health().await.unwrap_err();
    assert_eq!(e.class, FailureClass::Auth, "{e}");
    assert!(e.message.contains("remote cluster denied"), "{e}");
    assert!(alone.list_offers(&query(1)).await.unwrap().is_empty());

    let mixed = KubeTarget::start(vec![
        (cluster("denied", &ctx.namespace, &prices), refused),
        (cluster("gone", &ctx.namespace, &prices), unreachable),
        (cluster("good", &ctx.namespace, &prices), ctx.client.clone()),
    ]);
    mixed.health().await.unwrap();
    let offers = eventually("offers from the good cluster", || async {
        let o = offers_of(&mixed, product, 1).await;
        (!o.is_empty()).then_some(o)
    })
    .await;
    let regions: BTreeMap<&str, usize> = offers.iter().fold(BTreeMap::new(), |mut m, o| {
        *m.entry(o.region.as_str()).or_default() += 1;
        m
    });
    assert_eq!(regions, BTreeMap::from([("good", 1)]));
    let mut offer = offers[0].clone();
    offer.id = format!("gone/{product}");
    let e = mixed
        .create(&request("nc-gone-0001", &offer))
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Transient, "{e}");
    Api::<Node>::all(ctx.client.clone())
        .delete(&node, &Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_pod_the_remote_scheduler_refuses_fails_for_capacity_and_leaves_nothing() {
    let ctx = TestContext::new("kube-target-unschedulable").await;
    let product = "NVIDIA-L40S";
    let node = format!("{}-l40s", ctx.namespace);
    // Free GPUs as the watches count them, but no room for another Pod: the scheduler refuses.
    gpu_node_holding(&ctx.client, &node, product, 4, 0).await;
    let target = KubeTarget::start(vec![(
        cluster("gpu-south", &ctx.namespace, &[(product, 0.9)]),
        ctx.client.clone(),
    )]);
    let offer = eventually("an L40S offer", || async {
        offers_of(&target, product, 1).await.into_iter().next()
    })
    .await;
    let e = target
        .create(&request("nc-full-0001", &offer))
        .await
        .unwrap_err();
    assert_eq!(e.class, FailureClass::Capacity, "{e}");
    assert!(e.message.contains("cannot schedule"), "{e}");
    let pods: Api<Pod> = ctx.namespaced();
    let secrets: Api<Secret> = ctx.namespaced();
    eventually("the refused Pod gone", || async {
        pods.get_opt("nc-full-0001")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(secrets.get_opt("nc-full-0001-env").await.unwrap().is_none());
    Api::<Node>::all(ctx.client.clone())
        .delete(&node, &Default::default())
        .await
        .unwrap();
}

/// The remote node's kubelet, for logs: the kubelet API server of `neocloud-kubelet` (the one the
/// node itself serves) with a log source that answers a fixed text and records what it was
/// asked. The remote API server reaches it with its kubelet client certificate.
#[derive(Default)]
struct RemoteKubeletLogs {
    asked: std::sync::Mutex<Vec<(String, String, LogOptions)>>,
}

#[async_trait::async_trait]
impl Workloads for RemoteKubeletLogs {
    async fn logs(
        &self,
        pod: &PodRef,
        container: &str,
        opts: LogOptions,
    ) -> Result<futures::stream::BoxStream<'static, bytes::Bytes>, LogError> {
        self.asked
            .lock()
            .unwrap()
            .push((pod.name.clone(), container.to_owned(), opts));
        let lines = ["epoch 1 loss 0.9\n", "epoch 2 loss 0.5\n"];
        Ok(futures::stream::iter(lines.map(|l| bytes::Bytes::from_static(l.as_bytes()))).boxed())
    }
}

#[tokio::test]
async fn a_remote_pod_s_log_is_read_through_the_remote_api_server_with_the_options_asked() {
    let ctx = TestContext::new("kube-target-logs").await;
    let product = "NVIDIA-B200";
    let node = format!("{}-b200", ctx.namespace);
    let source = Arc::new(RemoteKubeletLogs::default());
    let mut config = KubeletConfig::new(&node);
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.client_ca_pem = Some(ctx.control_plane.ca_pem());
    let tls = TlsMaterial::self_signed(&[node.clone(), "127.0.0.1".into()]).unwrap();
    let reviews = Arc::new(KubeAccessReview::new(ctx.client.clone()));
    let kubelet = KubeletServer::start(config, &tls, reviews, source.clone())
        .await
        .unwrap();
    gpu_node(&ctx.client, &node, product, 1).await;
    let endpoint = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.local_addr().port()}}
    }});
    Api::<Node>::all(ctx.client.clone())
        .patch_status(&node, &PatchParams::default(), &Patch::Merge(&endpoint))
        .await
        .unwrap();
    let target = KubeTarget::start(vec![(
        cluster("gpu-logs", &ctx.namespace, &[(product, 4.0)]),
        ctx.client.clone(),
    )]);
    let offer = eventually("a B200 offer", || async {
        offers_of(&target, product, 1).await.into_iter().next()
    })
    .await;
    let rented = target
        .create(&request("nc-logs-0001", &offer))
        .await
        .unwrap();
    let pods: Api<Pod> = ctx.namespaced();
    eventually("the remote Pod bound", || async {
        pods.get("nc-logs-0001").await.ok()?.spec?.node_name
    })
    .await;

    let asked = LogRequest {
        tail_lines: Some(2),
        timestamps: true,
        ..LogRequest::default()
    };
    let stream = target
        .logs(&rented.id, &asked)
        .await
        .unwrap()
        .expect("a log API");
    let chunks: Vec<_> = stream.collect().await;
    let text: String = chunks
        .into_iter()
        .map(|c| String::from_utf8(c.unwrap().to_vec()).unwrap())
        .collect();
    assert_eq!(text, "epoch 1 loss 0.9\nepoch 2 loss 0.5\n");
    let seen = source.asked.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (pod, container, opts) = &seen[0];
    assert_eq!(
        (pod.as_str(), container.as_str()),
        ("nc-logs-0001", "workload")
    );
    assert_eq!(
        (opts.tail_lines, opts.timestamps, opts.follow),
        (Some(2), true, false)
    );

    // An instance the cluster does not have: the remote API server's 404, as an error.
    let e = match target.logs("gpu-logs/nc-logs-none", &asked).await {
        Err(e) => e,
        Ok(_) => panic!("a log for a Pod that does not exist"),
    };
    assert!(e.message.contains("nc-logs-none"), "{e}");
    target.delete(&rented.id).await.unwrap();
    Api::<Node>::all(ctx.client.clone())
        .delete(&node, &Default::default())
        .await
        .unwrap();
}
