//! Whether a Pod's record tells the truth, on the real control plane with the simulators: a Pod
//! that gives up after a create whose answer was lost keeps every attempt and has the lost
//! instance terminated; a fallback policy's decisions (skip a provider, retry after a wait) are
//! recorded on the attempts and said in events, in order, with the policy's name; the `Rented`
//! event names the offer actually rented; and a budget rebuilt by a restarted reconciler keeps
//! the cluster cap.

use std::time::Duration;

use neocloud_broker::LadderLimits;
use neocloud_cloudsim::{CloudSim, CloudSimConfig, FaultKind, FaultRule, SimConfig};
use neocloud_node::crd::AttemptOutcome;
use serde_json::json;

mod support;
use support::world::{World, phase, reason, running};

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_that_gives_up_after_a_lost_create_keeps_every_attempt_and_the_instance_is_terminated()
 {
    let mut world = World::new("dec-lost").await;
    world.renter.limits = LadderLimits {
        max_attempts: 2,
        ..LadderLimits::default()
    };
    world.kill().await;
    world.start();
    let vast = &world.sims.vast;
    // Attempt 1: no capacity. Attempt 2: the instance is created but the answer is lost, and
    // the lookup by name that follows fails too, so the ladder ends without knowing of it.
    vast.add_fault(FaultRule::next(
        "PUT /api/v0/asks/{id}/",
        1,
        FaultKind::CapacityExhausted,
    ));
    vast.add_fault(FaultRule::next(
        "PUT /api/v0/asks/{id}/",
        1,
        FaultKind::LostResponse,
    ));
    // The adapter looks the name up before each create (both pass), then after the lost answer.
    vast.add_fault(FaultRule::next(
        "GET /api/v1/instances/",
        2,
        FaultKind::Slow { delay_ms: 0 },
    ));
    vast.add_fault(FaultRule::next(
        "GET /api/v1/instances/",
        12,
        FaultKind::ServerError { status: 503 },
    ));
    world
        .create_pod(
            "lost",
            json!({"cloud.aibrix.ai/providers": "vast", "cloud.aibrix.ai/gpu-type": "RTX 4090"}),
        )
        .await;
    let pod = world
        .wait_pod("lost", "Failed", |p| phase(p) == Some("Failed"))
        .await;
    let status = world.binding("lost").await.status.unwrap();
    let attempts = &status.attempts;
    assert_eq!(attempts.len(), 2, "every attempt is kept: {attempts:?}");
    assert_eq!(attempts[0].failure_class.as_deref(), Some("capacity"));
    assert_eq!(attempts[1].outcome, AttemptOutcome::Failed);
    assert!(
        matches!(
            attempts[1].failure_class.as_deref(),
            Some("transient" | "timeout")
        ),
        "{attempts:?}"
    );
    assert_eq!(attempts[0].action.as_deref(), Some("next-offer"));
    // The policy would retry; the ladder's limit ends it, and the decision says both.
    assert_eq!(attempts[1].action.as_deref(), Some("retry-same-offer"));
    assert!(
        attempts[1]
            .decision
            .as_deref()
            .is_some_and(|d| d.contains("but reached the limit of 2 attempts")),
        "{attempts:?}"
    );
    assert!(
        pod.status
            .and_then(|s| s.message)
            .is_some_and(|m| m.contains("gave up after 2 attempts")),
    );
    // The instance the lost answer rented was found by its name and terminated.
    let ledger = world.sims.ledger();
    let rented = ledger.named(&world.binding("lost").await.spec.external_name);
    assert_eq!(rented.len(), 1, "{ledger:?}");
    assert!(rented[0].terminated_at.is_some(), "{rented:?}");
    assert!(ledger.live().is_empty(), "{:?}", ledger.live());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fallback_policy_s_skip_retry_and_wait_are_recorded_in_order_with_its_name() {
    let full_vast = SimConfig {
        quota: Some(0),
        ..SimConfig::fast()
    };
    let sims = CloudSim::start(CloudSimConfig {
        runpod: SimConfig::fast(),
        lambda: SimConfig::fast(),
        vast: full_vast,
    })
    .await
    .unwrap();
    let world = World::with_sims("dec-policy", sims).await;
    let name = format!("js-fallback-{}", world.ctx.namespace);
    support::create_wasm_policy(&world.ctx.client, &name, "fallback-js.wasm").await;
    // RunPod answers its first create with a 503: the policy retries it after 2 s.
    world.sims.runpod.add_fault(FaultRule::next(
        "POST /v2/pods",
        1,
        FaultKind::ServerError { status: 503 },
    ));
    world
        .create_pod(
            "by-policy",
            json!({"cloud.aibrix.ai/policy": name, "cloud.aibrix.ai/providers": "vast,runpod",
                "cloud.aibrix.ai/gpu-type": "RTX 4090",
                "cloud.aibrix.ai/runpod-cloud-type": "SECURE"}),
        )
        .await;
    world.wait_pod("by-policy", "Running", running).await;
    let status = world.binding("by-policy").await.status.unwrap();
    let decided: Vec<(String, Option<&str>, Option<&str>)> = status
        .attempts
        .iter()
        .map(|a| {
            (
                a.provider.clone(),
                a.action.as_deref(),
                a.decided_by.as_deref(),
            )
        })
        .collect();
    let by = Some(name.as_str());
    assert_eq!(
        decided,
        vec![
            ("vast".to_owned(), Some("skip-provider"), by),
            ("runpod".to_owned(), Some("retry-same-offer"), by),
            ("runpod".to_owned(), None, None),
        ],
        "{status:?}"
    );
    let events = world.events("by-policy").await;
    let order: Vec<&str> = events
        .iter()
        .map(|(r, _)| r.as_str())
        .filter(|r| matches!(*r, "FallbackDecided" | "Waiting" | "Rented"))
        .collect();
    assert_eq!(
        order,
        ["FallbackDecided", "FallbackDecided", "Waiting", "Rented"],
        "{events:?}"
    );
    let said = |reason: &str, n: usize| {
        events
            .iter()
            .filter(|(r, _)| r == reason)
            .nth(n)
            .map(|(_, m)| m.clone())
            .unwrap()
    };
    let skip = said("FallbackDecided", 0);
    assert!(
        skip.contains(&format!("policy {name} chose to skip provider vast")),
        "{skip}"
    );
    let retry = said("FallbackDecided", 1);
    assert!(
        retry.contains("retry the same offer") && retry.contains("after 2s"),
        "{retry}"
    );
    let wait = said("Waiting", 0);
    assert!(
        wait.starts_with("waiting 2s (until ")
            && wait.contains("transient")
            && wait.ends_with(&format!("the wait was set by policy {name}")),
        "{wait}"
    );
    let rented = said("Rented", 0);
    assert!(
        rented.contains("from runpod offer")
            && rented.contains("after attempt 1 on vast")
            && !rented.contains("ranked first"),
        "{rented}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_429s_before_a_runpod_create_succeeds_are_on_the_attempt_and_in_one_event() {
    let world = World::new("dec-retried").await;
    world.sims.runpod.add_fault(FaultRule::next(
        "POST /v2/pods",
        2,
        FaultKind::RateLimited {
            retry_after_secs: 1,
        },
    ));
    world
        .create_pod(
            "retried",
            json!({"cloud.aibrix.ai/providers": "runpod",
                "cloud.aibrix.ai/runpod-cloud-type": "SECURE"}),
        )
        .await;
    world.wait_pod("retried", "Running", running).await;
    let status = world.binding("retried").await.status.unwrap();
    assert_eq!(status.attempts.len(), 1, "{status:?}");
    let attempt = &status.attempts[0];
    assert_eq!(attempt.outcome, AttemptOutcome::Created, "{attempt:?}");
    let retried = attempt
        .retried
        .as_ref()
        .expect("the retries are on the attempt");
    assert_eq!(retried.count, 2, "{retried:?}");
    assert_eq!(retried.causes, vec!["429", "429"]);
    assert_eq!(retried.asked_seconds, vec![1.0, 1.0]);
    assert_eq!(retried.waited_seconds, vec![1.0, 1.0]);
    let events = world.events("retried").await;
    let retries: Vec<&String> = events
        .iter()
        .filter(|(r, _)| r == "ProviderRetried")
        .map(|(_, m)| m)
        .collect();
    assert_eq!(retries.len(), 1, "one event for both retries: {events:?}");
    assert!(
        retries[0].contains("asked again 2 retries (429, 429; Retry-After asked 1s, 1s"),
        "{}",
        retries[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_reconciler_rebuilds_the_budget_and_never_rents_past_the_cap() {
    let mut world = World::new("dec-budget").await;
    // Room for Vast's two RTX 4090s ($0.38 and $0.40), and for nothing more.
    world.cap = Some(0.8);
    world.retry_interval = Duration::from_millis(300);
    world.kill().await;
    world.start();
    let vast = json!({"cloud.aibrix.ai/providers": "vast", "cloud.aibrix.ai/gpu-type": "RTX 4090"});
    for name in ["b-1", "b-2"] {
        world.create_pod(name, vast.clone()).await;
        world.wait_pod(name, "Running", running).await;
    }
    // A new process: its budget starts empty and must be rebuilt from the bindings.
    world.kill().await;
    world.start();
    let any = json!({"cloud.aibrix.ai/providers": "runpod,vast",
        "cloud.aibrix.ai/gpu-type": "RTX 4090"});
    world.create_pod("b-3", any).await;
    let waiting = world
        .wait_pod("b-3", "OverBudget", |p| reason(p) == Some("OverBudget"))
        .await;
    assert_eq!(phase(&waiting), Some("Pending"));
    let message = waiting.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("$0.7800/h running"), "{message}");
    let spend: f64 = world
        .sims
        .ledger()
        .live()
        .iter()
        .map(|e| e.price_per_hour)
        .sum();
    assert!(spend <= 0.8 + 1e-9, "spend ${spend}/h passed the cap");
    assert_eq!(world.sims.ledger().live().len(), 2);
    assert!((world.renter.budget.running_usd_per_hour() - spend).abs() < 1e-6);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_kept_over_budget_through_a_thousand_retries_keeps_a_small_binding_that_explains_it()
{
    let mut world = World::new("dec-history").await;
    world.cap = Some(0.01);
    world.retry_interval = Duration::from_millis(1);
    world.kill().await;
    world.start();
    world
        .create_pod(
            "waits",
            json!({"cloud.aibrix.ai/providers": "vast", "cloud.aibrix.ai/gpu-type": "RTX 4090"}),
        )
        .await;
    let mut status = None;
    for _ in 0..1200 {
        let b = world.bindings().get_opt("waits").await.unwrap();
        let s = b.and_then(|b| b.status).unwrap_or_default();
        let tallied: u32 = s.attempt_tally.iter().map(|t| t.count).sum();
        if tallied as usize + s.attempts.len() >= 1000 {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    status.expect("1,000 refusals within 5 minutes");
    world.kill().await;
    let binding = world.binding("waits").await;
    let status = binding.status.clone().unwrap();
    let size = serde_json::to_vec(&binding).unwrap().len();
    assert!(size < 64 * 1024, "the binding is {size} bytes");
    assert!(status.attempts.len() <= 20, "{}", status.attempts.len());
    let tally = &status.attempt_tally;
    assert!(
        tally.iter().all(|t| t.provider == "vast"
            && t.failure_class.as_deref() == Some("price-exceeded")
            && t.last_message
                .as_deref()
                .is_some_and(|m| m.contains("cluster budget"))),
        "{tally:?}"
    );
    assert_eq!(status.reason.as_deref(), Some("OverBudget"));
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("cluster budget of $0.0100/h would be exceeded")),
        "{status:?}"
    );
    assert!(world.sims.ledger().live().is_empty());
    // One OverBudget event, not one per refused candidate per retry.
    let events = world.events("waits").await;
    assert!(
        events
            .iter()
            .all(|(r, _)| r != "RentalFailed" && r != "FallbackDecided"),
        "{events:?}"
    );
}
