//! A Python guest (policies/fallback-py, built with componentize-py) loaded by the node's policy
//! registry from a `BurstPolicy` whose `path` is relative to `policies.wasmDir`, and its decision
//! driving the fallback ladder. Its own test binary: every registry in a control plane compiles
//! every BurstPolicy, and this component is 18 MB.
//!
//! Needs the guests built by `make policies`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use neocloud_broker::{DefaultFallback, Failure, FallbackContext, Planner};
use neocloud_core::{Attempt, AttemptOutcome, FailureClass, FallbackAction, ProviderId};
use neocloud_node::crd::{self, BurstPolicy, BurstPolicyStatus};
use neocloud_node::metrics::Metrics;
use neocloud_node::policies::{PolicyRegistry, PolicyUnavailable};
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_policy::wasm::{EngineConfig, WasmEngine};
use neocloud_testenv::TestContext;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn a_python_fallback_policy_named_relative_to_the_wasm_dir_decides_the_ladder() {
    let ctx = TestContext::new("pol-py").await;
    crd::install(&ctx.client, "tests", Duration::from_secs(30))
        .await
        .unwrap();
    let guests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../policies/build");
    let guests = guests
        .canonicalize()
        .expect("policies/build: run `make policies`");
    let registry = PolicyRegistry::new(
        ctx.client.clone(),
        Arc::new(CelEngine::new(CelLimits::default())),
        WasmEngine::new(EngineConfig::default()).unwrap(),
        guests,
        Arc::new(Metrics::new()),
    );
    tokio::spawn(Arc::clone(&registry).run());
    let name = format!("{}-python", ctx.namespace);
    let bp: BurstPolicy = serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": name}, "spec": {"wasm": {"path": "fallback-py.wasm"}},
    }))
    .unwrap();
    Api::<BurstPolicy>::all(ctx.client.clone())
        .create(&PostParams::default(), &bp)
        .await
        .unwrap();

    let w = neocloud_fixtures::workload();
    let base: Arc<dyn neocloud_broker::FallbackPolicy> = Arc::new(DefaultFallback::default());
    let mut resolved = registry.resolve(&name, &Planner::default(), &base, &w);
    let mut said_loading = false;
    for _ in 0..1200 {
        match &resolved {
            Ok(_) => break,
            // Compiling 18 MB takes seconds, which a waiting Pod is told.
            Err(PolicyUnavailable::Loading { .. }) => said_loading = true,
            Err(PolicyUnavailable::Missing { .. }) => {}
            Err(other) => panic!("{other}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        resolved = registry.resolve(&name, &Planner::default(), &base, &w);
    }
    let r = resolved.expect("the Python policy loads");
    assert!(
        said_loading,
        "a Pod waiting meanwhile is told the policy is being loaded"
    );
    assert!(r.digest.starts_with("sha256:"), "{}", r.digest);
    let refused = Attempt {
        number: 1,
        provider: ProviderId::Vast,
        offer_id: "v1".into(),
        price_per_hour: 1.5,
        started_at: chrono::Utc::now(),
        outcome: AttemptOutcome::Failed {
            class: FailureClass::Auth,
            code: None,
            message: "bad key".into(),
        },
    };
    let cx = FallbackContext {
        workload: &w,
        attempts: std::slice::from_ref(&refused),
        failure: Failure {
            class: FailureClass::Auth,
            provider: ProviderId::Vast,
            retry_after: None,
        },
        retries_of_offer: 0,
    };
    let action = r.fallback.next_action(&cx).expect("the guest decides");
    let skip = FallbackAction::SkipProvider {
        provider: ProviderId::Vast,
    };
    assert_eq!(action, skip);
    // The registry writes the status just after it keeps the policy.
    let api = Api::<BurstPolicy>::all(ctx.client.clone());
    let mut status = BurstPolicyStatus::default();
    for _ in 0..100 {
        status = api.get(&name).await.unwrap().status.unwrap_or_default();
        if status.loaded {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(status.loaded, "{status:?}");
    assert!(
        status.conditions[0].message.contains("fallback"),
        "{status:?}"
    );
}
