//! The virtual node on a real control plane, as its own identity under NodeRestriction: it
//! registers with its labels, taint and GPU capacity, the scheduler places tolerating GPU Pods on
//! it within that capacity, its status leaves others' conditions and taints alone, and when its
//! providers turn unhealthy it stops its Lease and the controller manager taints it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use neocloud_node::vnode::{Health, Heartbeat, NodeConfig};
use neocloud_testenv::TestContext;
use serde_json::json;
use tokio::sync::watch;

async fn eventually<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> Fut,
) -> T {
    for _ in 0..600 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out after 60s waiting for {what}");
}

fn healthy(gpus: u32) -> Health {
    Health {
        healthy: true,
        message: "runpod answers".into(),
        gpus,
        since: Timestamp::now(),
    }
}

async fn start_node(ctx: &TestContext, name: &str) -> (Heartbeat, watch::Sender<Health>) {
    let user = format!("system:node:{name}");
    let client = ctx
        .control_plane
        .client_as(&user, &["system:nodes"])
        .await
        .unwrap();
    let mut cfg = NodeConfig::named(name);
    cfg.providers = vec!["runpod".into()];
    cfg.max_gpus = 4;
    cfg.lease_renew_seconds = 1;
    let (tx, rx) = watch::channel(healthy(16));
    let hb = Heartbeat::new(client, cfg, rx);
    hb.register().await.unwrap();
    assert!(hb.beat().await.unwrap(), "a healthy beat renews the lease");
    (hb, tx)
}

fn gpu_pod(name: &str, node: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn the_node_registers_as_itself_and_takes_gpu_pods_within_its_capacity() {
    let ctx = TestContext::new("vnode-register").await;
    let name = format!("neocloud-{}", ctx.namespace);
    let (hb, _tx) = start_node(&ctx, &name).await;
    let beating = tokio::spawn(hb.run());
    let node = Api::<Node>::all(ctx.client.clone())
        .get(&name)
        .await
        .unwrap();
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels["type"], "virtual-kubelet");
    assert_eq!(labels["cloud.aibrix.ai/provider-runpod"], "true");
    let taints = node.spec.unwrap().taints.unwrap();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "virtual-kubelet.io/provider" && t.effect == "NoSchedule")
    );
    let status = node.status.unwrap();
    assert_eq!(
        status.allocatable.unwrap()["nvidia.com/gpu"].0,
        "4",
        "capped by max_gpus"
    );
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        10250
    );
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-node-lease");
    let lease = leases.get(&name).await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some(name.as_str()));

    let pods: Api<Pod> = ctx.namespaced();
    pods.create(&PostParams::default(), &gpu_pod("fits", &name, 2))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &gpu_pod("too-big", &name, 8))
        .await
        .unwrap();
    let mut intolerant = gpu_pod("intolerant", &name, 1);
    intolerant.spec.as_mut().unwrap().tolerations = None;
    pods.create(&PostParams::default(), &intolerant)
        .await
        .unwrap();
    let bound = eventually("the fitting pod to be bound", || async {
        pods.get("fits").await.ok()?.spec?.node_name
    })
    .await;
    assert_eq!(bound, name);
    let events: Api<Event> = ctx.namespaced();
    let lp = ListParams::default().fields("involvedObject.name=too-big");
    let msg = eventually("FailedScheduling for lack of GPUs", || async {
        let list = events.list(&lp).await.ok()?.items;
        let failed = list
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("FailedScheduling"));
        failed
            .filter_map(|e| e.message)
            .find(|m| m.contains("Insufficient nvidia.com/gpu"))
    })
    .await;
    assert!(msg.contains("Insufficient nvidia.com/gpu"), "{msg}");
    let lp = ListParams::default().fields("involvedObject.name=intolerant");
    let msg = eventually("FailedScheduling for the untolerated taint", || async {
        let list = events.list(&lp).await.ok()?.items;
        list.into_iter()
            .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .filter_map(|e| e.message)
            .find(|m| m.contains("untolerated taint"))
    })
    .await;
    assert!(msg.contains("had untolerated taint"), "{msg}");
    let intolerant = pods.get("intolerant").await.unwrap();
    assert_eq!(intolerant.spec.unwrap().node_name, None);
    beating.abort();
    Api::<Node>::all(ctx.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_node_keeps_conditions_and_taints_written_by_others() {
    let ctx = TestContext::new("vnode-others").await;
    let name = format!("neocloud-{}", ctx.namespace);
    let (hb, _tx) = start_node(&ctx, &name).await;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let now = Timestamp::now();
    let theirs = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"conditions": [{"type": "GpuDriftDetected", "status": "False",
            "reason": "NoDrift", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    let pp = PatchParams::apply("gpu-drift-detector").force();
    nodes
        .patch_status(&name, &pp, &Patch::Apply(&theirs))
        .await
        .unwrap();
    let taint = json!({"spec": {"taints": [
        {"key": "virtual-kubelet.io/provider", "value": "neocloud", "effect": "NoSchedule"},
        {"key": "example.com/maintenance", "effect": "NoSchedule"}]}});
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .unwrap();

    hb.register().await.unwrap();
    hb.beat().await.unwrap();
    let node = nodes.get(&name).await.unwrap();
    let conditions = node.status.unwrap().conditions.unwrap();
    let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
    assert!(
        types.contains(&"GpuDriftDetected") && types.contains(&"Ready"),
        "{types:?}"
    );
    let keys: Vec<String> = node
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert!(
        keys.contains(&"example.com/maintenance".to_owned()),
        "{keys:?}"
    );
    assert_eq!(
        keys.iter()
            .filter(|k| *k == "virtual-kubelet.io/provider")
            .count(),
        1
    );
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn unhealthy_providers_stop_the_lease_and_the_controller_manager_taints_the_node() {
    let ctx = TestContext::new("vnode-unhealthy").await;
    let name = format!("neocloud-{}", ctx.namespace);
    let (hb, tx) = start_node(&ctx, &name).await;
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-node-lease");
    let before = leases
        .get(&name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap();

    tx.send(Health {
        healthy: false,
        message: "every provider refused our key".into(),
        gpus: 0,
        since: Timestamp::now(),
    })
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        !hb.beat().await.unwrap(),
        "an unhealthy beat must not renew the lease"
    );
    let after = leases
        .get(&name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap();
    assert_eq!(before, after, "the lease was renewed while unhealthy");

    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let ready = nodes
        .get(&name)
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap();
    let ready = ready.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(
        ready.message.as_deref(),
        Some("every provider refused our key")
    );
    let taint = eventually("the controller manager to taint the node", || async {
        let taints = nodes.get(&name).await.ok()?.spec?.taints?;
        taints
            .into_iter()
            .find(|t| t.key.starts_with("node.kubernetes.io/"))
    })
    .await;
    assert!(
        [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable"
        ]
        .contains(&taint.key.as_str()),
        "{taint:?}"
    );
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
}
