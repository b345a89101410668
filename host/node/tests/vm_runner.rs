//! The VM runner end to end: `neocloud-node run` on the real control plane with Lambda as its
//! only provider; the Lambda simulator boots each launched instance by running the
//! `neocloud-runner` command of its `user_data`, which authenticates to the node's callback
//! server, fetches the workload (with a Secret in its environment) and runs it as a process.
//! The Pod goes Running only through the runner and `kubectl logs -f` streams its output through
//! the API server and the node's kubelet API; killing the runner leads to a heartbeat
//! timeout, the instance's termination and a replacement; no secret value reaches the node's
//! log, an event or a status.

use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams, LogParams};

mod runner_bin;
mod support;
mod vm_support;
use vm_support::{SECRET_VALUE, World, runner_pids};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lambda_pod_runs_through_the_runner_and_is_replaced_when_its_heartbeats_stop() {
    let world = World::new("vmrun", true).await;
    let mut node = world.spawn();
    world.create_workload("trainer").await;

    // Running through the runner: the VM's runner authenticated, fetched the workload and
    // reported it running.
    let first = world.wait_running_on_new("trainer", None).await;
    let log = world.node_log();
    assert!(log.contains("runner reported"), "{log}");
    let pids = runner_pids(world.callback_port);
    assert_eq!(pids.len(), 1, "one runner for one Pod: {pids:?}");

    // `kubectl logs` through the API server, which calls the node's kubelet API, which reads
    // the runner's stream: the whole log so far, then following new lines as they come.
    let all = LogParams {
        container: Some("main".into()),
        ..LogParams::default()
    };
    let text = world.pods().logs("trainer", &all).await.unwrap();
    assert!(text.starts_with("line-one\n"), "{text}");
    let length = SECRET_VALUE.len();
    assert!(
        text.contains(&format!("token has {length} chars")),
        "{text}"
    );
    let follow = LogParams {
        follow: true,
        tail_lines: Some(1),
        ..all
    };
    let mut lines = world
        .pods()
        .log_stream("trainer", &follow)
        .await
        .unwrap()
        .lines();
    let mut ticks = Vec::new();
    while ticks.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next())
            .await
            .expect("a line in time")
            .expect("the stream is open")
            .unwrap();
        let n: u32 = line.strip_prefix("tick ").unwrap().parse().unwrap();
        ticks.push(n);
    }
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "{ticks:?}");
    drop(lines);

    // Kill the runner: its heartbeats stop, the node declares it lost after 3 s, terminates
    // the instance and places the Pod again (restartPolicy Always).
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let second = world.wait_running_on_new("trainer", Some(&first)).await;
    assert_ne!(first, second);

    let status = world
        .bindings()
        .get("trainer")
        .await
        .unwrap()
        .status
        .unwrap();
    let lost = status
        .attempts
        .iter()
        .find(|a| a.failure_class.as_deref() == Some("lost"))
        .unwrap_or_else(|| panic!("no lost attempt: {:#?}", status.attempts));
    assert!(
        lost.message
            .as_deref()
            .unwrap_or_default()
            .contains("heartbeats"),
        "{lost:?}"
    );
    let ledger = world.sims.ledger();
    let live: Vec<_> = ledger
        .live()
        .into_iter()
        .map(|e| e.instance_id.clone())
        .collect();
    assert_eq!(
        live,
        vec![second.clone()],
        "the lost instance is terminated: {ledger:?}"
    );

    let events: Api<Event> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let events = events.list(&ListParams::default()).await.unwrap();
    let replacing = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("Replacing"))
        .unwrap_or_else(|| panic!("no Replacing event: {:#?}", events.items));
    assert!(
        replacing
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("heartbeats"),
        "{replacing:?}"
    );

    // No secret value in the node's log, any event, the binding or the Pod.
    let pod = world.pods().get("trainer").await.unwrap();
    let binding = world.bindings().get("trainer").await.unwrap();
    for (what, text) in [
        ("node log", world.node_log()),
        ("events", serde_json::to_string(&events).unwrap()),
        ("binding", serde_json::to_string(&binding).unwrap()),
        ("pod status", serde_json::to_string(&pod.status).unwrap()),
    ] {
        assert!(
            !text.contains(SECRET_VALUE),
            "the secret value is in the {what}"
        );
    }

    // Deleting the Pod releases the instance and stops its runner.
    world
        .pods()
        .delete("trainer", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while world.pods().get_opt("trainer").await.unwrap().is_some()
        || !world.sims.ledger().live().is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Pod or its instance is still there\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !runner_pids(world.callback_port).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a runner outlived its instance"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vm_whose_runner_never_calls_back_is_terminated_and_replaced() {
    let world = World::new("vmboot", false).await;
    let mut node = world.spawn();
    world.create_workload("silent").await;

    // The VM comes up but nothing calls back: the Pod waits in ContainerCreating, never Running.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pod = world.pods().get("silent").await.unwrap();
        let reason = pod.status.as_ref().and_then(|s| s.reason.clone());
        if reason.as_deref() == Some("ContainerCreating") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ContainerCreating: {reason:?}\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // After the 3 s boot timeout the instance is terminated and another one rented.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let lost = loop {
        let status = world
            .bindings()
            .get("silent")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        let lost = status
            .attempts
            .iter()
            .find(|a| a.failure_class.as_deref() == Some("lost"))
            .cloned();
        if let Some(lost) = lost
            && status.instance_id.is_some()
        {
            break (lost, status);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the silent VM was not replaced: {status:?}\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (lost, status) = lost;
    let message = lost.message.unwrap_or_default();
    assert!(message.contains("never called back within 3s"), "{message}");
    let ledger = world.sims.ledger();
    let first = ledger.entries.first().unwrap();
    assert!(
        !first.is_live(),
        "the first instance is terminated: {ledger:?}"
    );
    assert_eq!(
        ledger.live().len(),
        1,
        "{ledger:#?}\n{status:#?}\n{}",
        world.node_log()
    );
    let pod = world.pods().get("silent").await.unwrap();
    assert_ne!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));

    world
        .pods()
        .delete("silent", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !world.sims.ledger().live().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the instance outlived its Pod\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    node.start_kill().unwrap();
    let _ = node.wait().await;
}
