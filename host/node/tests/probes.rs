//! Probes end to end: `neocloud-node run` on the real control plane with Lambda as its only
//! provider, the Lambda simulator starting the real `neocloud-runner` (process executor) from
//! each VM's `user_data`. A workload whose HTTP readiness endpoint fails for its first seconds
//! is Running but not Ready, then Ready; a liveness failure then restarts it in place on the
//! same machine, with `Unhealthy` events worded as a kubelet's. A probe on a port the
//! container does not name is refused before anything is rented.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

mod runner_bin;
mod support;
mod vm_support;
use vm_support::World;

/// How long the workload's readiness endpoint answers 503 after it starts.
const NOT_READY_SECONDS: u64 = 6;

/// A small HTTP server: `/ready` answers 503 for its first seconds, then 200; `/live` answers
/// 500 once when the file named by its second argument exists (and removes it), else 200.
const SERVER: &str = r#"
import http.server, os, sys, time
start = time.time()
kill = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 404
        if self.path == "/ready":
            code = 200 if time.time() - start > float(sys.argv[3]) else 503
        elif self.path == "/live":
            code = 200
            if os.path.exists(kill):
                os.remove(kill)
                code = 500
        self.send_response(code)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// Creates a Pod on the node whose one container (asking for a GPU) is `container`'s fields
/// plus its name and image.
async fn create(world: &World, name: &str, container: serde_json::Value) {
    let mut c = json!({"name": "main", "image": "registry.invalid/vllm:1",
        "resources": {"limits": {"nvidia.com/gpu": "1"}}});
    if let serde_json::Value::Object(fields) = container {
        c.as_object_mut().unwrap().extend(fields);
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": world.node, "containers": [c]}
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

fn container(pod: &Pod) -> Option<ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()
        .cloned()
}

fn ready_condition(pod: &Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
    Some(ready.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probed_workload_is_ready_only_once_its_probe_passes_and_liveness_restarts_it_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let runner = vm_support::runner_with_backoff(dir.path(), 1.0);
    let world = World::with_runner("probes", Some(runner)).await;
    let mut node = world.spawn();
    let port = support::free_port();
    let kill = dir.path().join("kill");
    let command = [
        "python3".to_owned(),
        "-c".to_owned(),
        SERVER.to_owned(),
        port.to_string(),
        kill.display().to_string(),
        NOT_READY_SECONDS.to_string(),
    ];
    let probed = json!({
        "command": command,
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"},
            "periodSeconds": 1, "failureThreshold": 1},
        "livenessProbe": {"httpGet": {"path": "/live", "port": port},
            "initialDelaySeconds": 4, "periodSeconds": 1, "failureThreshold": 1},
    });
    create(&world, "served", probed).await;

    // Running, started, and not Ready while /ready answers 503; then Ready.
    let mut running_not_ready = None;
    let mut ready_at = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while ready_at.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready: {:#?}\n{}",
            world.pods().get("served").await.unwrap().status,
            world.node_log()
        );
        let pod = world.pods().get("served").await.unwrap();
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let c = container(&pod);
        if phase.as_deref() == Some("Running")
            && let Some(c) = c
            && c.state.as_ref().is_some_and(|s| s.running.is_some())
        {
            match ready_condition(&pod).as_deref() {
                Some("False") if running_not_ready.is_none() => {
                    assert!(!c.ready && c.started == Some(true), "{c:#?}");
                    running_not_ready = Some(Instant::now());
                }
                Some("True") => {
                    assert!(c.ready, "{c:#?}");
                    ready_at = Some(Instant::now());
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let not_ready_since = running_not_ready.expect("the Pod was Running and not Ready first");
    let waited = ready_at.unwrap().duration_since(not_ready_since);
    eprintln!("Running and not Ready for {waited:?}");
    assert!(
        waited >= Duration::from_secs(2),
        "ready after {waited:?}, before /ready passed"
    );

    // A liveness failure: the workload is stopped and restarted in place.
    std::fs::write(&kill, b"").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let restarted = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never restarted: {:#?}\n{}",
            world.pods().get("served").await.unwrap().status,
            world.node_log()
        );
        let pod = world.pods().get("served").await.unwrap();
        let c = container(&pod);
        if let Some(c) = c
            && c.restart_count == 1
            && c.state.as_ref().is_some_and(|s| s.running.is_some())
        {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let last = restarted
        .last_state
        .and_then(|l| l.terminated)
        .expect("lastState");
    assert_ne!(last.exit_code, 0, "{last:?}");
    let ledger = world.sims.ledger();
    assert_eq!(ledger.entries.len(), 1, "one rental: {ledger:?}");

    // Unhealthy events as a kubelet words them.
    let events: Api<Event> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let wanted = [
        "Readiness probe failed: HTTP probe failed with statuscode: 503",
        "Liveness probe failed: HTTP probe failed with statuscode: 500",
    ];
    loop {
        let notes: Vec<String> = (events.list(&ListParams::default()).await.unwrap().items)
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Unhealthy"))
            .filter_map(|e| e.message)
            .collect();
        if wanted.iter().all(|w| notes.iter().any(|n| n == w)) {
            // Repeats are counted, not published again.
            let readiness = notes.iter().filter(|n| *n == wanted[0]).count();
            assert!(readiness <= 2, "{notes:#?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{notes:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probe_on_a_port_the_container_does_not_name_is_refused_naming_the_field() {
    let world = World::new("probebad", false).await;
    let mut node = world.spawn();
    let misnamed = json!({
        "command": ["sleep", "60"],
        "readinessProbe": {"httpGet": {"path": "/", "port": "metrics"}},
    });
    create(&world, "misnamed", misnamed).await;
    // Refused as any unsupported Pod is: Pending, reason Unsupported, naming the field.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let message = loop {
        let pod = world.pods().get("misnamed").await.unwrap();
        let status = pod.status.unwrap_or_default();
        if status.reason.as_deref() == Some("Unsupported") {
            break status.message.unwrap_or_default();
        }
        assert!(tokio::time::Instant::now() < deadline, "{status:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        message.contains(
            "spec.containers[0].readinessProbe.httpGet.port: \"metrics\" names none of the \
             container's ports"
        ),
        "{message}"
    );
    assert!(world.sims.ledger().entries.is_empty(), "nothing rented");
    node.start_kill().unwrap();
    let _ = node.wait().await;
}
