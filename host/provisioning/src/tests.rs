//! Deciding requests on the real control plane (the PodTemplates are read from it) with
//! RunPod's simulator offering A40s in one region at $0.40/h: what is held, what is refused and
//! why, with bad requests among them. The decision is driven directly; the watch and the status
//! writes are covered by `host/node/tests/kueue_admission.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PodTemplate;
use kube::Api;
use kube::api::PostParams;
use neocloud_broker::{
    BudgetGuard, Catalog, CatalogConfig, CostLedger, DefaultFallback, LadderLimits, Planner, Renter,
};
use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_providers::{ApiKey, RunpodConfig, RunpodProvider};
use neocloud_testenv::TestContext;
use serde_json::json;

use super::{Holds, Outcome, Provisioner, ProvisioningConfig, ProvisioningRequest};
use neocloud_controller::naming::ClusterId;
use neocloud_controller::reconcile::{Reconciler, ReconcilerConfig};
use neocloud_telemetry::metrics::Metrics;

struct Rig {
    ctx: TestContext,
    _sims: CloudSim,
    p: Arc<Provisioner>,
    budget: Arc<BudgetGuard>,
}

async fn rig(prefix: &str, cap: f64) -> Rig {
    rig_watching(prefix, cap, None).await
}

async fn rig_watching(prefix: &str, cap: f64, watch: Option<Vec<String>>) -> Rig {
    let ctx = TestContext::new(prefix).await;
    let offers = serde_json::from_value(json!([{"gpu": "NVIDIA A40", "gpu_count": 8,
        "region": "CA-MTL-1", "price_per_hour": 0.40, "capacity": 8, "cloud": "SECURE"}]))
    .unwrap();
    let sims = CloudSim::start(CloudSimConfig {
        runpod: SimConfig {
            offers: Some(offers),
            ..SimConfig::fast()
        },
        lambda: SimConfig::fast(),
        vast: SimConfig::fast(),
    })
    .await
    .unwrap();
    let mut runpod = RunpodConfig::new(ApiKey::new(sims.runpod.api_key()));
    runpod.base_url = sims.runpod.base_url();
    let budget = BudgetGuard::new(Some(cap));
    let renter = Renter {
        catalog: Catalog::new(
            vec![Arc::new(RunpodProvider::new(runpod).unwrap())],
            CatalogConfig::default(),
        ),
        fallback: Arc::new(DefaultFallback::default()),
        limits: LadderLimits::default(),
        budget: Arc::clone(&budget),
        ledger: Arc::new(CostLedger::new()),
    };
    let holds = Holds::new(None);
    let mut cfg = ReconcilerConfig::new("neocloud-test", ClusterId::new("prov").unwrap());
    cfg.holds = Some(Arc::clone(&holds));
    cfg.watch_namespaces = watch;
    let r = Reconciler::new(
        ctx.client.clone(),
        cfg,
        Planner::default(),
        renter,
        Arc::new(CelEngine::new(CelLimits::default())),
        Arc::new(Metrics::new()),
        None,
    );
    let p = Provisioner::new(ctx.client.clone(), r, holds, ProvisioningConfig::default());
    Rig {
        ctx,
        _sims: sims,
        p,
        budget,
    }
}

impl Rig {
    async fn template(&self, name: &str, containers: usize) {
        let container = json!({"name": "train", "image": "registry.invalid/train:1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}});
        let mut c2 = container.clone();
        c2["name"] = json!("sidecar");
        let containers = [container, c2][..containers].to_vec();
        let t: PodTemplate = serde_json::from_value(json!({
            "metadata": {"name": name},
            "template": {"metadata": {"annotations": {"cloud.aibrix.ai/gpu-type": "A40"}},
                "spec": {"restartPolicy": "Never", "containers": containers}},
        }))
        .unwrap();
        Api::<PodTemplate>::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
            .create(&PostParams::default(), &t)
            .await
            .unwrap();
    }

    fn request(&self, sets: &[(&str, i32)], params: &[(&str, &str)]) -> ProvisioningRequest {
        let sets: Vec<_> = sets
            .iter()
            .map(|(n, c)| json!({"podTemplateRef": {"name": n}, "count": c}))
            .collect();
        let params: BTreeMap<_, _> = params.iter().copied().collect();
        serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
            "metadata": {"name": "job-train-1a2b3-rent-1", "namespace": self.ctx.namespace,
                "uid": "0b7d6c1e-0000-4000-8000-000000000001"},
            "spec": {"provisioningClassName": super::CLASS, "podSets": sets,
                "parameters": params},
        }))
        .unwrap()
    }

    async fn decide(&self, req: &ProvisioningRequest) -> Outcome {
        self.p.decide(req).await.unwrap()
    }
}

fn failure(o: Outcome) -> (String, String) {
    match o {
        Outcome::Failed { reason, message } => (reason, message),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn four_pods_are_planned_in_one_region_and_their_budget_is_held() {
    let rig = rig("prov-held", 4.0).await;
    rig.template("ppt-main", 1).await;
    let req = rig.request(&[("ppt-main", 4)], &[("ValidUntilSeconds", "60")]);
    let Outcome::Held { place, .. } = rig.decide(&req).await else {
        panic!("not held");
    };
    assert_eq!(place.describe(), "runpod CA-MTL-1: 4x A40 at $0.4000/h");
    assert!((rig.p.holds.usd_per_hour() - 1.6).abs() < 1e-9);
    assert!((rig.budget.in_flight_usd_per_hour() - 1.6).abs() < 1e-9);
    assert_eq!(rig.p.holds.untaken(&super::key(&req)), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn over_budget_fails_with_the_figures_and_holds_nothing() {
    let rig = rig("prov-over", 1.2).await;
    rig.template("ppt-main", 1).await;
    let (reason, message) = failure(rig.decide(&rig.request(&[("ppt-main", 4)], &[])).await);
    assert_eq!(reason, "OverBudget");
    assert!(
        message.contains(
            "cluster budget of $1.2000/h would be exceeded: $0.0000/h running, \
             $0.0000/h in flight, $1.6000/h requested, for 4 pods on runpod CA-MTL-1"
        ),
        "{message}"
    );
    assert_eq!(rig.budget.in_flight_usd_per_hour(), 0.0);
    assert_eq!(rig.p.holds.usd_per_hour(), 0.0);
    // Three fit.
    let three = rig.request(&[("ppt-main", 3)], &[]);
    assert!(matches!(rig.decide(&three).await, Outcome::Held { .. }));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capacity_check_reports_and_holds_nothing() {
    let rig = rig("prov-check", 4.0).await;
    rig.template("ppt-main", 1).await;
    let req = rig.request(&[("ppt-main", 4)], &[("checkCapacity", "true")]);
    assert!(matches!(rig.decide(&req).await, Outcome::Checked { .. }));
    assert_eq!(rig.budget.in_flight_usd_per_hour(), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_fail_with_a_message_naming_what_is_wrong() {
    let rig = rig("prov-bad", 4.0).await;
    rig.template("ppt-main", 1).await;
    rig.template("ppt-two", 2).await;
    let ns = rig.ctx.namespace.clone();
    let (reason, message) = failure(rig.decide(&rig.request(&[("ppt-gone", 1)], &[])).await);
    assert_eq!(reason, "PodTemplateNotFound");
    assert_eq!(
        message,
        format!("spec.podSets[0].podTemplateRef: PodTemplate {ns}/ppt-gone does not exist")
    );
    let (reason, message) = failure(
        rig.decide(&rig.request(&[("ppt-main", 1), ("ppt-main", 0)], &[]))
            .await,
    );
    assert_eq!(reason, "InvalidRequest");
    assert_eq!(message, "spec.podSets[1].count: 0 must be at least 1");
    let (reason, message) = failure(rig.decide(&rig.request(&[], &[])).await);
    assert_eq!(
        (reason.as_str(), message.as_str()),
        ("InvalidRequest", "spec.podSets is empty")
    );
    let bad = rig.request(&[("ppt-main", 1)], &[("checkCapacity", "maybe")]);
    let (reason, message) = failure(rig.decide(&bad).await);
    assert_eq!(reason, "InvalidParameters");
    assert!(
        message.contains("spec.parameters.checkCapacity: \"maybe\""),
        "{message}"
    );
    let (reason, message) = failure(rig.decide(&rig.request(&[("ppt-two", 1)], &[])).await);
    assert_eq!(reason, "Unsupported");
    assert!(message.starts_with("PodTemplate ppt-two: "), "{message}");
    let (reason, message) = failure(
        rig.decide(&rig.request(&[("ppt-main", 1)], &[("MaxPricePerHour", "0.30")]))
            .await,
    );
    assert_eq!(reason, "NoOffer", "{message}");
    assert!(message.contains("PodTemplate ppt-main"), "{message}");
    assert_eq!(rig.budget.in_flight_usd_per_hour(), 0.0, "nothing held");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_in_a_namespace_the_node_does_not_serve_is_refused() {
    let rig = rig_watching("prov-ns", 4.0, Some(vec!["team-b".into()])).await;
    rig.template("ppt-main", 1).await;
    let (reason, message) = failure(rig.decide(&rig.request(&[("ppt-main", 1)], &[])).await);
    assert_eq!(reason, "NamespaceNotWatched");
    assert!(message.contains("watchNamespaces: team-b"), "{message}");
}
