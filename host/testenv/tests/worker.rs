//! A real worker node in the rig: a kubelet built from the Go module proxy with Debian's
//! containerd, runc and bridge CNI, in a network namespace of its own. The node registers and
//! goes Ready with its veth address as InternalIP; a Pod bound to it runs a real container
//! from an imported image, gets an address on the node's bridge, serves its log and an exec
//! through the API server, and reaches the API server at its in-cluster Service address; and
//! once the node is dropped nothing of it is left: no process, mount, cgroup, network namespace
//! or host iptables rule, and the host sysctls the kubelet changed are restored.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{DeleteParams, LogParams, PostParams};
use kube::{Api, Client};
use neocloud_testenv::{ControlPlane, Options, WorkerNode};
use serde_json::json;

async fn wait<T>(what: &str, worker: &WorkerNode, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..600 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{what} did not happen; the node's logs:\n{}",
        worker.logs(40)
    );
}

async fn default_account(client: &Client, worker: &WorkerNode) {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait("the default ServiceAccount", worker, async || {
        accounts.get_opt("default").await.ok()?
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_on_a_real_kubelet_and_the_node_leaves_nothing_behind() {
    let cp = ControlPlane::start(Options::default()).await.unwrap();
    let client = cp.client().await.unwrap();
    let worker = WorkerNode::start(&cp, "worker-1").await.unwrap();

    let node = Api::<Node>::all(client.clone())
        .get("worker-1")
        .await
        .unwrap();
    let addresses = node.status.unwrap().addresses.unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == worker.node_ip().to_string()),
        "{addresses:?}"
    );

    worker
        .import_busybox("neocloud.invalid/busybox:1", &["/bin/sh", "-c"])
        .unwrap();
    default_account(&client, &worker).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "hello"},
        "spec": {
            "nodeName": "worker-1",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "neocloud.invalid/busybox:1",
                "imagePullPolicy": "Never",
                "args": ["echo hello from $(hostname); exec sleep 3600"]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ip = wait("the Pod Running", &worker, async || {
        let status = pods.get("hello").await.ok()?.status?;
        (status.phase.as_deref() == Some("Running")).then_some(status.pod_ip?)
    })
    .await;
    assert!(
        ip.starts_with("10.251."),
        "an address on the node's bridge: {ip}"
    );

    let log = wait("the Pod's log", &worker, async || {
        let log = pods.logs("hello", &LogParams::default()).await.ok()?;
        (!log.is_empty()).then_some(log)
    })
    .await;
    assert_eq!(log, "hello from hello\n");
    let exec = cp
        .kubectl()
        .args([
            "exec",
            "hello",
            "--",
            "/bin/sh",
            "-c",
            "echo exec $((6 * 7))",
        ])
        .output()
        .unwrap();
    assert!(
        exec.status.success(),
        "{}",
        String::from_utf8_lossy(&exec.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&exec.stdout), "exec 42\n");

    // In-cluster, as any Pod: KUBERNETES_SERVICE_HOST is a Service address kube-proxy routes
    // to the API server (whose Go TLS server answers plain HTTP with this line).
    let probe = "printf 'GET /version HTTP/1.0\\r\\n\\r\\n' | nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT";
    let answer = cp
        .kubectl()
        .args(["exec", "hello", "--", "/bin/sh", "-c", probe])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&answer.stdout);
    assert!(
        text.contains("Client sent an HTTP request to an HTTPS server"),
        "{text}\n{}\n{}",
        String::from_utf8_lossy(&answer.stderr),
        worker.logs(20)
    );

    pods.delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    wait("the Pod gone", &worker, async || {
        pods.get_opt("hello").await.ok()?.is_none().then_some(())
    })
    .await;

    // A Pod still running when the node goes is killed with it.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "left"},
        "spec": {"nodeName": "worker-1", "containers": [{"name": "main",
            "image": "neocloud.invalid/busybox:1", "imagePullPolicy": "Never",
            "args": ["exec sleep 3600"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait("the second Pod Running", &worker, async || {
        let status = pods.get("left").await.ok()?.status?;
        (status.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    // CNI pins each sandbox's namespace under /run/netns, outside the node's directory; the
    // running Pod's (and the deleted one's, until the kubelet collects its sandbox) must go too.
    let pinned: Vec<_> = worker
        .pod_netns()
        .into_iter()
        .filter(|p| p.exists())
        .collect();
    assert!(!pinned.is_empty(), "the Pods' namespaces are known");
    // A host iptables chain made while the node ran (not by it, here) is reported as left.
    let chain = format!("NCW-LEFT-{}", std::process::id());
    let iptables = |args: &[&str]| {
        let out = std::process::Command::new("iptables")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    iptables(&["-w", "-t", "filter", "-N", &chain]);
    let left = worker.leftovers_after();
    iptables(&["-w", "-t", "filter", "-X", &chain]);
    assert_eq!(
        left.0,
        vec![format!("host iptables rule iptables -t filter -N {chain}")],
        "what the worker node left"
    );
}
