//! A binding read from a cache behind the API server: its writes are refused with a conflict,
//! the reconcile ends in a requeue, and nothing is rented a second time. On the real control
//! plane with the RunPod simulator, driving the reconciler's steps directly (the cache is what
//! these tests make stale, by keeping an old copy of the binding).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use neocloud_broker::{
    BudgetGuard, Catalog, CatalogConfig, CostLedger, DefaultFallback, LadderLimits, Planner, Renter,
};
use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};
use neocloud_policy::cel::{CelEngine, CelLimits};
use neocloud_providers::{ApiKey, RunpodConfig, RunpodProvider};
use neocloud_testenv::TestContext;
use serde_json::json;

use super::{Reconciler, ReconcilerConfig};
use crate::naming::ClusterId;
use neocloud_api::{BindingPhase, CloudPodBinding};
use neocloud_telemetry::metrics::Metrics;

struct Rig {
    _ctx: TestContext,
    sims: CloudSim,
    r: Arc<Reconciler>,
    pods: Api<Pod>,
    bindings: Api<CloudPodBinding>,
}

async fn rig(prefix: &str) -> Rig {
    let ctx = TestContext::new(prefix).await;
    crate::crds::install(&ctx.client, "neocloud-node-tests", Duration::from_secs(30))
        .await
        .unwrap();
    let sims = CloudSim::start(CloudSimConfig {
        runpod: SimConfig::fast(),
        lambda: SimConfig::fast(),
        vast: SimConfig::fast(),
    })
    .await
    .unwrap();
    let mut runpod = RunpodConfig::new(ApiKey::new(sims.runpod.api_key()));
    runpod.base_url = sims.runpod.base_url();
    let renter = Renter {
        catalog: Catalog::new(
            vec![Arc::new(RunpodProvider::new(runpod).unwrap())],
            CatalogConfig::default(),
        ),
        fallback: Arc::new(DefaultFallback::default()),
        limits: LadderLimits::default(),
        budget: BudgetGuard::new(None),
        ledger: Arc::new(CostLedger::new()),
    };
    let node = format!("neocloud-{}", ctx.namespace);
    let r = Reconciler::new(
        ctx.client.clone(),
        ReconcilerConfig::new(&node, ClusterId::new("stale").unwrap()),
        Planner::default(),
        renter,
        Arc::new(CelEngine::new(CelLimits::default())),
        Arc::new(Metrics::new()),
        None,
    );
    let pods = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let bindings = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"nodeName": node, "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    Rig {
        _ctx: ctx,
        sims,
        r,
        pods,
        bindings,
    }
}

/// The Pod, its binding as first created (nothing attempted), and the binding once placed.
async fn placed(rig: &Rig) -> (Pod, CloudPodBinding, CloudPodBinding) {
    let pod = rig.pods.get("p").await.unwrap();
    let created = rig
        .r
        .create_binding(&pod, &rig.bindings)
        .await
        .unwrap()
        .unwrap();
    rig.r
        .place(
            &pod,
            created.clone(),
            created.status.clone().unwrap_or_default(),
        )
        .await
        .unwrap();
    let placed = rig.bindings.get("p").await.unwrap();
    (pod, created, placed)
}

#[tokio::test(flavor = "multi_thread")]
async fn placing_from_a_stale_cached_binding_conflicts_and_never_rents_a_second_time() {
    let rig = rig("rec-stale-place").await;
    // `stale` is the binding as the cache first saw it: created, nothing attempted.
    let (pod, stale, placed) = Box::pin(placed(&rig)).await;
    let status = placed.status.clone().unwrap();
    assert!(status.instance_id.is_some(), "{status:?}");
    assert_eq!(rig.sims.ledger().entries.len(), 1);

    // A cache behind the API server hands the reconciler the binding without its attempts.
    let again = rig
        .r
        .place(
            &pod,
            stale.clone(),
            stale.status.clone().unwrap_or_default(),
        )
        .await;
    assert!(
        again.is_ok(),
        "a stale binding ends in a requeue: {again:?}"
    );
    assert_eq!(
        rig.sims.ledger().entries.len(),
        1,
        "rented again from a stale binding: {:?}",
        rig.sims.ledger().entries
    );
    let after = rig.bindings.get("p").await.unwrap();
    assert_eq!(
        after.status, placed.status,
        "the stale write changed the binding"
    );
    assert_eq!(after.resource_version(), placed.resource_version());
}

#[tokio::test(flavor = "multi_thread")]
async fn mirroring_from_a_stale_cached_binding_is_refused_with_a_conflict() {
    let rig = rig("rec-stale-mirror").await;
    let (_, _, current) = Box::pin(placed(&rig)).await;
    let mut status = current.status.clone().unwrap();
    // Another write lands after this copy was read (here: the test's own).
    let mut newer = status.clone();
    newer.message = Some("written by someone else".into());
    super::recorder::write_status(&rig.r.client, &current, &newer)
        .await
        .unwrap();
    status.phase = BindingPhase::Failed;
    let refused = super::recorder::write_status(&rig.r.client, &current, &status)
        .await
        .expect_err("a write from a stale binding was not refused");
    let refused = super::Error::Kube(refused);
    assert!(super::is_conflict(&refused), "{refused:?}");
    let kept = rig.bindings.get("p").await.unwrap().status.unwrap();
    assert_eq!(kept.message.as_deref(), Some("written by someone else"));
    assert_ne!(kept.phase, BindingPhase::Failed);
}

/// `neocloud_pod_time_to_running_seconds_count`, summed over its providers.
fn times_to_running(metrics: &Metrics) -> f64 {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("neocloud_pod_time_to_running_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_mirrored_again_from_a_stale_binding_is_observed_once() {
    let rig = rig("rec-stale-start").await;
    let (pod, _, _) = Box::pin(placed(&rig)).await;
    // Mirror until a pass turns the binding Running, keeping the copy that pass read.
    let mut before = None;
    for _ in 0..200 {
        let b = rig.bindings.get("p").await.unwrap();
        let status = b.status.clone().unwrap();
        rig.r.mirror(&pod, b.clone(), status).await.unwrap();
        let now = rig.bindings.get("p").await.unwrap();
        if now.status.as_ref().map(|s| s.phase) == Some(BindingPhase::Running) {
            before = Some(b);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = before.expect("the instance never ran");
    assert_eq!(times_to_running(&rig.r.metrics), 1.0);

    // A cache behind the API server hands the same pass the binding from before the start.
    let again = rig
        .r
        .mirror(&pod, before.clone(), before.status.clone().unwrap())
        .await
        .expect_err("a write from a stale binding was not refused");
    assert!(super::is_conflict(&again), "{again:?}");
    assert_eq!(
        times_to_running(&rig.r.metrics),
        1.0,
        "the start was observed a second time from a stale binding"
    );
}
