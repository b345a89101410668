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
use k8s_openapi::api::core::v1::{Event, Pod, PodTemplate};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, LogParams, PostParams};
use neocloud_node::crd::{CloudPodBinding, CloudPodReceipt};
use serde_json::json;

mod runner_bin;
mod support;
mod vm_support;
use vm_support::{SECRET_VALUE, World, runner_pids, until};

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

/// The `Provisioned` condition of request `name`, once it is decided: `(status, reason,
/// message)`.
async fn provisioned(
    requests: &Api<DynamicObject>,
    name: &str,
) -> Option<(String, String, String)> {
    let req = requests.get(name).await.ok()?;
    let conditions = req.data["status"]["conditions"].as_array()?.clone();
    let c = conditions.iter().find(|c| c["type"] == "Provisioned")?;
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

/// Waits for request `name` to be decided: `(status, reason, message)` of `Provisioned`.
async fn decided(
    world: &World,
    requests: &Api<DynamicObject>,
    name: &str,
) -> (String, String, String) {
    until(90, &format!("{name} decided"), world, || {
        provisioned(requests, name)
    })
    .await
}

/// The held bindings of the request with UID `uid`.
async fn held_bindings(world: &World, uid: &str) -> Vec<CloudPodBinding> {
    let params = ListParams::default().labels(&format!("cloud.aibrix.ai/held-for={uid}"));
    world.bindings().list(&params).await.unwrap().items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provisioning_request_rents_its_machines_ahead_and_its_pods_take_them() {
    let world = World::new("ahead", true).await;
    neocloud_testenv::kueue::install_provisioning_request_crd(world.ctx.control_plane)
        .await
        .expect("the ProvisioningRequest CRD (hack/testenv/build-kueue.sh)");
    let mut node = world.spawn();
    let ns = &world.ctx.namespace;
    let templates: Api<PodTemplate> = Api::namespaced(world.ctx.client.clone(), ns);
    let template: PodTemplate = serde_json::from_value(json!({
        "metadata": {"name": "trainer"},
        "template": {
            "metadata": {"annotations": {"cloud.aibrix.ai/providers": "lambda"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main",
                "image": "registry.invalid/cuda:12",
                "command": ["sh", "-c", "echo trained by $HOSTNAME; exit 0"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }
    }))
    .unwrap();
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let requests: Api<DynamicObject> = Api::namespaced_with(
        world.ctx.client.clone(),
        ns,
        &neocloud_testenv::kueue::provisioning_request_resource(),
    );
    let request = |name: &str, count: u32| {
        let resource = neocloud_testenv::kueue::provisioning_request_resource();
        let mut req = DynamicObject::new(name, &resource);
        // Named for this node: the other tests' nodes serve the class too.
        req.data = json!({"spec": {"provisioningClassName": "rent.cloud.aibrix.ai",
            "parameters": {"NodeName": world.node},
            "podSets": [{"podTemplateRef": {"name": "trainer"}, "count": count}]}});
        req
    };
    let before = world.sims.lambda.ledger().entries.len();

    // A request for two: two machines are rented and their runners are up before it says
    // Provisioned, and no Pod exists yet.
    let created = requests
        .create(&PostParams::default(), &request("two", 2))
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let (status, reason, message) = decided(&world, &requests, "two").await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Rented"),
        "{message}"
    );
    assert!(
        message.starts_with("2 machines rented and held"),
        "{message}"
    );
    let held = held_bindings(&world, &uid).await;
    assert_eq!(held.len(), 2, "{held:?}");
    let machines: Vec<String> = held
        .iter()
        .map(|b| {
            b.status
                .as_ref()
                .and_then(|s| s.instance_id.clone())
                .expect("an instance")
        })
        .collect();
    let ledger = world.sims.lambda.ledger();
    assert_eq!(ledger.entries.len(), before + 2, "two rentals: {ledger:?}");
    assert_eq!(ledger.live().len(), 2);
    assert!(
        runner_pids(world.callback_port).len() == 2,
        "two runners wait"
    );

    // Two Pods consume it: each takes a held machine, and nothing more is rented.
    for name in ["trainer-0", "trainer-1"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {
                "cloud.aibrix.ai/providers": "lambda",
                "autoscaling.x-k8s.io/consume-provisioning-request": "two"}},
            "spec": {"nodeName": world.node, "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                    "command": ["sh", "-c", "echo trained; exit 0"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .unwrap();
        world
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }
    let mut took = Vec::new();
    for name in ["trainer-0", "trainer-1"] {
        until(90, &format!("{name} Succeeded"), &world, || async {
            let pod = world.pods().get(name).await.ok()?;
            let phase = pod.status.and_then(|s| s.phase);
            (phase.as_deref() == Some("Succeeded")).then_some(())
        })
        .await;
        let b = world.bindings().get(name).await.unwrap();
        let status = b.status.unwrap();
        let last = status
            .attempts
            .last()
            .unwrap()
            .message
            .clone()
            .unwrap_or_default();
        assert!(last.starts_with("took lambda instance"), "{last}");
        took.push(status.instance_id.unwrap());
    }
    took.sort();
    let mut rented = machines.clone();
    rented.sort();
    assert_eq!(took, rented, "each Pod ran on a machine rented ahead");
    assert_eq!(
        world.sims.lambda.ledger().entries.len(),
        before + 2,
        "nothing else rented"
    );
    until(90, "the held bindings removed", &world, || async {
        held_bindings(&world, &uid).await.is_empty().then_some(())
    })
    .await;

    // A request whose Pods never come.
    let one = requests
        .create(&PostParams::default(), &request("one", 1))
        .await
        .unwrap();
    let one_uid = one.metadata.uid.clone().unwrap();
    let (status, reason, message) = decided(&world, &requests, "one").await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Rented"),
        "{message}"
    );
    assert_eq!(world.sims.lambda.ledger().entries.len(), before + 3);

    // Its machine is lost (a spot reclaim: its runner goes silent): the request says
    // CapacityRevoked, and the machine is released.
    let pids = runner_pids(world.callback_port);
    assert_eq!(pids.len(), 1, "the held machine's runner waits: {pids:?}");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let revoked = until(90, "CapacityRevoked", &world, || async {
        let req = requests.get("one").await.ok()?;
        let conditions = req.data["status"]["conditions"].as_array()?.clone();
        let c = conditions
            .into_iter()
            .find(|c| c["type"] == "CapacityRevoked")?;
        Some(c["message"].as_str().unwrap_or_default().to_owned())
    })
    .await;
    assert!(revoked.starts_with("lambda instance "), "{revoked}");
    until(90, "the lost machine released", &world, || async {
        world.sims.lambda.ledger().live().is_empty().then_some(())
    })
    .await;
    requests
        .delete("one", &DeleteParams::default())
        .await
        .unwrap();
    until(90, "the unused machine released", &world, || async {
        let none_live = world.sims.lambda.ledger().live().is_empty();
        let gone = held_bindings(&world, &one_uid).await.is_empty();
        (none_live && gone).then_some(())
    })
    .await;
    let ledger = world.sims.lambda.ledger();
    assert_eq!(ledger.entries.len(), before + 3, "{ledger:?}");

    // A new leader does not keep machines an earlier one rented ahead (their runners wait on
    // its memory): it releases them, and the request's Pods rent their own when they come.
    requests
        .create(&PostParams::default(), &request("kept", 1))
        .await
        .unwrap();
    let (status, reason, message) = decided(&world, &requests, "kept").await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Rented"),
        "{message}"
    );
    assert_eq!(world.sims.lambda.ledger().live().len(), 1);
    node.kill().await.unwrap();
    let _node = world.spawn();
    until(
        90,
        "the new leader releasing the held machine",
        &world,
        || async { world.sims.lambda.ledger().live().is_empty().then_some(()) },
    )
    .await;
    assert_eq!(world.sims.lambda.ledger().entries.len(), before + 4);

    // All or none: room for one machine only, so the second cannot be rented, and the first
    // is released; the request fails saying so.
    let a10 = world.sims.lambda.ledger().entries[before].offer_id;
    for offer in world.sims.lambda.offers() {
        let room = u32::from(offer.id == a10);
        assert!(world.sims.lambda.set_capacity(offer.id, room));
    }
    let short = requests
        .create(&PostParams::default(), &request("short", 2))
        .await
        .unwrap();
    let short_uid = short.metadata.uid.clone().unwrap();
    let (status, reason, message) = decided(&world, &requests, "short").await;
    assert_eq!(status, "False", "{reason}: {message}");
    assert!(
        message.starts_with("machine 2 of 2 could not be rented on lambda us-east-1")
            && message.ends_with("; the machine rented for it is released"),
        "{reason}: {message}"
    );
    until(90, "the partial rental released", &world, || async {
        let none_live = world.sims.lambda.ledger().live().is_empty();
        let gone = held_bindings(&world, &short_uid).await.is_empty();
        (none_live && gone).then_some(())
    })
    .await;
    assert_eq!(
        world.sims.lambda.ledger().entries.len(),
        before + 5,
        "one rental, released"
    );
    // What each held machine cost until it was taken or released is kept, as any rental's.
    let receipts: Api<CloudPodReceipt> = Api::namespaced(world.ctx.client.clone(), ns);
    let held_receipts = (receipts
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter())
    .filter(|r| r.spec.pod_name.starts_with("held-"))
    .count();
    assert!(
        held_receipts >= 4,
        "{held_receipts} receipts of held machines"
    );
}
