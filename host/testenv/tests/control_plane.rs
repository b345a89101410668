//! Proves the test rig is a real control plane: CRD schemas are enforced, the scheduler honours
//! taints, the controller manager finishes namespace deletion, watches stream their initial list,
//! and node identities are confined by the Node authorizer and NodeRestriction.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client};
use neocloud_testenv::TestContext;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn widget_crd(group: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object",
                        "required": ["gpus"],
                        "properties": {"gpus": {"type": "integer", "minimum": 1, "maximum": 8}}
                    }}
                }}
            }]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn a_crd_is_served_and_its_schema_rejects_an_invalid_object() {
    let ctx = TestContext::new("crd-schema").await;
    let group = format!("{}.testenv.neocloud.dev", ctx.namespace);
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    crds.create(&PostParams::default(), &widget_crd(&group))
        .await
        .unwrap();
    let name = format!("widgets.{group}");
    eventually("the CRD to be Established", || async {
        let crd = crds.get(&name).await.ok()?;
        let conds = crd.status?.conditions?;
        conds
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;

    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let widgets: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &ctx.namespace,
        &ApiResource::from_gvk(&gvk),
    );
    let widget = |name: &str, gpus: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": format!("{group}/v1"), "kind": "Widget",
            "metadata": {"name": name}, "spec": {"gpus": gpus}
        }))
        .unwrap()
    };
    let ok = eventually("the new resource to be served", || async {
        widgets
            .create(&PostParams::default(), &widget("good", json!(2)))
            .await
            .ok()
    })
    .await;
    assert_eq!(ok.data["spec"]["gpus"], 2);

    let err = widgets
        .create(&PostParams::default(), &widget("bad", json!(64)))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains("spec.gpus"), "{}", status.message);
    let err = widgets
        .create(&PostParams::default(), &widget("worse", json!("many")))
        .await;
    assert!(
        matches!(err, Err(kube::Error::Api(ref s)) if s.code == 422),
        "{err:?}"
    );
}

fn tainted_node(name: &str, taint_key: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "type": "virtual-kubelet"}},
        "spec": {"taints": [{"key": taint_key, "value": "neocloud", "effect": "NoSchedule"}]}
    }))
    .unwrap()
}

/// Marks a node Ready with allocatable capacity and renews its Lease, as a kubelet would.
async fn heartbeat(client: &Client, name: &str) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let status = json!({"status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "10"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "10"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "test heartbeat", "lastHeartbeatTime": now, "lastTransitionTime": now}]
    }});
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
            "renewTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}
    });
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let pp = PatchParams::apply("neocloud-testenv").force();
    leases
        .patch(name, &pp, &Patch::Apply(&lease))
        .await
        .unwrap();
}

fn pod_for(name: &str, node: &str, toleration_key: Option<&str>) -> Pod {
    let tolerations: Vec<_> = toleration_key
        .map(|k| json!({"key": k, "operator": "Exists", "effect": "NoSchedule"}))
        .into_iter()
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": tolerations,
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"requests": {"cpu": "100m"}}}]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn the_scheduler_binds_a_tolerating_pod_to_a_tainted_node_and_leaves_others_pending() {
    let ctx = TestContext::new("scheduler-taints").await;
    let node = format!("vk-{}", ctx.namespace);
    let taint = "virtual-kubelet.io/provider";
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node(&node, taint))
        .await
        .unwrap();
    heartbeat(&ctx.client, &node).await;

    let pods: Api<Pod> = ctx.namespaced();
    pods.create(
        &PostParams::default(),
        &pod_for("tolerant", &node, Some(taint)),
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod_for("intolerant", &node, None))
        .await
        .unwrap();

    let bound = eventually("the tolerating pod to be bound", || async {
        let p = pods.get("tolerant").await.ok()?;
        p.spec?.node_name
    })
    .await;
    assert_eq!(bound, node);

    let events: Api<Event> = ctx.namespaced();
    let lp = ListParams::default().fields("involvedObject.name=intolerant");
    let message = eventually(
        "a FailedScheduling event for the intolerant pod",
        || async {
            let list = events.list(&lp).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("FailedScheduling"))?
                .message
        },
    )
    .await;
    assert!(message.contains("untolerated taint"), "{message}");
    let intolerant = pods.get("intolerant").await.unwrap();
    assert_eq!(intolerant.spec.unwrap().node_name, None);
    assert_eq!(intolerant.status.unwrap().phase.as_deref(), Some("Pending"));
    nodes.delete(&node, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn deleting_a_namespace_completes_because_the_controller_manager_runs() {
    let ctx = TestContext::new("namespace-deletion").await;
    let cms: Api<ConfigMap> = ctx.namespaced();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "payload"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    namespaces
        .delete(&ctx.namespace, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the namespace to be gone", || async {
        matches!(namespaces.get_opt(&ctx.namespace).await, Ok(None)).then_some(())
    })
    .await;
}

fn labelled_config_map(name: &str) -> ConfigMap {
    let meta = json!({"metadata": {"name": name, "labels": {"testenv": "watched"}}});
    serde_json::from_value(meta).unwrap()
}

async fn next_event<S>(stream: &mut S) -> Option<WatchEvent<ConfigMap>>
where
    S: futures::Stream<Item = Result<WatchEvent<ConfigMap>, watcher::Error>> + Unpin,
{
    let next = tokio::time::timeout(WAIT, stream.try_next()).await;
    next.expect("watch stalled").expect("watch failed")
}

#[tokio::test]
async fn a_watch_with_streaming_lists_receives_its_initial_events() {
    let ctx = TestContext::new("streaming-list").await;
    let cms: Api<ConfigMap> = ctx.namespaced();
    for i in 0..3 {
        cms.create(
            &PostParams::default(),
            &labelled_config_map(&format!("cm-{i}")),
        )
        .await
        .unwrap();
    }
    let config = watcher::Config::default()
        .labels("testenv=watched")
        .streaming_lists();
    let mut stream = watcher::watcher(cms.clone(), config).boxed();
    let mut initial = Vec::new();
    assert!(matches!(
        next_event(&mut stream).await,
        Some(WatchEvent::Init)
    ));
    loop {
        match next_event(&mut stream).await {
            Some(WatchEvent::InitApply(cm)) => initial.push(cm.metadata.name.unwrap()),
            Some(WatchEvent::InitDone) => break,
            other => panic!("unexpected event during the initial list: {other:?}"),
        }
    }
    initial.sort();
    assert_eq!(initial, ["cm-0", "cm-1", "cm-2"]);
    cms.create(&PostParams::default(), &labelled_config_map("cm-new"))
        .await
        .unwrap();
    match next_event(&mut stream).await {
        Some(WatchEvent::Apply(cm)) => assert_eq!(cm.metadata.name.as_deref(), Some("cm-new")),
        other => panic!("expected the new object, got {other:?}"),
    }
}

#[tokio::test]
async fn a_node_identity_is_confined_by_the_node_authorizer_and_node_restriction() {
    let ctx = TestContext::new("node-restriction").await;
    let me = format!("vk-a-{}", ctx.namespace);
    let other = format!("vk-b-{}", ctx.namespace);
    let cp = ctx.control_plane;
    let as_node = cp
        .client_as(&format!("system:node:{me}"), &["system:nodes"])
        .await
        .unwrap();
    let my_nodes: Api<Node> = Api::all(as_node.clone());
    my_nodes
        .create(&PostParams::default(), &tainted_node(&me, "t"))
        .await
        .unwrap();
    heartbeat(&as_node, &me).await;

    let admin_nodes: Api<Node> = Api::all(ctx.client.clone());
    admin_nodes
        .create(&PostParams::default(), &tainted_node(&other, "t"))
        .await
        .unwrap();
    let patch = json!({"metadata": {"labels": {"hijacked": "true"}}});
    let err = my_nodes
        .patch(&other, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    assert!(
        matches!(err, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{err:?}"
    );

    let restricted = json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": "x"}}});
    let err = my_nodes
        .patch(&me, &PatchParams::default(), &Patch::Merge(&restricted))
        .await;
    let Err(kube::Error::Api(status)) = err else {
        panic!("NodeRestriction allowed {err:?}")
    };
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status.message.contains("node-restriction.kubernetes.io"),
        "{}",
        status.message
    );

    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(as_node.clone(), &ctx.namespace);
    let err = secrets.list(&ListParams::default()).await;
    assert!(
        matches!(err, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{err:?}"
    );
    for n in [&me, &other] {
        admin_nodes
            .delete(n, &DeleteParams::default())
            .await
            .unwrap();
    }
}
