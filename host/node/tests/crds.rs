//! The generated CRDs on a real API server: bindings have a status subresource, printer columns
//! and a short name, and are garbage-collected with their Pod; the API server itself refuses a
//! malformed BurstPolicy with a message that names the rule.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use neocloud_node::crd::{self, BurstPolicy, CloudPodBinding};
use neocloud_testenv::TestContext;
use serde_json::json;

async fn install_crds(ctx: &TestContext) {
    crd::install(&ctx.client, "neocloud-node-tests", Duration::from_secs(30))
        .await
        .unwrap();
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/cuda:12"}]}
    }))
    .unwrap()
}

fn binding_for(pod: &Pod) -> CloudPodBinding {
    let owner = pod.controller_owner_ref(&()).unwrap();
    serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "CloudPodBinding",
        "metadata": {"name": pod.name_any(), "ownerReferences": [owner]},
        "spec": {
            "podName": pod.name_any(), "podUid": pod.uid().unwrap(),
            "externalName": "nc-test-0001", "clusterId": "test",
            "workload": {"image": "registry.invalid/cuda:12", "gpuCount": 1,
                "gpuModels": ["A40"], "maxPricePerHour": 0.5, "capacityType": "on-demand"}
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn a_binding_has_a_status_subresource_printer_columns_and_dies_with_its_pod() {
    let ctx = TestContext::new("crd-binding").await;
    install_crds(&ctx).await;
    let pods: Api<Pod> = ctx.namespaced();
    let pod = pods
        .create(&PostParams::default(), &pod("gpu-job"))
        .await
        .unwrap();
    let bindings: Api<CloudPodBinding> = ctx.namespaced();
    bindings
        .create(&PostParams::default(), &binding_for(&pod))
        .await
        .unwrap();

    let status = json!({"status": {"phase": "Running", "provider": "runpod",
        "instanceId": "pod-123", "gpu": "1x A40", "pricePerHour": 0.44, "costAccruedUsd": 0.0}});
    bindings
        .patch_status("gpu-job", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let ignored = json!({"status": {"phase": "Failed"}});
    bindings
        .patch("gpu-job", &PatchParams::default(), &Patch::Merge(&ignored))
        .await
        .unwrap();
    let got = bindings.get("gpu-job").await.unwrap();
    let got_status = got.status.unwrap();
    assert_eq!(
        got_status.phase,
        crd::BindingPhase::Running,
        "status only changes through /status"
    );
    assert_eq!(got_status.instance_id.as_deref(), Some("pod-123"));

    let out = ctx
        .control_plane
        .kubectl()
        .args(["get", "cpb", "-n", &ctx.namespace])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "PROVIDER", "INSTANCE", "GPU", "USD/HOUR", "PHASE", "AGE"
        ]
    );
    assert!(
        table.contains("gpu-job") && table.contains("pod-123") && table.contains("0.44"),
        "{table}"
    );

    pods.delete("gpu-job", &Default::default()).await.unwrap();
    for _ in 0..300 {
        if bindings.get_opt("gpu-job").await.unwrap().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the binding outlived its Pod by 30s: the garbage collector did not collect it");
}

/// Creates a policy from raw JSON, untyped, so that the API server (not serde) judges it.
async fn create_policy(
    ctx: &TestContext,
    name: &str,
    spec: serde_json::Value,
) -> kube::Result<DynamicObject> {
    let resource = ApiResource::erase::<BurstPolicy>(&());
    let policies: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &resource);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": format!("{}-{name}", ctx.namespace)}, "spec": spec
    }))
    .unwrap();
    policies.create(&PostParams::default(), &obj).await
}

fn rejection(result: kube::Result<DynamicObject>) -> String {
    match result {
        Err(kube::Error::Api(s)) if s.code == 422 => s.message,
        other => panic!("expected a 422 rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn the_api_server_refuses_a_malformed_burst_policy_and_names_the_rule() {
    let ctx = TestContext::new("crd-policy").await;
    install_crds(&ctx).await;
    let ok = create_policy(
        &ctx,
        "cel",
        json!({"cel": {"constraints": "offer.price_per_hour < 1.0"}}),
    )
    .await
    .unwrap();
    let ok: BurstPolicy = ok.try_parse().unwrap();
    assert_eq!(
        ok.spec.mode,
        crd::PolicyMode::Enforce,
        "mode defaults to Enforce"
    );
    assert_eq!(
        ok.spec.failure_policy,
        crd::FailurePolicy::Fail,
        "failurePolicy defaults to Fail"
    );

    let both = json!({"cel": {"rank": "1"}, "wasm": {"path": "/p.wasm"}});
    let msg = rejection(create_policy(&ctx, "both", both).await);
    assert!(
        msg.contains("exactly one of spec.wasm and spec.cel must be set"),
        "{msg}"
    );
    let neither = rejection(create_policy(&ctx, "neither", json!({"mode": "Audit"})).await);
    assert!(
        neither.contains("exactly one of spec.wasm and spec.cel"),
        "{neither}"
    );

    let unpinned = json!({"wasm": {"url": "https://example.invalid/p.wasm"}});
    let msg = rejection(create_policy(&ctx, "unpinned", unpinned).await);
    assert!(msg.contains("a url must be pinned with sha256"), "{msg}");
    let bad_digest = json!({"wasm": {"url": "https://example.invalid/p.wasm", "sha256": "XYZ"}});
    let msg = rejection(create_policy(&ctx, "bad-digest", bad_digest).await);
    assert!(
        msg.contains("sha256 must be 64 lower-case hex digits"),
        "{msg}"
    );
    let bad_mode = json!({"cel": {"rank": "1"}, "mode": "Sometimes"});
    let msg = rejection(create_policy(&ctx, "bad-mode", bad_mode).await);
    assert!(
        msg.contains("spec.mode") && msg.contains("Sometimes"),
        "{msg}"
    );
    let too_many = json!({"cel": {"rank": "1"}, "maxReplacements": 500});
    let msg = rejection(create_policy(&ctx, "too-many", too_many).await);
    assert!(
        msg.contains("spec.maxReplacements must be at most 100"),
        "{msg}"
    );
    let negative = json!({"cel": {"rank": "1"}, "maxReplacements": -1});
    let msg = rejection(create_policy(&ctx, "negative", negative).await);
    assert!(msg.contains("maxReplacements"), "{msg}");
    let capped = json!({"cel": {"rank": "1"}, "maxReplacements": 2});
    let capped: BurstPolicy = create_policy(&ctx, "capped", capped)
        .await
        .unwrap()
        .try_parse()
        .unwrap();
    assert_eq!(capped.spec.max_replacements, Some(2));
}
