//! Egress end to end: `neocloud-node run` on the real control plane renting from the RunPod
//! simulator, whose container runs the real `neocloud-runner` (process executor). The Pod names
//! one in-cluster Service in `cloud.aibrix.ai/egress`; its workload (a shell command) reaches
//! it at `127.0.0.1:{the Service's port}` on the machine, carried through the node, which dials
//! the Service's endpoint behind that port. Another Service, which it did not name, is refused:
//! nothing listens for it on the machine and the node never dials it.
//!
//! A BurstPolicy's `spec.egress` limits what the Pods of the namespaces it governs may name.
//!
//! The Services have no selector: their EndpointSlices are written by the test and point at
//! servers this test runs on the host (the rig's control plane has no kube-proxy on the host's
//! network; the node resolves a Service to a ready endpoint, which is what it dials in a real
//! cluster too). A first step before the worker-node test of issue 32 item 6.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::PostParams;
use neocloud_node::crd::BurstPolicy;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

mod runner_bin;
mod support;
mod vm_support;
use vm_support::World;

/// A server on every address that writes `greeting` to each connection and closes it; its port
/// and how many connections it accepted.
async fn greeter(greeting: &'static str) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let _ = socket.write_all(greeting.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (port, accepted)
}

/// This machine's first non-loopback IPv4 address (an endpoint address may not be loopback).
fn host_address() -> String {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket.connect("10.255.255.1:9").unwrap();
    socket.local_addr().unwrap().ip().to_string()
}

/// A selector-less Service `name` with TCP port `port` (named `tcp`), whose one EndpointSlice
/// points at `address:target`.
async fn service(world: &World, name: &str, port: u16, address: &str, target: u16) {
    let ns = &world.ctx.namespace;
    let services: Api<Service> = Api::namespaced(world.ctx.client.clone(), ns);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "tcp", "port": port, "targetPort": target}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(world.ctx.client.clone(), ns);
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-1"),
            "labels": {"kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "egress-test"}},
        "addressType": "IPv4",
        "ports": [{"name": "tcp", "port": target, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
    }))
    .unwrap();
    slices.create(&PostParams::default(), &slice).await.unwrap();
}

/// Connects to each `127.0.0.1:PORT` given and writes what it read, or why not, to the file.
const CLIENT: &str = r#"
import socket, sys
out = open(sys.argv[1], "w")
for port in sys.argv[2:]:
    try:
        s = socket.create_connection(("127.0.0.1", int(port)), timeout=10)
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        out.write(f"{port}: {data.decode().strip()}\n")
    except OSError as e:
        out.write(f"{port}: refused ({e.__class__.__name__})\n")
out.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_workload_reaches_a_service_it_named_and_not_one_it_did_not() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    let runner = vm_support::runner_with_hosts_file(dir.path(), &hosts);
    let world = World::containers_with("egress", runner).await;
    let mut node = world.spawn();
    let ns = world.ctx.namespace.clone();
    let address = host_address();
    let (named_target, named_hits) = greeter("hello from the cluster").await;
    let (other_target, other_hits) = greeter("secret").await;
    let (named_port, other_port) = (support::free_port(), support::free_port());
    service(&world, "registry", named_port, &address, named_target).await;
    service(&world, "vault", other_port, &address, other_target).await;

    let out = dir.path().join("out");
    let command = [
        "python3".to_owned(),
        "-c".to_owned(),
        CLIENT.to_owned(),
        out.display().to_string(),
        named_port.to_string(),
        other_port.to_string(),
    ];
    let egress = format!("registry.{ns}:{named_port}");
    egress_pod(&world, "caller", &egress, &command).await;
    let done = world.wait_phase("caller", &["Succeeded", "Failed"]).await;
    let phase = done.status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Succeeded"), "{}", world.node_log());

    let said = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        said,
        format!(
            "{named_port}: hello from the cluster\n{other_port}: refused (ConnectionRefusedError)\n"
        ),
        "{}",
        world.node_log()
    );
    assert_eq!(named_hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        other_hits.load(Ordering::SeqCst),
        0,
        "the node dialled an un-named Service"
    );
    let names = std::fs::read_to_string(&hosts).unwrap();
    assert!(
        names.contains(&format!(
            "127.0.0.1 registry.{ns}.svc.cluster.local registry.{ns}.svc registry.{ns} "
        )),
        "{names}"
    );
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_egress_entry_is_refused_naming_it_and_nothing_is_rented() {
    let world = World::containers("egressbad").await;
    let mut node = world.spawn();
    let exit = ["true".to_owned()];
    egress_pod(&world, "bad", "registry.ml:8080, vault:80", &exit).await;
    let message = refusal(&world, "bad").await;
    assert!(
        message.contains(
            "metadata.annotations[cloud.aibrix.ai/egress]: entry \"vault:80\": is not \
             name.namespace:port"
        ),
        "{message}"
    );
    assert!(world.sims.ledger().entries.is_empty(), "nothing rented");
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

/// Waits up to 60 s for Pod `name` to be refused as unsupported; its message.
async fn refusal(world: &World, name: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = world
            .pods()
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        if status.reason.as_deref() == Some("Unsupported") {
            return status.message.unwrap_or_default();
        }
        assert!(tokio::time::Instant::now() < deadline, "{status:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Pod `name` running `command` through the runner, naming `egress`.
async fn egress_pod(world: &World, name: &str, egress: &str, command: &[String]) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"cloud.aibrix.ai/egress": egress}},
        "spec": {"nodeName": world.node, "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "command": command, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    let pods = world.pods();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_policy_limits_the_destinations_a_namespace_may_name() {
    let world = World::containers("egresspol").await;
    let mut node = world.spawn();
    let ns = world.ctx.namespace.clone();
    let name = format!("{ns}-egress");
    let policy: BurstPolicy = serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": name},
        "spec": {"cel": {"constraints": "true"},
            "egress": {"namespaces": [ns], "allowed": [format!("registry.{ns}:*")]}},
    }))
    .unwrap();
    let policies: Api<BurstPolicy> = Api::all(world.ctx.client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // The node installs the CRD as it starts.
    while let Err(e) = policies.create(&PostParams::default(), &policy).await {
        assert!(tokio::time::Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while !policies
        .get(&name)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.loaded)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            world.node_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let exit = ["true".to_owned()];
    let both = format!("registry.{ns}:80, vault.{ns}:80");
    egress_pod(&world, "denied", &both, &exit).await;
    let message = refusal(&world, "denied").await;
    assert!(
        message.contains(&format!(
            "metadata.annotations[cloud.aibrix.ai/egress]: vault.{ns}:80 is not allowed for \
             namespace {ns} by BurstPolicy {name} (spec.egress.allowed)"
        )),
        "{message}"
    );
    egress_pod(&world, "allowed", &format!("registry.{ns}:80"), &exit).await;
    world.wait_phase("allowed", &["Succeeded"]).await;
    assert_eq!(
        world.sims.ledger().entries.len(),
        1,
        "only the allowed Pod rented"
    );
    policies.delete(&name, &Default::default()).await.unwrap();
    node.start_kill().unwrap();
    let _ = node.wait().await;
}
