//! Gangs without Kueue (`cloud.aibrix.ai/gang` and `cloud.aibrix.ai/gang-size`), the reconciler
//! on the real control plane with the three cloud simulators: a gang of four waits with three
//! members and rents nothing, then rents all four in one provider and region; a capacity
//! shortfall after two of four rentals releases both and the gang lands once capacity is back;
//! a gang the budget cannot pay for whole rents nothing; bad annotations are refused by name; a
//! reclaimed member is replaced in the gang's place (or, if it cannot be, the whole gang moves);
//! a fallback policy that gives up on a reclaim ends the whole gang, and the sample JavaScript
//! fallback replaces a first reclaim and ends the gang on a second. Every test reads the
//! simulators' ledgers.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use neocloud_cloudsim::CloudSim;
use serde_json::json;

mod support;
use support::world::{World, reason, running};

fn gang(name: &str, size: &str, more: serde_json::Value) -> serde_json::Value {
    let mut a = json!({"cloud.aibrix.ai/gang": name, "cloud.aibrix.ai/gang-size": size});
    if let (Some(a), serde_json::Value::Object(more)) = (a.as_object_mut(), more) {
        a.extend(more);
    }
    a
}

fn message(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

/// The provider and region of every live instance in the simulators' ledgers.
fn live_places(sims: &CloudSim) -> Vec<(String, String)> {
    let ledger = sims.ledger();
    let regions = |provider: &str, offer: u64| -> String {
        let offers = match provider {
            "runpod" => sims.runpod.offers(),
            "lambda" => sims.lambda.offers(),
            _ => sims.vast.offers(),
        };
        let found = offers.into_iter().find(|o| o.id == offer);
        found.map(|o| o.config.region).unwrap_or_default()
    };
    ledger
        .live()
        .iter()
        .map(|e| (e.provider.clone(), regions(&e.provider, e.offer_id)))
        .collect()
}

/// Sets the remaining capacity of RunPod's A40 offer in `region`.
fn a40_capacity(sims: &CloudSim, region: &str, available: u32) {
    let offers = sims.runpod.offers();
    let offer = offers
        .iter()
        .find(|o| o.config.gpu == "NVIDIA A40" && o.config.region == region)
        .expect("the RunPod simulator sells A40s there");
    assert!(sims.runpod.set_capacity(offer.id, available));
}

/// Waits up to 30 s for the simulators to hold no live instance (the callers assert it).
async fn wait_released(world: &World) {
    for _ in 0..300 {
        if world.sims.ledger().live().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_all(world: &World, names: &[&str], what: &str, f: impl Fn(&Pod) -> bool + Copy) {
    for name in names {
        world.wait_pod(name, what, f).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gang_of_four_waits_for_its_fourth_member_then_rents_all_four_in_one_place() {
    let world = World::new("gang-four").await;
    let names = ["w-0", "w-1", "w-2", "w-3"];
    for name in &names[..3] {
        world.create_pod(name, gang("train", "4", json!({}))).await;
    }
    wait_all(&world, &names[..3], "waiting for its gang", |p| {
        reason(p) == Some("GangWaiting") && message(p).contains("3 of 4 have arrived")
    })
    .await;
    // Waiting rents nothing, however long it waits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        world.sims.ledger().entries.is_empty(),
        "{:?}",
        world.sims.ledger()
    );
    let w0 = world
        .wait_pod("w-0", "still waiting", |p| reason(p) == Some("GangWaiting"))
        .await;
    assert!(
        message(&w0).contains("waiting for the members of gang train: 3 of 4"),
        "{}",
        message(&w0)
    );

    world.create_pod("w-3", gang("train", "4", json!({}))).await;
    wait_all(&world, &names, "Running", running).await;
    let places = live_places(&world.sims);
    assert_eq!(places.len(), 4, "{:?}", world.sims.ledger());
    let distinct: BTreeSet<_> = places.iter().collect();
    assert_eq!(distinct.len(), 1, "one provider and region: {places:?}");
    assert!(world.sims.ledger().duplicate_live_names().is_empty());
    for name in names {
        let b = world.binding(name).await.status.unwrap();
        assert_eq!(b.provider.as_deref(), Some(places[0].0.as_str()), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capacity_shortfall_partway_releases_every_member_and_the_gang_lands_when_it_is_back() {
    let mut world = World::new("gang-fault").await;
    // A round that breaks waits 3 s before the next: long enough to read the ledger between.
    world.retry_interval = Duration::from_secs(3);
    world.kill().await;
    world.start();
    // RunPod sells A40s in two data centers; each has room for two now.
    a40_capacity(&world.sims, "CA-MTL-1", 2);
    a40_capacity(&world.sims, "EU-SE-1", 2);
    let names = ["w-0", "w-1", "w-2", "w-3"];
    let only = json!({"cloud.aibrix.ai/providers": "runpod", "cloud.aibrix.ai/gpu-type": "A40"});
    for name in names {
        world
            .create_pod(name, gang("nccl", "4", only.clone()))
            .await;
    }
    // Two rentals succeed, the third is refused for capacity: the two are released.
    let mut released = false;
    for _ in 0..600 {
        let ledger = world.sims.ledger();
        if ledger.entries.len() >= 2 && ledger.live().is_empty() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        released,
        "never saw the round released: {:?}",
        world.sims.ledger()
    );
    // The Pods say so soon after (each status is written after its release is confirmed).
    let mut said = Vec::new();
    for _ in 0..40 {
        let pods = world.pods().list(&Default::default()).await.unwrap();
        said = (pods.items.iter())
            .map(|p| (running(p), reason(p).map(str::to_owned)))
            .collect();
        let retrying = said
            .iter()
            .any(|(_, r)| r.as_deref() == Some("GangRetrying"));
        if retrying && said.iter().all(|(run, _)| !run) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        said.iter().all(|(run, _)| !run),
        "no member runs alone: {said:?}"
    );
    assert!(
        said.iter()
            .any(|(_, r)| r.as_deref() == Some("GangRetrying")),
        "{said:?}"
    );

    a40_capacity(&world.sims, "CA-MTL-1", 6);
    wait_all(&world, &names, "Running", running).await;
    let places = live_places(&world.sims);
    assert_eq!(places.len(), 4, "{:?}", world.sims.ledger());
    for place in &places {
        assert_eq!(place, &("runpod".to_owned(), "CA-MTL-1".to_owned()));
    }
    assert!(world.sims.ledger().duplicate_live_names().is_empty());
    let events = world.events("w-0").await;
    let retried = world.events("w-2").await;
    assert!(
        events
            .iter()
            .chain(&retried)
            .any(|(r, _)| r == "GangRetrying"),
        "{events:?} {retried:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gang_the_budget_cannot_pay_for_whole_rents_nothing() {
    let mut world = World::new("gang-budget").await;
    // Three A40s at $0.40/h fit; four do not.
    world.cap = Some(1.3);
    world.kill().await;
    world.start();
    let names = ["w-0", "w-1", "w-2", "w-3"];
    let only = json!({"cloud.aibrix.ai/providers": "runpod", "cloud.aibrix.ai/gpu-type": "A40"});
    for name in names {
        world.create_pod(name, gang("big", "4", only.clone())).await;
    }
    wait_all(&world, &names, "OverBudget", |p| {
        reason(p) == Some("OverBudget") && message(p).contains("for the 4 members of gang")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        world.sims.ledger().entries.is_empty(),
        "{:?}",
        world.sims.ledger()
    );
    let renter = &world.renter;
    assert_eq!(renter.budget.in_flight_usd_per_hour(), 0.0, "nothing held");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_gang_annotations_are_refused_by_name_and_nothing_is_rented() {
    let world = World::new("gang-bad").await;
    let cases = [
        (
            "zero",
            gang("a", "0", json!({})),
            "[cloud.aibrix.ai/gang-size]: \"0\" must be at least 1",
        ),
        (
            "words",
            gang("b", "four", json!({})),
            "\"four\" is not a whole number",
        ),
        (
            "huge",
            gang("c", "65", json!({})),
            "\"65\" is more than the 64 members",
        ),
        (
            "nosize",
            json!({"cloud.aibrix.ai/gang": "d"}),
            "[cloud.aibrix.ai/gang-size]: gang \"d\" has no size",
        ),
    ];
    for (name, annotations, _) in &cases {
        world.create_pod(name, annotations.clone()).await;
    }
    world
        .create_pod("pair-0", gang("pair", "2", json!({})))
        .await;
    world
        .create_pod("pair-1", gang("pair", "3", json!({})))
        .await;
    for (name, _, says) in &cases {
        let p = world
            .wait_pod(name, "InvalidGang", |p| reason(p) == Some("InvalidGang"))
            .await;
        assert!(message(&p).contains(says), "{name}: {}", message(&p));
    }
    let p = world
        .wait_pod("pair-0", "InvalidGang", |p| {
            reason(p) == Some("InvalidGang")
        })
        .await;
    assert!(
        message(&p).contains("disagree on metadata.annotations[cloud.aibrix.ai/gang-size]"),
        "{}",
        message(&p)
    );
    let events = world.events("zero").await;
    assert!(events.iter().any(|(r, _)| r == "InvalidGang"), "{events:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(world.sims.ledger().entries.is_empty());
}

/// Waits until `name`'s binding names an instance other than `old`, the Pod runs, and the
/// ledger has `live` live instances.
async fn wait_replaced(world: &World, name: &str, old: &str, live: usize) {
    for _ in 0..600 {
        let now = world.binding(name).await.status.unwrap().instance_id;
        let pod = world.pods().get(name).await.unwrap();
        if now.as_deref().is_some_and(|i| i != old)
            && running(&pod)
            && world.sims.ledger().live().len() == live
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{name} was never replaced: {:?}\n{:?}",
        world.binding(name).await.status,
        world.sims.ledger()
    );
}

fn instance(b: &neocloud_node::crd::CloudPodBinding) -> String {
    b.status.clone().unwrap().instance_id.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reclaimed_member_is_replaced_in_the_gang_s_place_or_the_whole_gang_moves() {
    let world = World::new("gang-reclaim").await;
    let names = ["w-0", "w-1"];
    let spot = json!({"cloud.aibrix.ai/providers": "runpod", "cloud.aibrix.ai/gpu-type": "A40",
        "cloud.aibrix.ai/capacity-type": "spot"});
    for name in names {
        world
            .create_pod_restarting(name, gang("pair", "2", spot.clone()), "Always")
            .await;
    }
    wait_all(&world, &names, "Running", running).await;
    let landed = live_places(&world.sims);
    assert_eq!(landed.len(), 2, "{:?}", world.sims.ledger());
    assert_eq!(landed[0], landed[1], "one provider and region");
    let w1 = instance(&world.binding("w-1").await);

    // Reclaimed while its place has room: replaced there, and the other member runs on.
    let first = instance(&world.binding("w-0").await);
    assert!(world.sims.runpod.preempt(&first));
    wait_replaced(&world, "w-0", &first, 2).await;
    let ledger = world.sims.ledger();
    assert!(
        ledger
            .entries
            .iter()
            .any(|e| e.instance_id == first && !e.is_live()),
        "the reclaimed instance is billed no more: {ledger:?}"
    );
    for place in live_places(&world.sims) {
        assert_eq!(place, landed[0], "replaced in the gang's place: {ledger:?}");
    }
    assert_eq!(
        instance(&world.binding("w-1").await),
        w1,
        "w-1 on its first instance"
    );

    // Reclaimed again once its place sells no A40 any more: the replacement cannot be rented
    // there, so the whole gang is released and rented again together elsewhere.
    let offers = world.sims.runpod.offers();
    let there = offers
        .iter()
        .find(|o| o.config.gpu == "NVIDIA A40" && o.config.region == landed[0].1)
        .unwrap();
    assert!(world.sims.runpod.remove_offer(there.id));
    let second = instance(&world.binding("w-0").await);
    assert!(world.sims.runpod.preempt(&second));
    wait_replaced(&world, "w-0", &second, 2).await;
    wait_replaced(&world, "w-1", &w1, 2).await;
    let moved = live_places(&world.sims);
    assert_eq!(moved.len(), 2, "{:?}", world.sims.ledger());
    assert_eq!(
        moved[0], moved[1],
        "one provider and region again: {moved:?}"
    );
    assert_ne!(moved[0], landed[0]);
    let ledger = world.sims.ledger();
    assert!(ledger.duplicate_live_names().is_empty());
    assert!(
        ledger
            .entries
            .iter()
            .any(|e| e.instance_id == w1 && !e.is_live()),
        "w-1's first instance was released with the gang: {ledger:?}"
    );
}

/// A fallback policy that ends a gang when a member is reclaimed, and otherwise answers as the
/// default does: the role a BurstPolicy's Wasm fallback plays.
#[derive(Debug)]
struct EndTheGangOnReclaim(neocloud_broker::DefaultFallback);

impl neocloud_broker::FallbackPolicy for EndTheGangOnReclaim {
    fn next_action(
        &self,
        cx: &neocloud_broker::FallbackContext<'_>,
    ) -> Result<neocloud_core::FallbackAction, neocloud_broker::PolicyError> {
        if cx.failure.class == neocloud_core::FailureClass::Preempted {
            return Ok(neocloud_core::FallbackAction::GiveUp {
                reason: "a reclaimed member ends the gang".into(),
            });
        }
        self.0.next_action(cx)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fallback_policy_that_gives_up_on_a_reclaim_ends_the_whole_gang() {
    let mut world = World::new("gang-end").await;
    world.renter.fallback = std::sync::Arc::new(EndTheGangOnReclaim(Default::default()));
    world.kill().await;
    world.start();
    let names = ["w-0", "w-1"];
    let spot = json!({"cloud.aibrix.ai/providers": "runpod", "cloud.aibrix.ai/gpu-type": "A40",
        "cloud.aibrix.ai/capacity-type": "spot"});
    for name in names {
        world
            .create_pod_restarting(name, gang("pair", "2", spot.clone()), "Always")
            .await;
    }
    wait_all(&world, &names, "Running", running).await;
    assert_eq!(world.sims.ledger().live().len(), 2);
    let first = instance(&world.binding("w-0").await);
    assert!(world.sims.runpod.preempt(&first));
    wait_all(&world, &names, "Failed with GangEnded", |p| {
        support::world::phase(p) == Some("Failed") && reason(p) == Some("GangEnded")
    })
    .await;
    let w1 = world.pods().get("w-1").await.unwrap();
    assert!(
        message(&w1).contains("gang ") && message(&w1).contains("a reclaimed member ends the gang"),
        "{}",
        message(&w1)
    );
    // Both instances are released, and nothing was rented again.
    wait_released(&world).await;
    let ledger = world.sims.ledger();
    assert!(ledger.live().is_empty(), "{ledger:?}");
    assert_eq!(ledger.entries.len(), 2, "no replacement: {ledger:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sample_fallback_policy_replaces_a_first_reclaim_and_ends_the_gang_on_a_second() {
    let world = World::new("gang-js").await;
    let name = format!("gang-fallback-{}", world.ctx.namespace);
    support::create_wasm_policy(&world.ctx.client, &name, "fallback-js.wasm").await;
    let names = ["w-0", "w-1"];
    let spot = json!({"cloud.aibrix.ai/providers": "runpod", "cloud.aibrix.ai/gpu-type": "A40",
        "cloud.aibrix.ai/capacity-type": "spot", "cloud.aibrix.ai/policy": name});
    for member in names {
        world
            .create_pod_restarting(member, gang("pair", "2", spot.clone()), "Always")
            .await;
    }
    wait_all(&world, &names, "Running", running).await;

    // The first reclaim: the policy moves on, so the member is replaced.
    let first = instance(&world.binding("w-0").await);
    assert!(world.sims.runpod.preempt(&first));
    wait_replaced(&world, "w-0", &first, 2).await;

    // The second: the policy gives up, and the whole gang ends.
    let second = instance(&world.binding("w-0").await);
    assert!(world.sims.runpod.preempt(&second));
    wait_all(&world, &names, "Failed with GangEnded", |p| {
        support::world::phase(p) == Some("Failed") && reason(p) == Some("GangEnded")
    })
    .await;
    let w1 = world.pods().get("w-1").await.unwrap();
    assert!(
        message(&w1).contains("reclaimed 2 times: ending the gang"),
        "{}",
        message(&w1)
    );
    wait_released(&world).await;
    let ledger = world.sims.ledger();
    assert!(ledger.live().is_empty(), "{ledger:?}");
    assert_eq!(
        ledger.entries.len(),
        3,
        "one replacement, then none: {ledger:?}"
    );
}
