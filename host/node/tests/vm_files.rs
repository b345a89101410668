//! A workload's files end to end: `neocloud-node run` on the real control plane with Lambda as
//! its only provider, whose simulated VMs run the runner as a local process. The Pod mounts a
//! ConfigMap (one key, renamed by `items`), a Secret (mode 0400) and a downward-API volume; the
//! workload reads them and prints what it read; an edit of the ConfigMap reaches the file while
//! it runs. A Pod whose ConfigMap does not exist waits with `FailedMount` naming it. No secret
//! value reaches the node's log, an event, the binding or the Pod.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use kube::Api;
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;

mod runner_bin;
mod support;
mod vm_support;
use vm_support::World;

const TOKEN: &str = "hf-4b1d9e-never-in-node-output";

async fn create<K>(world: &World, object: serde_json::Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

fn files_pod(world: &World, name: &str, dir: &str, config_map: &str) -> Pod {
    // Reads every file, prints it, then prints the template every 0.5 s for a while.
    let script = format!(
        "echo \"template=$(cat {dir}/tpl/chat.jinja)\"; \
         echo \"token-mode=$(stat -L -c %a {dir}/key/token)\"; \
         echo \"token-bytes=$(wc -c < {dir}/key/token)\"; \
         echo \"pod-name=$(cat {dir}/info/name)\"; \
         i=0; while [ $i -lt 400 ]; do i=$((i+1)); \
         echo \"now=$(cat {dir}/tpl/chat.jinja)\"; sleep 0.5; done"
    );
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": world.node,
            "restartPolicy": "Never",
            "volumes": [
                {"name": "tpl", "configMap": {"name": config_map,
                    "items": [{"key": "template", "path": "chat.jinja"}]}},
                {"name": "key", "secret": {"secretName": "hf", "defaultMode": 0o400}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}
            ],
            "containers": [{"name": "main", "image": "registry.invalid/vllm:0.6",
                "command": ["sh", "-c", script],
                "volumeMounts": [
                    {"name": "tpl", "mountPath": format!("{dir}/tpl")},
                    {"name": "key", "mountPath": format!("{dir}/key"), "readOnly": true},
                    {"name": "info", "mountPath": format!("{dir}/info")}
                ],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap()
}

async fn logs(world: &World, name: &str) -> String {
    let params = LogParams {
        container: Some("main".into()),
        ..LogParams::default()
    };
    world.pods().logs(name, &params).await.unwrap_or_default()
}

/// Waits up to `seconds` for the Pod's log to contain `needle`.
async fn wait_log(world: &World, name: &str, needle: &str, seconds: u64) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        let text = logs(world, name).await;
        if text.contains(needle) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{needle:?} not in the log of {name} within {seconds} s:\n{text}\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_pod_reads_its_config_map_secret_and_downward_files_and_sees_updates() {
    let world = World::new("vmfiles", true).await;
    let dir = tempfile::tempdir().unwrap();
    let dir_text = dir.path().display().to_string();
    create::<ConfigMap>(
        &world,
        json!({"metadata": {"name": "chat"}, "data": {"template": "v1-template"}}),
    )
    .await;
    create::<Secret>(
        &world,
        json!({"metadata": {"name": "hf"}, "stringData": {"token": TOKEN}}),
    )
    .await;
    let mut node = world.spawn();
    world
        .pods()
        .create(
            &PostParams::default(),
            &files_pod(&world, "vllm", &dir_text, "chat"),
        )
        .await
        .unwrap();
    // A second Pod names a ConfigMap that does not exist: it waits, saying which.
    world
        .pods()
        .create(
            &PostParams::default(),
            &files_pod(&world, "waiting", &format!("{dir_text}/w"), "absent"),
        )
        .await
        .unwrap();

    world.wait_running_on_new("vllm", None).await;
    let text = wait_log(&world, "vllm", "pod-name=", 60).await;
    for line in [
        "template=v1-template",
        "token-mode=400",
        &format!("token-bytes={}", TOKEN.len()),
        "pod-name=vllm",
    ] {
        assert!(
            text.contains(line),
            "{line:?} not in\n{text}\n{}",
            world.node_log()
        );
    }

    // An edit of the ConfigMap reaches the file while the workload runs.
    let config_maps: Api<ConfigMap> =
        Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    config_maps
        .patch(
            "chat",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"template": "v2-template"}})),
        )
        .await
        .unwrap();
    wait_log(&world, "vllm", "now=v2-template", 90).await;

    // The missing ConfigMap: Pending, FailedMount, named, and nothing rented for it.
    let waiting = world.pods().get("waiting").await.unwrap();
    let status = waiting.status.clone().unwrap_or_default();
    assert_eq!(status.phase.as_deref(), Some("Pending"), "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("FailedMount"), "{status:?}");
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("spec.volumes[0].configMap: ConfigMap absent does not exist"),
        "{message}"
    );
    let events: Api<Event> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let events = events.list(&ListParams::default()).await.unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("FailedMount")
                && e.involved_object.name.as_deref() == Some("waiting")),
        "no FailedMount event: {:#?}",
        events.items
    );
    assert_eq!(world.sims.ledger().live().len(), 1, "one rental, for vllm");

    // No secret value in the node's log, any event, the binding or the Pods.
    let binding = world.bindings().get("vllm").await.unwrap();
    let pod = world.pods().get("vllm").await.unwrap();
    for (what, text) in [
        ("node log", world.node_log()),
        ("events", serde_json::to_string(&events).unwrap()),
        ("binding", serde_json::to_string(&binding).unwrap()),
        ("pod status", serde_json::to_string(&pod.status).unwrap()),
    ] {
        assert!(!text.contains(TOKEN), "the secret value is in the {what}");
    }
    node.start_kill().unwrap();
    let _ = node.wait().await;
}
