//! A Pod nobody can restart in place (no runner: the provider runs the container itself) whose
//! machine stops by itself is rented again only after kubelet's back-off (10 s before the first
//! re-rental), and the event says what the Pod has cost so far; the reconciler on the real
//! control plane, RunPod's simulator. A BurstPolicy's `maxReplacements` caps the re-rentals.

use kube::Api;
use kube::api::PostParams;
use neocloud_node::crd::{BindingPhase, BurstPolicy};
use serde_json::json;

mod support;
use support::world::{World, phase, reason, running};

/// Creates Pod `name` (`restartPolicy: Always`) on RunPod, waits for it to run, then stops its
/// on-demand machine by itself (as a container provider stops one whose process exited).
async fn run_then_stop(world: &World, name: &str, annotations: serde_json::Value) {
    world
        .create_pod_restarting(name, annotations, "Always")
        .await;
    world.wait_pod(name, "Running", running).await;
    let first = world
        .binding(name)
        .await
        .status
        .unwrap()
        .instance_id
        .unwrap();
    assert!(world.sims.runpod.preempt(&first));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_machine_without_a_runner_is_rented_again_after_a_back_off_naming_the_spend() {
    let world = World::new("rerent").await;
    let annotations = json!({"cloud.aibrix.ai/providers": "runpod"});
    run_then_stop(&world, "job", annotations).await;

    let waiting = world
        .wait_pod("job", "backing off", |p| reason(p) == Some("BackOff"))
        .await;
    let message = waiting
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("renting another instance in 10s")
            && message.contains("spent on this pod so far"),
        "{message}"
    );
    let events = world.events("job").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "BackOff" && m.contains("$") && m.contains("spent on this pod")),
        "{events:?}"
    );

    // Nothing is rented during the back-off; then one instance is.
    let binding = world.binding("job").await.status.unwrap();
    assert_eq!(binding.phase, BindingPhase::Pending);
    assert_eq!(binding.instance_id, None);
    world.wait_pod("job", "Running again", running).await;
    let ledger = world.sims.runpod.ledger();
    assert_eq!(ledger.entries.len(), 2, "{ledger:?}");
    let stopped = ledger.entries[0].terminated_at.expect("the first is gone");
    let again = ledger.entries[1].created_at;
    let waited = (again - stopped).num_milliseconds() as f64 / 1000.0;
    assert!(
        waited >= 8.0,
        "rented again {waited:.1}s after the first machine was released, not after 10s: {ledger:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_policy_s_max_replacements_caps_the_rentals_of_its_pods() {
    let world = World::new("rerent-cap").await;
    let policy: BurstPolicy = serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": format!("no-second-machine-{}", world.ctx.namespace)},
        "spec": {"cel": {"rank": "1.0"}, "maxReplacements": 0}
    }))
    .unwrap();
    let name = policy.metadata.name.clone().unwrap();
    Api::<BurstPolicy>::all(world.ctx.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let annotations =
        json!({"cloud.aibrix.ai/providers": "runpod", "cloud.aibrix.ai/policy": name});
    run_then_stop(&world, "capped", annotations).await;

    // No replacement allowed: the Pod fails instead of renting again.
    let pod = world
        .wait_pod("capped", "Failed", |p| phase(p) == Some("Failed"))
        .await;
    assert_eq!(reason(&pod), Some("InstanceStopped"), "{:?}", pod.status);
    assert_eq!(world.sims.runpod.ledger().entries.len(), 1);
}
