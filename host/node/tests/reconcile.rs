//! The reconciler on the real control plane with the cloud simulators: Pods bound to the node go
//! Running on each provider and are released on deletion with nothing billed after; a capacity
//! failure falls back to another provider with both attempts recorded; no offer under the max
//! price leaves the Pod Pending with nothing rented; an unsupported Pod (or one whose CEL
//! annotation mixes int and double) is refused by field; a
//! force-deleted Pod's instance is released; a restarted reconciler adopts what it rented; a
//! rental refused for capacity after its create returned is deleted and placed again.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use neocloud_broker::{Catalog, CatalogConfig};
use neocloud_cloudsim::{FaultKind, FaultRule};
use neocloud_core::InstanceState;
use neocloud_node::crd::{AttemptOutcome, BindingPhase};
use neocloud_providers::{CreateRequest, Provider, ProviderError};
use serde_json::json;

mod support;
use support::world::{World, phase, providers, reason, running};

#[tokio::test(flavor = "multi_thread")]
async fn on_each_provider_a_pod_runs_and_deleting_it_terminates_the_instance_and_billing() {
    let world = World::new("rec-each").await;
    let cases = [
        ("runpod", "A40", "on-runpod"),
        ("lambda", "A10", "on-lambda"),
        ("vast", "RTX 4090", "on-vast"),
    ];
    for (provider, gpu, name) in cases {
        world
            .create_pod(
                name,
                json!({"cloud.aibrix.ai/providers": provider, "cloud.aibrix.ai/gpu-type": gpu}),
            )
            .await;
    }
    for (provider, _, name) in cases {
        let pod = world.wait_pod(name, "Running", running).await;
        let ready = pod.status.as_ref().unwrap().conditions.as_ref().unwrap();
        assert!(
            ready
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            "{ready:?}"
        );
        // Lambda and Vast report the instance's public address: it is the Pod's IP. (RunPod
        // reports one only with published ports, which these Pods have none of.)
        if provider != "runpod" {
            let ip = pod.status.as_ref().unwrap().pod_ip.clone();
            assert!(
                ip.as_deref()
                    .is_some_and(|ip| ip.parse::<std::net::IpAddr>().is_ok()),
                "{name}: podIP {ip:?}"
            );
        }
        let b = world.binding(name).await;
        let status = b.status.clone().unwrap();
        assert_eq!(status.phase, BindingPhase::Running, "{status:?}");
        assert_eq!(status.provider.as_deref(), Some(provider));
        assert_eq!(status.attempts.len(), 1, "{:?}", status.attempts);
        assert_eq!(status.attempts[0].outcome, AttemptOutcome::Created);
        let live = world.sims.ledger();
        let entries = live.named(&b.spec.external_name);
        assert_eq!(entries.len(), 1, "one instance per pod: {entries:?}");
        assert!(entries[0].is_live());
        assert!(b.spec.external_name.starts_with("ncn-test-"));
        let events = world.events(name).await;
        assert!(
            events
                .iter()
                .any(|(r, m)| r == "Rented" && m.contains(provider)),
            "{events:?}"
        );
    }
    for (_, _, name) in cases {
        let external = world.binding(name).await.spec.external_name;
        world
            .pods()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        world.wait_gone(name).await;
        let ledger = world.sims.ledger();
        let entries = ledger.named(&external);
        assert_eq!(entries.len(), 1);
        assert!(
            entries[0].terminated_at.is_some(),
            "instance of {name} still billed: {entries:?}"
        );
    }
    let billed = world.sims.ledger().total_cost_usd();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        world.sims.ledger().total_cost_usd(),
        billed,
        "billing went on after deletion"
    );
    assert!(world.sims.ledger().live().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vast_capacity_failure_falls_back_to_runpod_with_both_attempts_recorded() {
    let world = World::new("rec-fallback").await;
    world.sims.vast.add_fault(FaultRule::next(
        "PUT /api/v0/asks/{id}/",
        10,
        FaultKind::CapacityExhausted,
    ));
    world
        .create_pod(
            "fallback",
            json!({"cloud.aibrix.ai/providers": "vast,runpod",
                "cloud.aibrix.ai/gpu-type": "RTX 4090",
                "cloud.aibrix.ai/runpod-cloud-type": "SECURE"}),
        )
        .await;
    world.wait_pod("fallback", "Running", running).await;
    let status = world.binding("fallback").await.status.unwrap();
    assert_eq!(status.provider.as_deref(), Some("runpod"), "{status:?}");
    let providers: Vec<&str> = status
        .attempts
        .iter()
        .map(|a| a.provider.as_str())
        .collect();
    assert!(
        providers.first() == Some(&"vast") && providers.last() == Some(&"runpod"),
        "{providers:?}"
    );
    let failed = &status.attempts[0];
    assert_eq!(failed.outcome, AttemptOutcome::Failed);
    assert_eq!(failed.failure_class.as_deref(), Some("capacity"));
    let events = world.events("fallback").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "RentalFailed" && m.contains("vast") && m.contains("capacity")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Rented" && m.contains("runpod")),
        "{events:?}"
    );
    let ledger = world.sims.ledger();
    assert_eq!(ledger.live().len(), 1, "{:?}", ledger.live());
    assert!(ledger.duplicate_live_names().is_empty());
    let metrics = world.metrics.encode();
    let rentals: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("neocloud_rentals_total{"))
        .collect();
    assert!(
        rentals.iter().any(|l| l.contains("provider=\"vast\"")
            && l.contains("outcome=\"failed\"")
            && l.contains("class=\"capacity\"")),
        "{rentals:?}"
    );
    assert!(
        rentals
            .iter()
            .any(|l| l.contains("provider=\"runpod\"") && l.contains("outcome=\"created\"")),
        "{rentals:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_offer_under_the_max_price_leaves_the_pod_pending_and_nothing_rented() {
    let world = World::new("rec-nooffer").await;
    world
        .create_pod(
            "too-cheap",
            json!({"cloud.aibrix.ai/gpu-type": "H100 SXM", "cloud.aibrix.ai/max-price": "0.05"}),
        )
        .await;
    let pod = world
        .wait_pod("too-cheap", "Pending with NoOffer", |p| {
            reason(p) == Some("NoOffer")
        })
        .await;
    assert_eq!(phase(&pod), Some("Pending"));
    let status = world.binding("too-cheap").await.status.unwrap();
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (BindingPhase::Pending, Some("NoOffer"))
    );
    assert!(status.attempts.is_empty(), "{:?}", status.attempts);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(world.sims.ledger().entries.is_empty());
    let events = world.events("too-cheap").await;
    assert!(events.iter().any(|(r, _)| r == "NoOffer"), "{events:?}");
    world
        .pods()
        .delete("too-cheap", &DeleteParams::default())
        .await
        .unwrap();
    world.wait_gone("too-cheap").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unsupported_pod_is_refused_by_field_and_nothing_is_rented() {
    let world = World::new("rec-unsupported").await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "two-containers"},
        "spec": {
            "nodeName": world.node,
            "containers": [
                {"name": "main", "image": "registry.invalid/cuda:12",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "sidecar", "image": "registry.invalid/proxy:1"}
            ]
        }
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let pod = world
        .wait_pod("two-containers", "refused", |p| {
            reason(p) == Some("Unsupported")
        })
        .await;
    let message = pod.status.unwrap().message.unwrap();
    assert!(message.contains("spec.containers"), "{message}");
    assert!(
        world
            .bindings()
            .get_opt("two-containers")
            .await
            .unwrap()
            .is_none()
    );
    assert!(world.sims.ledger().entries.is_empty());
    let bad_price = world
        .create_pod("bad-price", json!({"cloud.aibrix.ai/max-price": "cheap"}))
        .await;
    let pod = world
        .wait_pod(&bad_price.name_any(), "refused", |p| {
            reason(p) == Some("Unsupported")
        })
        .await;
    let message = pod.status.unwrap().message.unwrap();
    assert!(
        message.contains("cloud.aibrix.ai/max-price") && message.contains("cheap"),
        "{message}"
    );
    // int / double fails in CEL: refused when the annotation loads, not when it first runs.
    let rank = json!({"cloud.aibrix.ai/rank": "offer.gpu.memory_gib / offer.price_per_hour"});
    let mixed = world.create_pod("mixed-rank", rank).await;
    let pod = world
        .wait_pod(&mixed.name_any(), "refused", |p| {
            reason(p) == Some("Unsupported")
        })
        .await;
    let message = pod.status.unwrap().message.unwrap();
    for part in [
        "metadata.annotations[cloud.aibrix.ai/rank]",
        "at 1:22",
        "`/` is not defined for int and double",
        "double(offer.gpu.memory_gib)",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(world.sims.ledger().entries.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_outside_the_watched_namespaces_waits_unrented_until_its_namespace_is_served() {
    let mut world = World::new("rec-watch").await;
    world.kill().await;
    world.watch_namespaces = Some(vec!["gpu-jobs".into(), "research".into()]);
    world.start();
    let pod = world.create_pod("elsewhere", json!({})).await;
    let pod = world
        .wait_pod(&pod.name_any(), "refused", |p| {
            reason(p) == Some("NamespaceNotWatched")
        })
        .await;
    let message = pod.status.unwrap().message.unwrap();
    let expected = format!(
        "namespace {:?} is not one the node serves (watchNamespaces: gpu-jobs, research)",
        world.ctx.namespace
    );
    assert_eq!(message, expected);
    assert!(
        world
            .bindings()
            .get_opt("elsewhere")
            .await
            .unwrap()
            .is_none()
    );
    assert!(world.sims.ledger().entries.is_empty());
    let events = world.events("elsewhere").await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "NamespaceNotWatched"
                && note.ends_with("; nothing was rented")),
        "{events:?}"
    );

    world.kill().await;
    world.watch_namespaces = Some(vec![world.ctx.namespace.clone()]);
    world.start();
    world.wait_pod("elsewhere", "Running", running).await;
    assert_eq!(world.sims.ledger().live().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_force_deleted_pod_has_its_instance_released_and_its_binding_removed() {
    let world = World::new("rec-force").await;
    world
        .create_pod("forced", json!({"cloud.aibrix.ai/providers": "runpod"}))
        .await;
    world.wait_pod("forced", "Running", running).await;
    let external = world.binding("forced").await.spec.external_name;
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    world.pods().delete("forced", &dp).await.unwrap();
    world.wait_gone("forced").await;
    let ledger = world.sims.ledger();
    let entries = ledger.named(&external);
    assert_eq!(entries.len(), 1);
    assert!(entries[0].terminated_at.is_some(), "{entries:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reconciler_killed_at_random_points_never_rents_twice_nor_leaks() {
    let mut world = World::new("rec-restart").await;
    let names: Vec<String> = (0..4).map(|i| format!("restart-{i}")).collect();
    for name in &names {
        world
            .create_pod(name, json!({"cloud.aibrix.ai/providers": "runpod,vast"}))
            .await;
    }
    // Kill and restart the reconciler at spread-out points of the create path.
    for i in 0..12u64 {
        tokio::time::sleep(Duration::from_millis(37 * (i % 5) + 20)).await;
        world.kill().await;
        world.start();
    }
    for name in &names {
        world.wait_pod(name, "Running", running).await;
    }
    let ledger = world.sims.ledger();
    assert!(ledger.duplicate_live_names().is_empty(), "{ledger:?}");
    assert_eq!(ledger.live().len(), names.len(), "{:?}", ledger.live());
    // Delete half, killing the reconciler during the deletes.
    for name in &names[..2] {
        world
            .pods()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for i in 0..6u64 {
        tokio::time::sleep(Duration::from_millis(29 * (i % 4) + 15)).await;
        world.kill().await;
        world.start();
    }
    for name in &names[..2] {
        world.wait_gone(name).await;
    }
    let ledger = world.sims.ledger();
    let live: Vec<&str> = ledger.live().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(live.len(), 2, "{live:?}");
    for name in &names[2..] {
        let external = world.binding(name).await.spec.external_name;
        assert!(
            live.contains(&external.as_str()),
            "{live:?} lacks {external}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_deleted_while_its_rental_is_in_flight_leaves_nothing_behind() {
    let world = World::new("rec-inflight").await;
    world.sims.vast.add_fault(FaultRule::next(
        "PUT /api/v0/asks/{id}/",
        1,
        FaultKind::Slow { delay_ms: 3000 },
    ));
    world
        .create_pod("in-flight", json!({"cloud.aibrix.ai/providers": "vast"}))
        .await;
    // Wait until the attempt is written (the provider call is then under way), then delete.
    for _ in 0..300 {
        let b = world.bindings().get_opt("in-flight").await.unwrap();
        if b.and_then(|b| b.status)
            .is_some_and(|s| !s.attempts.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let external = world.binding("in-flight").await.spec.external_name;
    world
        .pods()
        .delete("in-flight", &DeleteParams::default())
        .await
        .unwrap();
    world.wait_gone("in-flight").await;
    let ledger = world.sims.ledger();
    let entries = ledger.named(&external);
    assert!(
        entries.iter().all(|e| e.terminated_at.is_some()),
        "an instance outlived its deleted pod: {entries:?}"
    );
    assert_eq!(entries.len(), 1, "the slow create did rent: {entries:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_naming_a_burst_policy_is_placed_by_it_and_a_missing_policy_waits() {
    let world = World::new("rec-policy").await;
    let policy: neocloud_node::crd::BurstPolicy = serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": format!("vast-only-{}", world.ctx.namespace)},
        "spec": {"cel": {"constraints": "offer.provider == \"vast\"",
            "rank": "double(offer.gpu.memory_gib)"}}
    }))
    .unwrap();
    let name = policy.metadata.name.clone().unwrap();
    Api::<neocloud_node::crd::BurstPolicy>::all(world.ctx.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    // Without the policy the cheapest fitting offer would be RunPod's community RTX 4090.
    world
        .create_pod(
            "by-policy",
            json!({"cloud.aibrix.ai/policy": name, "cloud.aibrix.ai/gpu-type": "RTX 4090",
                "cloud.aibrix.ai/providers": "runpod,vast"}),
        )
        .await;
    world.wait_pod("by-policy", "Running", running).await;
    let status = world.binding("by-policy").await.status.unwrap();
    assert_eq!(status.provider.as_deref(), Some("vast"), "{status:?}");
    let events = world.events("by-policy").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Rented" && m.contains(&format!("under policy {name} (sha256:"))),
        "{events:?}"
    );

    world
        .create_pod(
            "no-policy",
            json!({"cloud.aibrix.ai/policy": "does-not-exist"}),
        )
        .await;
    let pod = world
        .wait_pod("no-policy", "waiting for its policy", |p| {
            reason(p) == Some("PolicyNotLoaded")
        })
        .await;
    let message = pod.status.unwrap().message.unwrap();
    assert!(
        message.contains("BurstPolicy does-not-exist does not exist"),
        "{message}"
    );
    let external = world.binding("no-policy").await.spec.external_name;
    assert!(world.sims.ledger().named(&external).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_preempted_instance_is_replaced_unless_the_pod_never_restarts() {
    let world = World::new("rec-replace").await;
    // A spot instance on Vast.ai, which the provider may reclaim; an on-demand RunPod pod.
    let spot =
        json!({"cloud.aibrix.ai/providers": "vast", "cloud.aibrix.ai/capacity-type": "spot"});
    world.create_pod_restarting("always", spot, "Always").await;
    world
        .create_pod("never", json!({"cloud.aibrix.ai/providers": "runpod"}))
        .await;
    for name in ["always", "never"] {
        world.wait_pod(name, "Running", running).await;
    }
    let first = world
        .binding("always")
        .await
        .status
        .unwrap()
        .instance_id
        .unwrap();
    let never = world
        .binding("never")
        .await
        .status
        .unwrap()
        .instance_id
        .unwrap();
    assert!(world.sims.vast.preempt(&first));
    assert!(world.sims.runpod.preempt(&never));

    // An on-demand instance that stopped by itself is not a preemption.
    let pod = world
        .wait_pod("never", "Failed", |p| phase(p) == Some("Failed"))
        .await;
    assert_eq!(reason(&pod), Some("InstanceStopped"));
    assert!(preempted(&pod).is_none(), "{:?}", pod.status);
    let replaced = world
        .wait_pod("always", "Running on a new instance", running)
        .await;
    assert!(running(&replaced));
    let mut status = world.binding("always").await.status.unwrap();
    for _ in 0..100 {
        if status.instance_id.as_deref().is_some_and(|i| i != first)
            && status.phase == BindingPhase::Running
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = world.binding("always").await.status.unwrap();
    }
    let second = status.instance_id.clone().unwrap();
    assert_ne!(second, first, "{status:?}");
    // The Pod says its container was started again once.
    let restarted = world
        .wait_pod("always", "restartCount 1", |p| {
            running(p)
                && p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .is_some_and(|c| c.restart_count == 1)
        })
        .await;
    assert!(running(&restarted));
    let outcomes: Vec<(AttemptOutcome, Option<&str>)> = status
        .attempts
        .iter()
        .map(|a| (a.outcome, a.failure_class.as_deref()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (AttemptOutcome::Failed, Some("preempted")),
            (AttemptOutcome::Created, None)
        ]
    );
    let events = world.events("always").await;
    assert!(events.iter().any(|(r, _)| r == "Replacing"), "{events:?}");
    let said = events.iter().find(|(r, _)| r == "Preempted");
    assert!(
        said.is_some_and(|(_, m)| m.contains("was reclaimed by vast")),
        "{events:?}"
    );
    // The Pod says so in a condition, which later status writes keep.
    let condition = preempted(&restarted).unwrap_or_else(|| panic!("{:?}", restarted.status));
    assert_eq!(condition.status, "True");
    assert_eq!(condition.reason.as_deref(), Some("SpotReclaimed"));
    let message = condition.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("reclaimed 1 time(s); the last: "),
        "{message}"
    );
    let ledger = world.sims.ledger();
    let live: Vec<&str> = ledger
        .live()
        .iter()
        .map(|e| e.instance_id.as_str())
        .collect();
    assert_eq!(
        live,
        vec![second.as_str()],
        "old or never-restarting instances still billed"
    );
}

/// The Pod's `cloud.aibrix.ai/Preempted` condition.
fn preempted(pod: &Pod) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "cloud.aibrix.ai/Preempted")
        .cloned()
}

/// A policy in the Pod's own CEL: spot while it has been reclaimed fewer than two times, then
/// on-demand only.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_moves_a_pod_to_on_demand_after_two_preemptions() {
    let world = World::new("rec-spot2").await;
    let annotations = json!({
        "cloud.aibrix.ai/providers": "vast",
        "cloud.aibrix.ai/capacity-type": "any",
        "cloud.aibrix.ai/constraints":
            "!offer.spot || attempts.filter(a, a.failure_class == 'preempted').size() < 2",
        // Spot first, the cheapest of each kind first.
        "cloud.aibrix.ai/rank": "(offer.spot ? 1000.0 : 0.0) - offer.price_per_hour",
    });
    world
        .create_pod_restarting("job", annotations, "Always")
        .await;
    let mut seen = Vec::new();
    for round in 0..3 {
        let status = wait_for_new_instance(&world, "job", &seen).await;
        let id = status.instance_id.clone().unwrap();
        let ledger = world.sims.ledger();
        let live = ledger.live();
        let entry = live
            .iter()
            .find(|e| e.instance_id == id)
            .unwrap_or_else(|| panic!("{id} not billed: {live:?}"));
        if round < 2 {
            assert!(
                entry.spot,
                "round {round}: spot first: {entry:?} {:?}",
                status.message
            );
            assert!(world.sims.vast.preempt(&id));
        } else {
            assert!(!entry.spot, "after two reclaims, on-demand: {entry:?}");
        }
        seen.push(id);
    }
    let status = world.binding("job").await.status.unwrap();
    let classes: Vec<Option<&str>> = status
        .attempts
        .iter()
        .map(|a| a.failure_class.as_deref())
        .collect();
    assert_eq!(classes, vec![Some("preempted"), Some("preempted"), None]);
    let pod = world.wait_pod("job", "Running", running).await;
    let message = preempted(&pod).and_then(|c| c.message).unwrap_or_default();
    assert!(message.starts_with("reclaimed 2 time(s)"), "{message}");
}

/// Waits until the binding runs an instance not in `seen`; its status.
async fn wait_for_new_instance(
    world: &World,
    name: &str,
    seen: &[String],
) -> neocloud_node::crd::CloudPodBindingStatus {
    for _ in 0..300 {
        if let Some(status) = world
            .bindings()
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|b| b.status)
            && status.phase == BindingPhase::Running
            && status
                .instance_id
                .as_ref()
                .is_some_and(|i| !seen.contains(i))
        {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} never ran on an instance other than {seen:?}");
}

/// A provider whose scheduler decides late: its first rental reads as refused for capacity
/// (`Unschedulable`, as a remote cluster's Pod no node fits once its create has returned) until
/// it is deleted; everything else is the RunPod simulator's adapter.
#[derive(Debug)]
struct LateRefusal {
    inner: std::sync::Arc<dyn Provider>,
    refused: std::sync::Mutex<Option<String>>,
    deleted: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Provider for LateRefusal {
    fn id(&self) -> neocloud_core::ProviderId {
        self.inner.id()
    }
    async fn list_offers(
        &self,
        query: &neocloud_core::OfferQuery,
    ) -> Result<Vec<neocloud_core::Offer>, ProviderError> {
        self.inner.list_offers(query).await
    }
    async fn create(&self, request: &CreateRequest) -> Result<InstanceState, ProviderError> {
        let created = self.inner.create(request).await?;
        let mut refused = self.refused.lock().unwrap();
        if refused.is_none() && self.deleted.lock().unwrap().is_empty() {
            *refused = Some(created.id.clone());
        }
        Ok(created)
    }
    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError> {
        let state = self.inner.get(id).await?;
        let refused = self.refused.lock().unwrap().as_deref() == Some(id);
        Ok(state.map(|mut s| {
            if refused {
                s.phase = neocloud_core::InstancePhase::Pending;
                s.provider_status = neocloud_core::UNSCHEDULABLE.to_owned();
                s.message = Some("0/3 nodes are available: 3 Insufficient nvidia.com/gpu".into());
            }
            s
        }))
    }
    async fn find_by_name(&self, name: &str) -> Result<Option<InstanceState>, ProviderError> {
        self.inner.find_by_name(name).await
    }
    async fn list_ours(&self, prefix: &str) -> Result<Vec<InstanceState>, ProviderError> {
        self.inner.list_ours(prefix).await
    }
    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        self.inner.delete(id).await?;
        self.deleted.lock().unwrap().push(id.to_owned());
        let mut refused = self.refused.lock().unwrap();
        if refused.as_deref() == Some(id) {
            *refused = None;
        }
        Ok(())
    }
    async fn health(&self) -> Result<(), ProviderError> {
        self.inner.health().await
    }
}

/// A rental its provider refuses for capacity after the create returned (a remote cluster's
/// scheduler deciding late) is not waited on for ever: the instance is deleted, its attempt
/// records the capacity failure, and the Pod is placed again and runs, with nothing leaked.
#[tokio::test(flavor = "multi_thread")]
async fn a_rental_refused_for_capacity_after_it_returned_is_deleted_and_placed_again() {
    let mut world = World::new("rec-late-refusal").await;
    let late = std::sync::Arc::new(LateRefusal {
        inner: providers(&world.sims).remove(0),
        refused: std::sync::Mutex::new(None),
        deleted: std::sync::Mutex::new(Vec::new()),
    });
    world.renter.catalog = Catalog::new(
        vec![late.clone() as std::sync::Arc<dyn Provider>],
        CatalogConfig {
            ttl: Duration::from_millis(200),
            fetch_timeout: Duration::from_secs(10),
        },
    );
    world.kill().await;
    world.start();
    world
        .create_pod(
            "late",
            json!({"cloud.aibrix.ai/providers": "runpod", "cloud.aibrix.ai/gpu-type": "A40"}),
        )
        .await;
    world.wait_pod("late", "Running", running).await;
    let status = world.binding("late").await.status.unwrap();
    let first = &status.attempts[0];
    assert_eq!(
        (first.outcome, first.failure_class.as_deref()),
        (AttemptOutcome::Failed, Some("capacity")),
        "{:#?}",
        status.attempts
    );
    let said = first.message.clone().unwrap_or_default();
    assert!(
        said.contains("was refused: Unschedulable: 0/3 nodes"),
        "{said}"
    );
    assert_eq!(
        status.attempts.last().unwrap().outcome,
        AttemptOutcome::Created
    );
    let deleted = late.deleted.lock().unwrap().clone();
    assert_eq!(deleted.len(), 1, "the refused instance, once: {deleted:?}");
    assert_ne!(status.instance_id.as_deref(), Some(deleted[0].as_str()));
    let events = world.events("late").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Capacity" && m.contains("trying the next offer")),
        "{events:?}"
    );
    let ledger = world.sims.ledger();
    assert_eq!(ledger.live().len(), 1, "{:?}", ledger.live());
    assert!(ledger.duplicate_live_names().is_empty());
}
