//! The runner inside RunPod and Vast.ai containers, end to end: `neocloud-node run` on the real
//! control plane renting from the RunPod and Vast simulators, which start the runner from the
//! container's start command (`args`) as a container would, with the environment the rental
//! gave the container. The runner authenticates to the node's callback server, fetches the Pod's
//! command and runs it as its child: `kubectl logs` streams its output, the Pod ends
//! `Succeeded` or `Failed` with the workload's exit code, arguments with spaces and quotes arrive
//! unchanged, deleting a Pod delivers SIGTERM to its workload, and a Pod that opts out with `cloud.aibrix.ai/runner: "false"` runs its command
//! directly, as before. The runner's usage samples reach `/stats/summary` and
//! `/metrics/resource` on the node's kubelet API, as metrics-server reads them.

use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};

use kube::api::{DeleteParams, LogParams};

mod runner_bin;
mod support;
mod vm_support;
use support::exit_code;
use vm_support::World;

fn logs_params() -> LogParams {
    LogParams {
        container: Some("main".into()),
        ..LogParams::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runpod_and_vast_pods_run_through_the_runner_with_logs_and_exit_codes() {
    let world = World::containers("ctrun").await;
    let mut node = world.spawn();
    let tricky = ["with space", "it's \"quoted\"", "$HOME", "*"];
    let marks = tempfile::tempdir().unwrap();
    for provider in ["runpod", "vast"] {
        let mark = marks.path().join(format!("term-{provider}"));
        let trap = format!(
            "trap 'echo TERM > {}; exit 0' TERM; echo ready; while true; do sleep 0.1; done",
            mark.display()
        );
        world
            .command_pod(
                &format!("term-{provider}"),
                provider,
                &["sh", "-c", &trap],
                true,
            )
            .await;
        let mut ok = vec![
            "sh",
            "-c",
            "echo hello from the workload; printf '[%s]' \"$@\"; echo",
        ];
        ok.push("argv0");
        ok.extend(tricky);
        world
            .command_pod(&format!("ok-{provider}"), provider, &ok, true)
            .await;
        let fail = ["sh", "-c", "echo about to fail; exit 3"];
        world
            .command_pod(&format!("fail-{provider}"), provider, &fail, true)
            .await;
    }
    for provider in ["runpod", "vast"] {
        let name = format!("ok-{provider}");
        let done = world.wait_phase(&name, &["Succeeded", "Failed"]).await;
        assert_eq!(
            done.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded"),
            "{name}: {:?}\n{}",
            done.status,
            world.node_log()
        );
        assert_eq!(exit_code(&done), Some(0), "{:?}", done.status);
        let binding = world.bindings().get(&name).await.unwrap();
        assert_eq!(
            binding.status.as_ref().and_then(|s| s.provider.as_deref()),
            Some(provider)
        );
        let text = world.pods().logs(&name, &logs_params()).await.unwrap();
        assert!(
            text.contains("hello from the workload\n"),
            "{name}: {text:?}"
        );
        // Every argument arrived as the Pod wrote it: no word split, no quote lost, nothing
        // expanded.
        assert!(
            text.contains("[with space][it's \"quoted\"][$HOME][*]\n"),
            "{name}: {text:?}"
        );

        let name = format!("fail-{provider}");
        let failed = world.wait_phase(&name, &["Succeeded", "Failed"]).await;
        assert_eq!(
            failed.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Failed"),
            "{name}: {:?}",
            failed.status
        );
        assert_eq!(exit_code(&failed), Some(3), "{:?}", failed.status);
        let text = world.pods().logs(&name, &logs_params()).await.unwrap();
        assert!(text.contains("about to fail\n"), "{name}: {text:?}");
    }
    // Deleting a running Pod stops its container: SIGTERM reaches the workload.
    for provider in ["runpod", "vast"] {
        let name = format!("term-{provider}");
        world.wait_phase(&name, &["Running"]).await;
        // `kubectl logs -f` follows the running workload.
        let follow = LogParams {
            follow: true,
            ..logs_params()
        };
        let mut lines = world
            .pods()
            .log_stream(&name, &follow)
            .await
            .unwrap()
            .lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next())
            .await
            .expect("a line in time")
            .expect("the stream is open")
            .unwrap();
        assert_eq!(first, "ready", "{name}");
        drop(lines);
        world
            .pods()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        let mark = marks.path().join(&name);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while std::fs::read_to_string(&mark).unwrap_or_default() != "TERM\n" {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: no SIGTERM reached the workload\n{}",
                world.node_log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Each ended Pod's instance was released: nothing is billed any more.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !world.sims.ledger().live().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "instances still billed: {:?}",
            world.sims.ledger().live()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_that_opts_out_runs_its_command_directly_and_has_no_logs() {
    let world = World::containers("ctout").await;
    let mut node = world.spawn();
    world
        .command_pod("direct", "runpod", &["sleep", "3600"], false)
        .await;
    world.wait_phase("direct", &["Running"]).await;
    // Nothing ran the runner: RunPod got the Pod's own command, and there is no log.
    let err = world
        .pods()
        .logs("direct", &logs_params())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no log API"), "{err}");
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

/// `GET` on the node's kubelet API as `user` in `groups` (a client certificate from the
/// cluster's CA), the way metrics-server calls kubelets: directly, not through the API server.
/// The node's self-signed serving certificate is not checked, as with metrics-server's
/// `--kubelet-insecure-tls`. Returns the status and the body.
async fn direct(world: &World, path: &str, user: &str, groups: &[&str]) -> (u16, String) {
    let url = format!("https://127.0.0.1:{}{path}", world.kubelet_port);
    let response = world
        .kubelet_client(user, groups)
        .get(url)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

async fn proxied(world: &World, path: &str) -> String {
    let (status, body) = direct(world, path, "metrics-server", &["system:masters"]).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_pod_s_usage_is_served_as_the_kubelet_s_summary_and_resource_metrics() {
    let world = World::containers("ctstat").await;
    let mut node = world.spawn();
    // Busy, and holding some memory, so that both figures move.
    let busy = "x=$(head -c 4000000 /dev/zero | tr '\\0' a); while true; do :; done";
    world
        .command_pod("busy", "vast", &["sh", "-c", busy], true)
        .await;
    world.wait_phase("busy", &["Running"]).await;
    let uid = world
        .pods()
        .get("busy")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let container = loop {
        let text = proxied(&world, "/stats/summary").await;
        let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(summary["node"]["nodeName"], world.node.as_str());
        let pod = summary["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["podRef"]["uid"] == uid.as_str())
            .cloned();
        let cpu = pod
            .as_ref()
            .and_then(|p| p["containers"][0]["cpu"]["usageNanoCores"].as_u64());
        if let (Some(pod), Some(cores)) = (pod, cpu)
            && cores > 0
        {
            break pod["containers"][0].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no usage for the Pod: {text}\n{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(container["name"], "main");
    // A shell spinning is most of an idle core, but a tenth of one on a loaded machine (a run
    // beside two builds measured 0.099): a sample over a heartbeat interval (1 s) is only
    // checked to be a real share of a core, not the idle machine's figure.
    let cores = container["cpu"]["usageNanoCores"].as_u64().unwrap();
    assert!(cores > 10_000_000, "{container}");
    assert!(container["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0);
    let rss = container["memory"]["workingSetBytes"].as_u64().unwrap();
    assert!(rss > 4_000_000, "the 4 MB the workload holds: {container}");
    // No GPU tool here: no accelerators, rather than zeros.
    assert!(container.get("accelerators").is_none(), "{container}");

    let metrics = proxied(&world, "/metrics/resource").await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("container_cpu_usage_seconds_total{") && l.contains("pod=\"busy\""))
        .unwrap_or_else(|| panic!("{metrics}"));
    let seconds: f64 = line.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(seconds > 0.0, "{line}");
    assert!(
        metrics.contains("pod_memory_working_set_bytes{"),
        "{metrics}"
    );

    // Someone the API server does not allow nodes/stats is refused, by name.
    let (status, body) = direct(&world, "/stats/summary", "nobody", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("subresource=stats"), "{body}");
    node.start_kill().unwrap();
    let _ = node.wait().await;
}
