//! BurstPolicy objects on a real API server, loaded by the node's policy registry: CEL rules and
//! Wasm components (from a path and from a ConfigMap) load and report their status; a CEL syntax
//! error and a CEL type error are reported with field and position; a Wasm policy that fails to
//! load is named by its BurstPolicy name, and a missing ConfigMap says what to do instead;
//! `resolve` gives planners that rank as the policy decides, the host default when a policy is
//! audited or fails with failurePolicy Ignore, and says why when a policy is missing or did not
//! load.
//!
//! Needs the guests built by `make policies` (or `NEOCLOUD_POLICIES_DIR`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use neocloud_broker::{DefaultFallback, FallbackPolicy, PlanInput, Planner};
use neocloud_core::{Offer, ProviderId, WorkloadSpec};
use neocloud_node::crd::{self, BurstPolicy, BurstPolicyStatus};
use neocloud_node::metrics::Metrics;
use neocloud_node::policies::{PolicyRegistry, PolicyUnavailable, Resolved};
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_policy::wasm::{EngineConfig, WasmEngine, sha256_hex};
use neocloud_testenv::TestContext;
use serde_json::json;

/// Where the guests are built: the registry's `policies.wasmDir`.
fn guests() -> PathBuf {
    let dir = std::env::var_os("NEOCLOUD_POLICIES_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../policies/build"),
        PathBuf::from,
    );
    dir.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}: run `make policies`", dir.display()))
}

fn guest(name: &str) -> PathBuf {
    let path = guests().join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run `make policies`",
        path.display()
    );
    path
}

/// A context with the CRDs installed and a running registry.
async fn start(test: &str) -> (TestContext, Arc<PolicyRegistry>) {
    let ctx = TestContext::new(test).await;
    crd::install(&ctx.client, "tests", Duration::from_secs(30))
        .await
        .unwrap();
    let registry = PolicyRegistry::new(
        ctx.client.clone(),
        Arc::new(CelEngine::new(CelLimits::default())),
        WasmEngine::new(EngineConfig::default()).unwrap(),
        guests(),
        Arc::new(Metrics::new()),
    );
    tokio::spawn(Arc::clone(&registry).run());
    (ctx, registry)
}

/// Creates a BurstPolicy named `<namespace>-<suffix>` (they are cluster-scoped).
async fn create(ctx: &TestContext, suffix: &str, spec: serde_json::Value) -> BurstPolicy {
    let name = format!("{}-{suffix}", ctx.namespace);
    let bp: BurstPolicy = serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    let api: Api<BurstPolicy> = Api::all(ctx.client.clone());
    api.create(&PostParams::default(), &bp).await.unwrap()
}

/// The status once it describes the policy's current generation.
async fn status_of(ctx: &TestContext, bp: &BurstPolicy) -> BurstPolicyStatus {
    let api: Api<BurstPolicy> = Api::all(ctx.client.clone());
    for _ in 0..600 {
        let got = api.get(&bp.name_any()).await.unwrap();
        if let Some(s) = got.status
            && s.observed_generation == got.metadata.generation
        {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no status for BurstPolicy {} after 60s", bp.name_any());
}

fn default_fallback() -> Arc<dyn FallbackPolicy> {
    Arc::new(DefaultFallback::default())
}

fn resolve(r: &PolicyRegistry, name: &str) -> Result<Resolved, PolicyUnavailable> {
    r.resolve(name, &Planner::default(), &default_fallback(), &workload())
}

fn workload() -> WorkloadSpec {
    neocloud_fixtures::workload()
}

fn offer(id: &str, price: f64, reliability: f64, verified: bool) -> Offer {
    Offer {
        reliability: Some(reliability),
        verified,
        disk_gib: None,
        ..neocloud_fixtures::offer(ProviderId::Fake, id, "H100 SXM", price)
    }
}

/// The placement-c guest scores reliability / price and excludes unverified hosts (score -1);
/// the default ranking (cheapest first) would put `d`, then `b`, first.
fn offers() -> Vec<Offer> {
    vec![
        offer("a", 1.0, 0.9, true),  // 0.9
        offer("b", 0.5, 0.3, true),  // 0.6
        offer("c", 3.0, 1.0, true),  // 0.33
        offer("d", 0.1, 1.0, false), // excluded
    ]
}

fn scores(r: &Resolved) -> Result<Vec<f64>, neocloud_broker::PolicyError> {
    let offers = offers();
    let refs: Vec<&Offer> = offers.iter().collect();
    r.planner.ranker.rank(&workload(), &refs, &[])
}

fn planned_ids(r: &Resolved) -> Vec<String> {
    let offers = offers();
    let input = PlanInput {
        workload: &workload(),
        offers: &offers,
        attempts: &[],
        enabled: &[],
        skipped: &[],
        now: chrono::Utc::now(),
    };
    let plan = r.planner.plan(&input).unwrap();
    plan.candidates.into_iter().map(|c| c.offer.id).collect()
}

/// Polls `resolve` until it succeeds (the registry loads asynchronously).
async fn resolved(r: &PolicyRegistry, name: &str) -> Resolved {
    for _ in 0..600 {
        if let Ok(found) = resolve(r, name) {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{}", resolve(r, name).unwrap_err());
}

/// Why `name` is unavailable once this registry has loaded it. Every test's registry watches
/// every BurstPolicy and writes its status, so a status can say a policy failed before this
/// registry has finished loading it.
async fn unavailable_once_loaded(r: &PolicyRegistry, name: &str) -> PolicyUnavailable {
    for _ in 0..600 {
        match resolve(r, name) {
            Err(PolicyUnavailable::Loading { .. }) => {}
            Err(why) => return why,
            Ok(_) => panic!("{name} loaded"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} still loading after 60 s");
}

fn cheapest_first() -> Vec<f64> {
    offers().iter().map(|o| -o.price_per_hour).collect()
}

#[tokio::test]
async fn a_cel_policy_loads_and_a_syntax_error_is_reported_with_field_and_position() {
    let (ctx, registry) = start("pol-cel").await;
    let good = create(
        &ctx,
        "good",
        json!({"cel": {"constraints": "offer.verified", "rank": "offer.reliability"}}),
    )
    .await;
    let bad = create(
        &ctx,
        "bad",
        json!({"cel": {"constraints": "offer.price_per_hour <", "rank": "1"}}),
    )
    .await;

    let s = status_of(&ctx, &good).await;
    assert!(s.loaded, "{s:?}");
    assert!(s.errors.is_empty());
    let digest = s.digest.clone().unwrap();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 7 + 64,
        "{digest}"
    );
    let cond = &s.conditions[0];
    assert_eq!(
        (cond.type_.as_str(), cond.status.as_str()),
        ("Loaded", "True")
    );
    assert_eq!(cond.observed_generation, good.metadata.generation);

    let r = resolved(&registry, &good.name_any()).await;
    assert_eq!(r.digest, digest);
    assert_eq!(scores(&r).unwrap(), vec![0.9, 0.3, 1.0, 1.0]);
    assert_eq!(planned_ids(&r), ["c", "a", "b"], "d is unverified");

    let s = status_of(&ctx, &bad).await;
    assert!(!s.loaded && s.digest.is_none(), "{s:?}");
    assert_eq!(s.errors.len(), 1, "{s:?}");
    let e = &s.errors[0];
    assert_eq!(e.field, "spec.cel.constraints");
    assert_eq!(e.line, Some(1));
    assert!(e.column.is_some_and(|c| c > 1), "{e:?}");
    assert_eq!(s.conditions[0].status, "False");
    assert_eq!(s.conditions[0].reason, "LoadFailed");
    let why = unavailable_once_loaded(&registry, &bad.name_any()).await;
    assert!(matches!(why, PolicyUnavailable::NotLoaded { .. }), "{why}");
    assert!(
        why.to_string()
            .contains("failed to load: spec.cel.constraints"),
        "{why}"
    );
}

#[tokio::test]
async fn a_wasm_policy_from_a_path_ranks_offers_as_the_guest_decides_and_audit_decides_nothing() {
    let (ctx, registry) = start("pol-wasm").await;
    let path = guest("placement-c");
    let enforce = create(&ctx, "enforce", json!({"wasm": {"path": path}})).await;
    let audit = create(
        &ctx,
        "audit",
        json!({"wasm": {"path": path}, "mode": "Audit"}),
    )
    .await;

    let s = status_of(&ctx, &enforce).await;
    assert!(s.loaded, "{s:?}");
    let digest = format!("sha256:{}", sha256_hex(&std::fs::read(&path).unwrap()));
    assert_eq!(s.digest.as_deref(), Some(digest.as_str()));
    assert!(s.conditions[0].message.contains("placement"), "{s:?}");

    let r = resolved(&registry, &enforce.name_any()).await;
    assert_eq!(r.digest, digest);
    let got = scores(&r).unwrap();
    assert!(
        (got[0] - 0.9).abs() < 1e-9 && (got[1] - 0.6).abs() < 1e-9,
        "{got:?}"
    );
    assert_eq!(got[3], -1.0);
    assert_eq!(planned_ids(&r), ["a", "b", "c"], "the guest excluded d");

    assert!(status_of(&ctx, &audit).await.loaded);
    let r = resolved(&registry, &audit.name_any()).await;
    assert_eq!(scores(&r).unwrap(), cheapest_first());
    assert_eq!(planned_ids(&r), ["d", "b", "a", "c"]);
}

#[tokio::test]
async fn a_wasm_policy_loads_from_a_config_map() {
    let (ctx, registry) = start("pol-cm").await;
    let bytes = std::fs::read(guest("placement-c")).unwrap();
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("placement".to_owned()),
            ..Default::default()
        },
        binary_data: Some([("policy.wasm".to_owned(), ByteString(bytes.clone()))].into()),
        ..Default::default()
    };
    let cms: Api<ConfigMap> = ctx.namespaced();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let cm_ref = json!({"namespace": ctx.namespace, "name": "placement", "key": "policy.wasm"});
    let pinned = json!({"wasm": {"configMap": cm_ref, "sha256": sha256_hex(&bytes)}});
    let bp = create(&ctx, "cm", pinned).await;
    let wrong = json!({"wasm": {"configMap": cm_ref, "sha256": "0".repeat(64)}});
    let mismatch = create(&ctx, "cm-wrong-digest", wrong).await;

    let s = status_of(&ctx, &bp).await;
    assert!(s.loaded, "{s:?}");
    assert_eq!(s.digest, Some(format!("sha256:{}", sha256_hex(&bytes))));
    let r = resolved(&registry, &bp.name_any()).await;
    assert_eq!(planned_ids(&r), ["a", "b", "c"]);

    let s = status_of(&ctx, &mismatch).await;
    assert!(!s.loaded, "{s:?}");
    assert_eq!(s.errors[0].field, "spec.wasm.configMap");
    assert!(s.errors[0].message.contains("sha256") || s.errors[0].message.contains("digest"));
}

#[tokio::test]
async fn a_cel_type_error_is_a_load_error_with_field_position_and_hint() {
    let (ctx, _registry) = start("pol-cel-type").await;
    let rules = json!({"cel": {
        "constraints": "offer.gpu.memory_gib >= 24.0",
        "rank": "offer.gpu.memory_gib / offer.price_per_hour",
    }});
    let bp = create(&ctx, "mixed", rules).await;
    let s = status_of(&ctx, &bp).await;
    assert!(!s.loaded, "{s:?}");
    assert_eq!(s.errors.len(), 1, "int >= double compares in CEL: {s:?}");
    let e = &s.errors[0];
    assert_eq!(e.field, "spec.cel.rank");
    assert_eq!((e.line, e.column), (Some(1), Some(22)));
    assert!(e.message.contains("int and double"), "{e:?}");
    assert!(e.message.contains("double(offer.gpu.memory_gib)"), "{e:?}");
    assert!(s.conditions[0].message.contains("spec.cel.rank"), "{s:?}");
}

#[tokio::test]
async fn a_wasm_policy_that_fails_to_load_is_named_by_its_burst_policy_name() {
    let (ctx, _registry) = start("pol-wasm-bad").await;
    let wrong = create(
        &ctx,
        "wrong-world",
        json!({"wasm": {"path": guest("hostile-wrong-world")}}),
    )
    .await;
    let outside = create(&ctx, "outside", json!({"wasm": {"path": "/etc/hostname"}})).await;
    let missing_cm = json!({"namespace": ctx.namespace, "name": "absent", "key": "policy.wasm"});
    let absent = create(
        &ctx,
        "absent-cm",
        json!({"wasm": {"configMap": missing_cm}}),
    )
    .await;

    let s = status_of(&ctx, &wrong).await;
    assert!(!s.loaded, "{s:?}");
    let message = &s.errors[0].message;
    assert_eq!(s.errors[0].field, "spec.wasm.path");
    assert!(
        message.contains(&format!("policy {} (sha256:", wrong.name_any())),
        "{message}"
    );
    assert!(message.contains("exports none"), "{message}");

    let s = status_of(&ctx, &outside).await;
    assert!(!s.loaded, "{s:?}");
    assert_eq!(s.errors[0].field, "spec.wasm.path");
    let expected = format!(
        "\"/etc/hostname\" is outside policies.wasmDir {}",
        guests().display()
    );
    assert!(s.errors[0].message.contains(&expected), "{s:?}");

    let s = status_of(&ctx, &absent).await;
    assert!(!s.loaded, "{s:?}");
    let message = &s.errors[0].message;
    assert_eq!(s.errors[0].field, "spec.wasm.configMap");
    let no_cm = format!("configmap {}/absent does not exist", ctx.namespace);
    for part in [
        no_cm.as_str(),
        "at most 1 MiB",
        "spec.wasm.url with spec.wasm.sha256",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
}

#[tokio::test]
async fn a_missing_policy_is_unavailable_and_says_so() {
    let (ctx, registry) = start("pol-missing").await;
    let name = format!("{}-nope", ctx.namespace);
    let why = resolve(&registry, &name).unwrap_err();
    assert_eq!(why, PolicyUnavailable::Missing { name: name.clone() });
    assert_eq!(
        why.to_string(),
        format!("BurstPolicy {name} does not exist")
    );
    assert_eq!(why.reason(), "PolicyNotLoaded");
}

#[tokio::test]
async fn a_looping_guest_falls_back_to_the_default_ranking_with_ignore_and_fails_with_fail() {
    let (ctx, registry) = start("pol-loop").await;
    let path = guest("hostile-loop");
    let ignore = create(
        &ctx,
        "ignore",
        json!({"wasm": {"path": path}, "failurePolicy": "Ignore"}),
    )
    .await;
    let fail = create(&ctx, "fail", json!({"wasm": {"path": path}})).await;

    let r = resolved(&registry, &ignore.name_any()).await;
    assert_eq!(scores(&r).unwrap(), cheapest_first());
    assert_eq!(planned_ids(&r), ["d", "b", "a", "c"]);

    let r = resolved(&registry, &fail.name_any()).await;
    let error = scores(&r).unwrap_err();
    assert!(error.policy == fail.name_any(), "{error}");
    let offers = offers();
    let input = PlanInput {
        workload: &workload(),
        offers: &offers,
        attempts: &[],
        enabled: &[],
        skipped: &[],
        now: chrono::Utc::now(),
    };
    assert!(
        r.planner.plan(&input).is_err(),
        "the plan fails with the policy"
    );
}

#[tokio::test]
async fn a_wasm_pricing_policy_replaces_the_default_pricing_only() {
    let (ctx, registry) = start("pol-price").await;
    let bp = create(&ctx, "price", json!({"wasm": {"path": guest("pricing-c")}})).await;
    assert!(status_of(&ctx, &bp).await.loaded);
    let r = resolved(&registry, &bp.name_any()).await;
    let o = offer("a", 2.0, 1.0, true);
    let decision = r.planner.pricing.decide(&workload(), &o, &[]).unwrap();
    // The guest caps at 120% of the price without a workload maximum; the default at 100%.
    let cap = match decision {
        neocloud_core::PriceDecision::Accept {
            max_price_per_hour,
            bid_per_hour: None,
        } => max_price_per_hour,
        other => panic!("{other:?}"),
    };
    assert!((cap - 2.4).abs() < 1e-9, "{cap}");
    assert_eq!(scores(&r).unwrap(), cheapest_first(), "no placement role");
}

#[tokio::test]
async fn a_url_that_cannot_be_fetched_is_loaded_again_once_it_answers() {
    let (ctx, _registry) = start("pol-url-retry").await;
    let bytes = std::fs::read(guest("placement-c")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let bp = create(
        &ctx,
        "url-retry",
        json!({"wasm": {
            "url": format!("http://127.0.0.1:{port}/placement-c.wasm"),
            "sha256": sha256_hex(&bytes),
        }}),
    )
    .await;
    let s = status_of(&ctx, &bp).await;
    assert!(!s.loaded, "{s:?}");
    assert_eq!(s.errors[0].field, "spec.wasm.url");
    assert!(s.errors[0].message.contains("failed to fetch"), "{s:?}");

    // The server comes up; the node fetches again by itself.
    let app = axum::Router::new().route(
        "/placement-c.wasm",
        axum::routing::get(move || {
            let bytes = bytes.clone();
            async move { bytes }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let api: Api<BurstPolicy> = Api::all(ctx.client.clone());
    for _ in 0..600 {
        if api
            .get(&bp.name_any())
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.loaded)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the policy did not load after its url answered");
}
