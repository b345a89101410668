//! Proves KWOK plays the kubelets of a control plane's fake GPU nodes as the `kube` provider's
//! tests need: the node is Ready with its GPUs and its lease kept fresh, a Pod bound to it runs
//! with an IP, ends with the exit code a test asks for (Succeeded for 0, Failed otherwise), can
//! be held in ErrImagePull, streams its log through the API server, and is removed once deleted.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use neocloud_testenv::kwok::{EXIT_CODE_ANNOTATION, MISSING_IMAGE, fake_gpu_node};
use neocloud_testenv::{ControlPlane, Kwok, Options};
use serde_json::json;

async fn wait<T, F>(what: &str, kwok: &Kwok, mut check: F) -> T
where
    F: AsyncFnMut() -> Option<T>,
{
    for _ in 0..300 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen; kwok:\n{}", kwok.log_tail(40));
}

async fn pod(client: &Client, name: &str, image: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "containers": [{"name": "workload", "image": image,
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref().and_then(|s| s.phase.as_deref())
}

#[tokio::test(flavor = "multi_thread")]
async fn kwok_runs_pods_on_a_fake_gpu_node_ends_them_with_exit_codes_and_serves_their_logs() {
    let cp = ControlPlane::start(Options::default()).await.unwrap();
    let client = cp.client().await.unwrap();
    let kwok = Kwok::start(&cp).await.unwrap_or_else(|e| panic!("{e}"));
    let labels = json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "2"});
    let allocatable = json!({"nvidia.com/gpu": "2", "cpu": "64", "memory": "512Gi", "pods": "110"});
    fake_gpu_node(&client, "gpu-1", labels, allocatable)
        .await
        .unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    let node = wait("the node Ready", &kwok, async || {
        let n = nodes.get("gpu-1").await.ok()?;
        let status = n.status.clone()?;
        let ready = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(n)
    })
    .await;
    let status = node.status.unwrap();
    assert_eq!(
        status.allocatable.unwrap()["nvidia.com/gpu"].0,
        "2",
        "the GPUs the test gave the node stay"
    );
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        i32::from(kwok.kubelet_port())
    );

    // Its lease is renewed, so the node monitor (grace 10 s) never taints it: checked by the
    // outcome (no taint once a renewal was seen), not by a bound on when it came, which load
    // can break.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = async || {
        let lease = leases.get_opt("gpu-1").await.ok()??;
        lease.spec?.renew_time.map(|t| t.0)
    };
    let first = wait("the node's lease", &kwok, renewed).await;
    wait("the lease renewed", &kwok, async || {
        renewed().await.filter(|t| *t > first).map(|_| ())
    })
    .await;
    let now = nodes.get("gpu-1").await.unwrap();
    let taints = now.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .all(|t| t.key != "node.kubernetes.io/unreachable"),
        "{taints:?}"
    );

    // The scheduler places a GPU Pod there; it runs with a Pod IP, then exits with 0.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait("the default ServiceAccount", &kwok, async || {
        accounts.get_opt("default").await.ok()?.map(|_| ())
    })
    .await;
    pod(&client, "ok", "registry.invalid/cuda:12").await;
    let running = wait("ok Running", &kwok, async || {
        let p = pods.get("ok").await.ok()?;
        (phase(&p) == Some("Running")).then_some(p)
    })
    .await;
    let ip = running.status.unwrap().pod_ip.unwrap();
    assert!(ip.starts_with("10.20."), "{ip}");

    kwok.write_log("2026-12-04T10:00:00.000000001Z", "step 1 loss 2.5")
        .unwrap();
    kwok.write_log("2026-12-04T10:00:01.000000001Z", "step 2 loss 1.5")
        .unwrap();
    let params = LogParams {
        tail_lines: Some(1),
        timestamps: true,
        ..LogParams::default()
    };
    let log = pods
        .logs("ok", &params)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", kwok.log_tail(40)));
    assert_eq!(log, "2026-12-04T10:00:01.000000001Z step 2 loss 1.5\n");

    let exit = |code: &str| json!({"metadata": {"annotations": {EXIT_CODE_ANNOTATION: code}}});
    pods.patch("ok", &PatchParams::default(), &Patch::Merge(&exit("0")))
        .await
        .unwrap();
    let done = wait("ok Succeeded", &kwok, async || {
        let p = pods.get("ok").await.ok()?;
        (phase(&p) == Some("Succeeded")).then_some(p)
    })
    .await;
    let terminated = |p: &Pod| {
        p.status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .map(|t| t.exit_code)
    };
    assert_eq!(terminated(&done), Some(0));

    // The next one fails with 3.
    pod(&client, "bad", "registry.invalid/cuda:12").await;
    wait("bad Running", &kwok, async || {
        let p = pods.get("bad").await.ok()?;
        (phase(&p) == Some("Running")).then_some(())
    })
    .await;
    pods.patch("bad", &PatchParams::default(), &Patch::Merge(&exit("3")))
        .await
        .unwrap();
    let failed = wait("bad Failed", &kwok, async || {
        let p = pods.get("bad").await.ok()?;
        (phase(&p) == Some("Failed")).then_some(p)
    })
    .await;
    assert_eq!(terminated(&failed), Some(3));

    // An image that cannot be pulled keeps its Pod Pending, its container waiting.
    pod(&client, "pull", MISSING_IMAGE).await;
    let waiting = wait("pull ErrImagePull", &kwok, async || {
        let p = pods.get("pull").await.ok()?;
        let s = p.status.as_ref()?.container_statuses.as_ref()?[0]
            .state
            .as_ref()?
            .waiting
            .clone()?;
        Some(s)
    })
    .await;
    assert_eq!(waiting.reason.as_deref(), Some("ErrImagePull"));
    let message = waiting.message.unwrap_or_default();
    assert!(message.contains(MISSING_IMAGE), "{message}");
    assert_eq!(phase(&pods.get("pull").await.unwrap()), Some("Pending"));

    // Deleted with a grace period, each Pod goes, as its kubelet would let it.
    for name in ["ok", "bad", "pull"] {
        pods.delete(name, &DeleteParams::default().grace_period(30))
            .await
            .unwrap();
    }
    wait("the Pods gone", &kwok, async || {
        let list = pods.list(&Default::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
}

/// The condition the scheduler put on a Pod it could not place: its message, once there is one.
fn unschedulable(p: &Pod) -> Option<String> {
    let conditions = p.status.as_ref()?.conditions.as_ref()?;
    let c = conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))?;
    Some(c.message.clone().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn fake_gpu_nodes_that_take_no_pod_keep_it_so_once_kwok_makes_them_ready() {
    let cp = ControlPlane::start(Options::default()).await.unwrap();
    let client = cp.client().await.unwrap();
    let kwok = Kwok::start(&cp).await.unwrap_or_else(|e| panic!("{e}"));
    // Many at once, as a test makes its remote cluster's nodes: each is a chance for KWOK's
    // first Ready status to be rendered from the node before its allocatable was in it.
    let names: Vec<String> = (0..12).map(|i| format!("full-{i:02}")).collect();
    let labels = json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "1"});
    let allocatable = json!({"nvidia.com/gpu": "1", "cpu": "64", "memory": "512Gi", "pods": "0"});
    let created = futures::future::join_all(
        names
            .iter()
            .map(|n| fake_gpu_node(&client, n, labels.clone(), allocatable.clone())),
    )
    .await;
    for node in created {
        node.unwrap();
    }

    // Ready and untainted: the node lifecycle controller has seen each Ready.
    let nodes: Api<Node> = Api::all(client.clone());
    wait("every node Ready and untainted", &kwok, async || {
        let list = nodes.list(&Default::default()).await.ok()?;
        let settled = list.items.iter().filter(|n| {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let tainted = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| !t.is_empty());
            ready && !tainted
        });
        (settled.count() == names.len()).then_some(())
    })
    .await;

    // A GPU Pod finds a free GPU on every node and room on none: the scheduler refuses it.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait("the default ServiceAccount", &kwok, async || {
        accounts.get_opt("default").await.ok()?.map(|_| ())
    })
    .await;
    pod(&client, "refused", "registry.invalid/cuda:12").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let said = wait("the Pod refused for every node", &kwok, async || {
        let p = pods.get("refused").await.ok()?;
        let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
        assert_eq!(
            bound, None,
            "the Pod was placed on a node that takes no Pod"
        );
        unschedulable(&p).filter(|m| m.contains(&format!("{} Too many pods", names.len())))
    })
    .await;
    eprintln!("the scheduler: {said}");

    // What KWOK wrote last is what the test gave each node.
    for node in nodes.list(&Default::default()).await.unwrap().items {
        let name = node.metadata.name.clone().unwrap_or_default();
        let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
        let pods = allocatable.get("pods").map(|q| q.0.as_str());
        assert_eq!(pods, Some("0"), "node {name}: {allocatable:?}");
    }
    let p = pods.get("refused").await.unwrap();
    assert_eq!(p.spec.and_then(|s| s.node_name), None);
}
