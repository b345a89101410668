//! The VM runner across a leader change, end to end: two `neocloud-node run` replicas with
//! leader election on the real control plane, Lambda as the only provider, and the simulator
//! running each VM's runner from its `user_data`. The leader is killed with SIGKILL while a Pod
//! runs; the standby takes over, its runner keeps the same instance, its heartbeats reach the
//! new leader in time, `kubectl logs` shows what it printed after the failover, and the new
//! leader refuses forged identities while accepting the runner's own credential.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use kube::api::{DeleteParams, LogParams};
use tokio::time::Instant;

mod runner_bin;
mod support;
mod vm_support;
use vm_support::{World, cmdline_flag, environ_var, runner_pids};

/// Waits until replica `replica`'s log contains `needle`; returns when it was seen.
async fn wait_for_log(world: &World, replica: u32, needle: &str, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        if world.replica_log(Some(replica)).contains(needle) {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "replica {replica} never logged {needle:?}:\n{}",
            world.replica_log(Some(replica))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The numbers of the `tick N` lines in a log.
fn ticks(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect()
}

/// What the new leader answers a token request, over TLS pinned to the runner's certificate.
async fn ask(world: &World, ca_pem: &[u8], path: &str, body: serde_json::Value) -> (u16, String) {
    let ca = reqwest::Certificate::from_pem(ca_pem).unwrap();
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{}/v1/{path}", world.callback_port);
    let response = http.post(url).json(&body).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lambda_pod_keeps_its_instance_heartbeats_and_logs_when_the_leader_is_killed() {
    let mut world = World::new("vmfail", true).await;
    world.heartbeat_timeout_seconds = 5;
    let timeout = Duration::from_secs(5);
    let mut leader = world.spawn_replica(Some(1));
    wait_for_log(
        &world,
        1,
        "leading; starting the node",
        Duration::from_secs(60),
    )
    .await;
    let mut standby = world.spawn_replica(Some(2));
    wait_for_log(&world, 2, "waiting to lead", Duration::from_secs(60)).await;
    world.create_workload("trainer").await;
    let instance = world.wait_running_on_new("trainer", None).await;
    let uid = world
        .pods()
        .get("trainer")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let pids = runner_pids(world.callback_port);
    assert_eq!(pids.len(), 1, "one runner: {pids:?}");
    let all = LogParams {
        container: Some("main".into()),
        ..LogParams::default()
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = world.pods().logs("trainer", &all).await.unwrap();
    let last_before = ticks(&before)
        .into_iter()
        .max()
        .expect("ticks before the failover");

    // SIGKILL the leader: no goodbye, its Lease runs out and the standby takes over.
    leader.start_kill().unwrap();
    let _ = leader.wait().await;
    let led = wait_for_log(
        &world,
        2,
        "leading; starting the node",
        Duration::from_secs(60),
    )
    .await;
    let called = wait_for_log(
        &world,
        2,
        "the runner of an adopted binding called in",
        timeout + Duration::from_secs(5),
    )
    .await;
    assert!(
        called - led <= timeout,
        "the runner called in {:?} after the new leader started",
        called - led
    );

    // Two heartbeat timeouts later the runner is still trusted: not lost, not replaced.
    tokio::time::sleep(2 * timeout).await;
    let log = world.replica_log(Some(2));
    assert!(!log.contains("sent no heartbeat in time"), "{log}");
    let pod = world.pods().get("trainer").await.unwrap();
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    let binding = world.bindings().get("trainer").await.unwrap();
    assert_eq!(
        binding.status.and_then(|s| s.instance_id).as_deref(),
        Some(instance.as_str())
    );
    let ledger = world.sims.ledger();
    assert_eq!(
        ledger.entries.len(),
        1,
        "one instance throughout: {ledger:?}"
    );
    assert!(ledger.entries[0].is_live(), "{ledger:?}");
    assert_eq!(runner_pids(world.callback_port), pids, "the same runner");

    // `kubectl logs` through the API server and the new leader's kubelet API: lines the
    // workload printed after the failover.
    let after = world.pods().logs("trainer", &all).await.unwrap();
    let newest = ticks(&after).into_iter().max().unwrap_or(0);
    assert!(
        newest > last_before + 5,
        "no lines from after the failover (last before: {last_before}):\n{after}"
    );

    // The new leader presents the certificate the runner pinned; the boot credential of the
    // user_data is spent (the Pod shows its runner ran), forged ones are refused, and so is the
    // old leader's bootstrap token.
    let ca = STANDARD
        .decode(cmdline_flag(pids[0], "--ca-pem-base64").unwrap())
        .unwrap();
    // The secrets are not on the command line. (The simulator, which cannot write the VM's
    // secrets file, hands them to the runner as environment.)
    assert_eq!(cmdline_flag(pids[0], "--credential"), None);
    let credential = environ_var(pids[0], "NEOCLOUD_RUNNER_CREDENTIAL").unwrap();
    let (status, body) = ask(
        &world,
        &ca,
        "token/reauth",
        serde_json::json!({"credential": credential}),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("spent"), "{body}");
    let other = credential.replace(&uid, "1b0e3c1a-7f7e-4d57-9a53-4f7a0c9d2b11");
    let mac = credential.rsplit(':').next().unwrap();
    let forged = credential.replace(mac, &URL_SAFE_NO_PAD.encode([7u8; 32]));
    for (what, credential) in [("another binding's", other), ("a forged", forged)] {
        let body = serde_json::json!({"credential": credential});
        let (status, text) = ask(&world, &ca, "token/reauth", body).await;
        assert_eq!(status, 401, "{what} credential: {text}");
        assert!(text.contains("not valid"), "{what} credential: {text}");
        assert!(!text.contains(mac), "the answer echoes no credential");
    }
    let bootstrap = environ_var(pids[0], "NEOCLOUD_BOOTSTRAP_TOKEN").unwrap();
    let body = serde_json::json!({"bootstrapToken": bootstrap});
    let (status, text) = ask(&world, &ca, "token", body).await;
    assert_eq!(status, 401, "{text}");

    // Deleting the Pod through the new leader releases the instance.
    world
        .pods()
        .delete("trainer", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !world.sims.ledger().live().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the instance outlived its Pod\n{}",
            world.replica_log(Some(2))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    standby.start_kill().unwrap();
    let _ = standby.wait().await;
}
