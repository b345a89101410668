//! Restarts in place end to end: `neocloud-node run` on the real control plane with Lambda as
//! its only provider, the Lambda simulator starting the real `neocloud-runner` (process
//! executor) from each VM's `user_data`. A runner Pod whose command keeps failing under
//! `restartPolicy: Always` is restarted by its runner on the one machine with kubelet's
//! CrashLoopBackOff (its base shortened to 2 s through the runner's test knob), and the Pod says
//! so as a kubelet would; `kubectl logs --previous` reads the last run. Under `OnFailure` an
//! exit 0 ends the Pod Succeeded and releases its machine.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams, PostParams};
use serde_json::json;

mod runner_bin;
mod support;
mod vm_support;
use vm_support::World;

/// The shortened first back-off the runners of this test use.
const BASE_SECONDS: f64 = 2.0;

/// The runner, started with the back-off shortened to [`BASE_SECONDS`].
fn runner_with_short_backoff(dir: &Path) -> PathBuf {
    vm_support::runner_with_backoff(dir, BASE_SECONDS)
}

async fn create(world: &World, name: &str, policy: &str, script: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": world.node,
            "restartPolicy": policy,
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "command": ["sh", "-c", script],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

fn container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()
}

fn seconds_between(
    from: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    to: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> f64 {
    let span = to.0.duration_since(from.0);
    span.as_secs_f64()
}

/// What the test saw of one run that started after a restart: its restart count, and the
/// seconds between the end of the run before it and its start.
#[derive(Debug, Clone, PartialEq)]
struct Restart {
    count: i32,
    gap: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_looping_runner_pod_restarts_in_place_with_kubelet_s_back_off() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::with_runner("crash", Some(runner_with_short_backoff(dir.path()))).await;
    let mut node = world.spawn();
    let counter = dir.path().join("runs");
    let script = format!(
        "n=$(($(cat '{c}' 2>/dev/null || echo 0) + 1)); echo $n > '{c}'; echo \"run $n\"; \
         sleep 2; exit 3",
        c = counter.display()
    );
    create(&world, "crashy", "Always", &script).await;

    let mut restarts: Vec<Restart> = Vec::new();
    let mut backoff_messages = Vec::new();
    let mut logs_checked = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while restarts.len() < 3 || !logs_checked {
        assert!(
            tokio::time::Instant::now() < deadline,
            "saw {restarts:?}, logs checked: {logs_checked}\n{:#?}\n{}",
            world.pods().get("crashy").await.unwrap().status,
            world.node_log()
        );
        let pod = world.pods().get("crashy").await.unwrap();
        let Some(c) = container(&pod) else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let state = c.state.clone().unwrap_or_default();
        let last = c.last_state.as_ref().and_then(|l| l.terminated.clone());
        if let Some(waiting) = &state.waiting
            && waiting.reason.as_deref() == Some("CrashLoopBackOff")
        {
            let message = waiting.message.clone().unwrap_or_default();
            if !backoff_messages.contains(&message) {
                backoff_messages.push(message);
            }
            let last = last
                .as_ref()
                .expect("a container backing off says how it ended");
            assert_eq!(last.exit_code, 3, "{last:?}");
            assert_eq!(last.reason.as_deref(), Some("Error"));
        }
        if let (Some(running), Some(last)) = (&state.running, &last)
            && c.restart_count >= 1
            && !restarts.iter().any(|r| r.count == c.restart_count)
        {
            assert_eq!(last.exit_code, 3, "{last:?}");
            let gap = seconds_between(
                last.finished_at.as_ref().expect("finishedAt"),
                running.started_at.as_ref().expect("startedAt"),
            );
            restarts.push(Restart {
                count: c.restart_count,
                gap,
            });
            if !logs_checked {
                logs_checked = previous_is_the_last_run(&world, c.restart_count).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    eprintln!("restarts seen: {restarts:?}; back-off messages: {backoff_messages:?}");
    // The back-off doubles from the base: restart n waits base * 2^(n-1). Times in a Pod's
    // status have whole seconds, so each gap is off by up to one second either way.
    for r in &restarts {
        let expected = BASE_SECONDS * 2f64.powi(r.count - 1);
        assert!(
            (r.gap - expected).abs() <= expected * 0.2 + 1.0,
            "restart {} came {:.1}s after the run before it ended, not about {expected}s: \
             {restarts:?}",
            r.count,
            r.gap
        );
    }
    let uid = world
        .pods()
        .get("crashy")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let pod_name = format!("crashy_{}({uid})", world.ctx.namespace);
    let expected = format!("back-off 4s restarting failed container=main pod={pod_name}");
    assert!(
        backoff_messages.contains(&expected),
        "{backoff_messages:?} lacks {expected:?}"
    );

    // One machine the whole time: one rental in the simulator's ledger, and one attempt.
    let ledger = world.sims.ledger();
    assert_eq!(ledger.entries.len(), 1, "one rental: {ledger:?}");
    assert_eq!(ledger.live().len(), 1, "{ledger:?}");
    let binding = world.bindings().get("crashy").await.unwrap();
    let attempts = binding.status.unwrap().attempts;
    assert_eq!(attempts.len(), 1, "{attempts:#?}");

    // BackOff events as a kubelet's: one Event counted again, not one per restart or second.
    let events: Api<Event> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let backoffs: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("BackOff"))
        .collect();
    assert_eq!(backoffs.len(), 1, "{backoffs:#?}");
    let backoff = &backoffs[0];
    assert_eq!(
        backoff.message.as_deref(),
        Some(format!("Back-off restarting failed container main in pod {pod_name}").as_str())
    );
    let count = backoff
        .series
        .as_ref()
        .and_then(|s| s.count)
        .or(backoff.count)
        .unwrap_or(1);
    assert!(count >= 2, "the repeats are counted: {backoff:#?}");
    assert!(
        !world.node_log().contains("renting a replacement"),
        "nothing was rented again"
    );
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

/// Whether `kubectl logs --previous` of the Pod, running after `restarts` restarts, gave the
/// last run's output and the current log the current run's (checked only when no restart came
/// between the reads; `false` then, to try again).
async fn previous_is_the_last_run(world: &World, restarts: i32) -> bool {
    let current = LogParams {
        container: Some("main".into()),
        ..LogParams::default()
    };
    let previous = LogParams {
        previous: true,
        ..current.clone()
    };
    let before = world.pods().logs("crashy", &previous).await.unwrap();
    let now = world.pods().logs("crashy", &current).await.unwrap();
    let pod = world.pods().get("crashy").await.unwrap();
    let c = container(&pod).unwrap();
    let same_run = c.restart_count == restarts && c.state.as_ref().unwrap().running.is_some();
    if !same_run || now.is_empty() {
        return false;
    }
    assert_eq!(
        before,
        format!("run {restarts}\n"),
        "the previous run's log"
    );
    assert_eq!(
        now,
        format!("run {}\n", restarts + 1),
        "the current run's log"
    );
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_failure_with_exit_zero_succeeds_and_has_no_previous_log() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::with_runner("onfail", Some(runner_with_short_backoff(dir.path()))).await;
    let mut node = world.spawn();
    create(
        &world,
        "done",
        "OnFailure",
        "echo finished; sleep 1; exit 0",
    )
    .await;

    let pod = world.wait_phase("done", &["Succeeded", "Failed"]).await;
    let c = container(&pod).unwrap();
    let terminated = c.state.as_ref().unwrap().terminated.clone().unwrap();
    assert_eq!(
        (
            pod.status.as_ref().unwrap().phase.as_deref(),
            terminated.exit_code
        ),
        (Some("Succeeded"), 0),
        "{:#?}",
        pod.status
    );
    assert_eq!(c.restart_count, 0);

    // Never restarted: kubelet's answer to --previous.
    let previous = LogParams {
        container: Some("main".into()),
        previous: true,
        ..LogParams::default()
    };
    let err = world
        .pods()
        .logs("done", &previous)
        .await
        .expect_err("no previous run");
    assert!(
        err.to_string()
            .contains("previous terminated container \"main\" in pod \"done\" not found"),
        "{err}"
    );

    // The instance is released and was the only one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !world.sims.ledger().live().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "still rented");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(world.sims.ledger().entries.len(), 1);
    node.start_kill().unwrap();
    let _ = node.wait().await;
}
