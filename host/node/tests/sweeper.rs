//! The orphan sweeper against a real API server and the cloud simulators: an instance rented
//! behind the node's back under our prefix is deleted at RunPod, Vast.ai and Lambda, while one
//! with a binding, one of another cluster, one in its grace period and one seen by a dry run are
//! kept. A failing provider does not stop the others, a failed binding list deletes nothing, and
//! `run` waits for the node's caches before its first sweep. A RunPod registry credential under
//! our prefix that no binding or live pod carries is deleted on the sweep after first sight.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, PostParams};
use neocloud_cloudsim::{CloudSim, FaultKind, FaultRule};
use neocloud_node::crd::{self, CloudPodBinding};
use neocloud_node::naming::ClusterId;
use neocloud_node::sweeper::{SweepReport, Sweeper, SweeperConfig};
use neocloud_providers::{HttpConfig, Operation, Provider};
use neocloud_testenv::TestContext;
use serde_json::json;

mod support;
use support::{fast_sims, rent, sim_providers};

const CLUSTER: &str = "sweeptest";
const HOUR: Duration = Duration::from_secs(3600);

struct Rig {
    ctx: TestContext,
    sims: CloudSim,
    runpod: Arc<dyn Provider>,
    vast: Arc<dyn Provider>,
    lambda: Arc<dyn Provider>,
}

fn http() -> HttpConfig {
    HttpConfig {
        timeout_ms: 5_000,
        connect_timeout_ms: 1_000,
        max_attempts: 2,
        backoff_ms: 10,
        max_retry_wait_ms: 20,
        ..HttpConfig::default()
    }
}

async fn rig(test: &str) -> Rig {
    let ctx = TestContext::new(test).await;
    crd::install(&ctx.client, "neocloud-node-tests", Duration::from_secs(30))
        .await
        .unwrap();
    let sims = fast_sims().await;
    let p = sim_providers(&sims, Some(http()));
    Rig {
        runpod: p.runpod,
        vast: p.vast,
        lambda: p.lambda,
        ctx,
        sims,
    }
}

impl Rig {
    /// An external name unique to this test: `<cluster prefix><tag>-<namespace suffix>`.
    fn name(&self, cluster: &str, tag: &str) -> String {
        let ns = &self.ctx.namespace;
        let suffix = &ns[ns.len() - 6..];
        ClusterId::new(cluster)
            .unwrap()
            .external_name(&format!("{tag}-{suffix}"))
    }

    fn sweeper(&self, providers: &[&Arc<dyn Provider>], config: SweeperConfig) -> Sweeper {
        let providers = providers.iter().map(|p| Arc::clone(p)).collect();
        let cluster = ClusterId::new(CLUSTER).unwrap();
        Sweeper::new(self.ctx.client.clone(), providers, cluster, config)
    }

    /// Whether the simulators' ledger holds a live instance with this name.
    fn live(&self, name: &str) -> bool {
        self.sims.ledger().named(name).iter().any(|e| e.is_live())
    }

    /// A binding in the test's namespace for `external_name`, as the reconciler writes it.
    async fn bind(&self, pod: &str, external_name: &str) {
        let binding: CloudPodBinding = serde_json::from_value(json!({
            "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "CloudPodBinding",
            "metadata": {"name": pod},
            "spec": {
                "podName": pod, "podUid": format!("uid-{pod}"),
                "externalName": external_name, "clusterId": CLUSTER,
                "workload": {"image": "registry.invalid/cuda:12", "gpuCount": 1,
                    "capacityType": "on-demand"}
            }
        }))
        .unwrap();
        let bindings: Api<CloudPodBinding> = self.ctx.namespaced();
        bindings
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
}

fn no_grace() -> SweeperConfig {
    SweeperConfig {
        grace: Duration::ZERO,
        ..SweeperConfig::default()
    }
}

fn names(entries: &[neocloud_node::sweeper::SweptInstance]) -> Vec<&str> {
    entries.iter().map(|e| e.external_name.as_str()).collect()
}

fn assert_deleted_nothing(report: &SweepReport) {
    assert!(report.deleted.is_empty(), "{report:#?}");
    assert!(report.failures.is_empty(), "{report:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unbound_instance_with_our_prefix_is_deleted_at_runpod_and_vast() {
    let rig = rig("sweep-orphan").await;
    let rp_name = rig.name(CLUSTER, "orphan-rp");
    let va_name = rig.name(CLUSTER, "orphan-va");
    let rp = rent(&rig.runpod, &rp_name).await;
    let va = rent(&rig.vast, &va_name).await;
    assert!(rig.live(&rp_name) && rig.live(&va_name));

    let report = rig
        .sweeper(&[&rig.runpod, &rig.vast], no_grace())
        .sweep_once()
        .await
        .unwrap();

    let mut deleted: Vec<(String, &str)> = report
        .deleted
        .iter()
        .map(|e| (e.id.clone(), e.external_name.as_str()))
        .collect();
    deleted.sort();
    let mut want = vec![(rp.id, rp_name.as_str()), (va.id, va_name.as_str())];
    want.sort();
    assert_eq!(deleted, want, "{report:#?}");
    assert!(report.failures.is_empty(), "{report:#?}");
    assert!(!rig.live(&rp_name), "runpod still bills {rp_name}");
    assert!(!rig.live(&va_name), "vast still bills {va_name}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_whose_provider_gives_no_creation_time_is_deleted_on_the_sweep_after_first_sight()
{
    let rig = rig("sweep-lambda").await;
    let name = rig.name(CLUSTER, "orphan-la");
    let instance = rent(&rig.lambda, &name).await;
    let sweeper = rig.sweeper(&[&rig.lambda], no_grace());

    let first = sweeper.sweep_once().await.unwrap();
    assert_eq!(names(&first.kept_in_grace), [name.as_str()], "{first:#?}");
    assert_deleted_nothing(&first);
    assert!(rig.live(&name));

    let second = sweeper.sweep_once().await.unwrap();
    assert_eq!(names(&second.deleted), [name.as_str()], "{second:#?}");
    assert_eq!(second.deleted[0].id, instance.id);
    assert!(!rig.live(&name), "lambda still bills {name}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_whose_binding_names_it_is_kept() {
    let rig = rig("sweep-bound").await;
    let bound_rp = rig.name(CLUSTER, "bound-rp");
    let bound_va = rig.name(CLUSTER, "bound-va");
    let orphan = rig.name(CLUSTER, "orphan-va");
    rig.bind("job-rp", &bound_rp).await;
    rig.bind("job-va", &bound_va).await;
    let rp = rent(&rig.runpod, &bound_rp).await;
    let va = rent(&rig.vast, &bound_va).await;
    rent(&rig.vast, &orphan).await;

    let report = rig
        .sweeper(&[&rig.runpod, &rig.vast], no_grace())
        .sweep_once()
        .await
        .unwrap();

    let mut kept = names(&report.kept_bound);
    kept.sort();
    let mut want = [bound_rp.as_str(), bound_va.as_str()];
    want.sort();
    assert_eq!(kept, want, "{report:#?}");
    assert_eq!(names(&report.deleted), [orphan.as_str()], "{report:#?}");
    assert!(rig.live(&bound_rp) && rig.live(&bound_va));
    assert!(!rig.live(&orphan));

    rig.runpod.delete(&rp.id).await.unwrap();
    rig.vast.delete(&va.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn another_clusters_instances_are_kept_even_when_its_id_starts_like_ours() {
    let rig = rig("sweep-other").await;
    let other = rig.name("other", "job");
    let longer = rig.name(&format!("{CLUSTER}x"), "job");
    let mut rented = vec![];
    for provider in [&rig.runpod, &rig.vast] {
        rented.push((provider, rent(provider, &other).await));
        rented.push((provider, rent(provider, &longer).await));
    }

    let report = rig
        .sweeper(&[&rig.runpod, &rig.vast], no_grace())
        .sweep_once()
        .await
        .unwrap();

    assert_deleted_nothing(&report);
    assert!(report.kept_in_grace.is_empty(), "{report:#?}");
    assert!(report.kept_bound.is_empty(), "{report:#?}");
    let live = rig.sims.ledger();
    assert_eq!(live.live().len(), 4, "{live:#?}");
    for (provider, instance) in rented {
        provider.delete(&instance.id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_reports_orphans_it_would_delete_and_deletes_nothing() {
    let rig = rig("sweep-dry").await;
    let rp_name = rig.name(CLUSTER, "dry-rp");
    let va_name = rig.name(CLUSTER, "dry-va");
    let rp = rent(&rig.runpod, &rp_name).await;
    let va = rent(&rig.vast, &va_name).await;
    let config = SweeperConfig {
        dry_run: true,
        ..no_grace()
    };

    let report = rig
        .sweeper(&[&rig.runpod, &rig.vast], config)
        .sweep_once()
        .await
        .unwrap();

    let mut would = names(&report.would_delete);
    would.sort();
    let mut want = [rp_name.as_str(), va_name.as_str()];
    want.sort();
    assert_eq!(would, want, "{report:#?}");
    assert_deleted_nothing(&report);
    assert!(rig.live(&rp_name) && rig.live(&va_name));
    rig.runpod.delete(&rp.id).await.unwrap();
    rig.vast.delete(&va.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_younger_than_the_grace_period_is_kept() {
    let rig = rig("sweep-grace").await;
    let rp_name = rig.name(CLUSTER, "young-rp");
    let va_name = rig.name(CLUSTER, "young-va");
    let rp = rent(&rig.runpod, &rp_name).await;
    let va = rent(&rig.vast, &va_name).await;
    let config = SweeperConfig {
        grace: HOUR,
        ..SweeperConfig::default()
    };

    let report = rig
        .sweeper(&[&rig.runpod, &rig.vast], config)
        .sweep_once()
        .await
        .unwrap();

    let mut young = names(&report.kept_in_grace);
    young.sort();
    let mut want = [rp_name.as_str(), va_name.as_str()];
    want.sort();
    assert_eq!(young, want, "{report:#?}");
    assert!(report.kept_in_grace.iter().all(|e| e.age < Some(HOUR)));
    assert_deleted_nothing(&report);
    assert!(rig.live(&rp_name) && rig.live(&va_name));
    rig.runpod.delete(&rp.id).await.unwrap();
    rig.vast.delete(&va.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_provider_is_reported_and_the_others_are_still_swept() {
    let rig = rig("sweep-fault").await;
    let rp_name = rig.name(CLUSTER, "orphan-rp");
    let va_name = rig.name(CLUSTER, "orphan-va");
    let la_name = rig.name(CLUSTER, "orphan-la");
    let rp = rent(&rig.runpod, &rp_name).await;
    let va = rent(&rig.vast, &va_name).await;
    rent(&rig.lambda, &la_name).await;
    let down = FaultKind::ServerError { status: 503 };
    rig.sims
        .runpod
        .add_fault(FaultRule::next("GET /v2/pods", 10, down.clone()));
    rig.sims
        .vast
        .add_fault(FaultRule::next("DELETE /api/v0/instances/{id}/", 10, down));
    let sweeper = rig.sweeper(&[&rig.runpod, &rig.vast, &rig.lambda], no_grace());

    sweeper.sweep_once().await.unwrap(); // Lambda's first sight.
    let report = sweeper.sweep_once().await.unwrap();

    assert_eq!(names(&report.deleted), [la_name.as_str()], "{report:#?}");
    assert!(!rig.live(&la_name), "lambda still bills {la_name}");
    let listing = report
        .failures
        .iter()
        .find(|f| f.instance.is_none())
        .expect("the runpod list failure is reported");
    assert_eq!(listing.provider.as_str(), "runpod");
    assert_eq!(listing.error.operation, Operation::ListOurs);
    let deleting = report
        .failures
        .iter()
        .find_map(|f| f.instance.as_ref())
        .expect("the vast delete failure is reported with its instance");
    assert_eq!(
        (deleting.id.as_str(), deleting.external_name.as_str()),
        (va.id.as_str(), va_name.as_str())
    );
    assert_eq!(report.failures.len(), 2, "{report:#?}");
    assert!(rig.live(&rp_name) && rig.live(&va_name));

    rig.sims.runpod.clear_faults();
    rig.sims.vast.clear_faults();
    rig.runpod.delete(&rp.id).await.unwrap();
    rig.vast.delete(&va.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn when_bindings_cannot_be_listed_nothing_is_deleted() {
    let rig = rig("sweep-forbidden").await;
    let name = rig.name(CLUSTER, "orphan-rp");
    let rp = rent(&rig.runpod, &name).await;
    let stranger = rig
        .ctx
        .control_plane
        .client_as("sweeper-without-rbac", &[])
        .await
        .unwrap();
    let cluster = ClusterId::new(CLUSTER).unwrap();
    let sweeper = Sweeper::new(stranger, vec![rig.runpod.clone()], cluster, no_grace());

    let error = sweeper.sweep_once().await.unwrap_err().to_string();

    assert!(
        error.starts_with("failed to list CloudPodBindings in all namespaces"),
        "{error}"
    );
    assert!(error.contains("forbidden"), "{error}");
    assert!(
        rig.live(&name),
        "an instance was deleted without a binding list"
    );
    rig.runpod.delete(&rp.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn run_sweeps_only_after_the_caches_are_synced() {
    let rig = rig("sweep-run").await;
    let name = rig.name(CLUSTER, "orphan-va");
    rent(&rig.vast, &name).await;
    let config = SweeperConfig {
        interval: Duration::from_secs(1),
        ..no_grace()
    };
    let sweeper = rig.sweeper(&[&rig.vast], config);
    let (synced, wait) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(sweeper.run(async move {
        let _ = wait.await;
    }));

    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(rig.live(&name), "run swept before the caches were synced");
    synced.send(()).unwrap();
    for _ in 0..100 {
        if !rig.live(&name) {
            task.abort();
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    task.abort();
    panic!("run did not delete the orphan within 10s of the caches syncing");
}

/// Creates a RunPod registry credential named `name`, as a rental of that name would.
async fn credential(rig: &Rig, name: &str) {
    let url = format!("{}/v2/registries", rig.sims.runpod.base_url());
    let body = json!({"name": name, "username": "bot", "password": "pw"});
    let client = reqwest::Client::new();
    let sent = client
        .post(url)
        .bearer_auth(rig.sims.runpod.api_key())
        .json(&body);
    assert_eq!(sent.send().await.unwrap().status(), 201);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_runpod_registry_credential_is_deleted_on_the_sweep_after_first_sight() {
    let rig = rig("sweep-cred").await;
    let stale = rig.name(CLUSTER, "cred-stale");
    let bound = rig.name(CLUSTER, "cred-bound");
    let other = rig.name("othercluster", "cred-other");
    for name in [&stale, &bound, &other] {
        credential(&rig, name).await;
    }
    rig.bind("job-cred", &bound).await;
    let sweeper = rig.sweeper(&[&rig.runpod], no_grace());

    let first = sweeper.sweep_once().await.unwrap();
    assert!(first.credentials_deleted.is_empty(), "{first:#?}");
    let second = sweeper.sweep_once().await.unwrap();
    assert_eq!(
        names(&second.credentials_deleted),
        [stale.as_str()],
        "{second:#?}"
    );
    assert!(second.failures.is_empty(), "{second:#?}");
    let mut left = rig.sims.runpod.registry_names();
    left.sort();
    let mut want = vec![bound, other];
    want.sort();
    assert_eq!(left, want);
}
