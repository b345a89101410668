//! A burst Pod on the cluster network, on the rig's real worker node (kubelet, kube-proxy,
//! containerd): `neocloud-node run` with RunPod (its simulator starting the real runner, process
//! executor) and relays in the node's own image (built by `hack/image/build.py`, imported into
//! the worker's containerd).
//!
//! - A burst Pod serving HTTP with a TCP `containerPort` and a readiness probe that fails for its
//!   first seconds gets a relay Pod on the worker node (owned by it, unprivileged, selected by
//!   nothing of the user's); the relay's IP becomes the burst Pod's `podIP`, and the Pod turns
//!   Ready only once its probe passes.
//! - A Service selecting the burst Pod lists it in its EndpointSlice only once it is Ready, at
//!   the relay's address; a client Pod on the worker node reaches the workload both at the
//!   Service's cluster IP (through kube-proxy) and at the Pod's IP.
//! - The relay Pod deleted: the burst Pod is not Ready until a new relay runs, then takes its IP
//!   (the API server accepts a changed `status.podIP`) and serves again.
//! - A UDP port is refused before anything is rented, naming the field.
//! - Deleting the burst Pod releases its instance and takes its relay Pod and Secret with it.
//! - The README's serving example (`examples/serving.yaml`), as written but for its image and
//!   command: an inference
//!   Deployment whose one replica runs on the real node and the other bursts. The burst replica
//!   enters the Service's EndpointSlice only once its probe passes; a client Pod reaches both
//!   through the Service and at the podIPs the gateway's view lists (AIBrix's: Pods by
//!   `model.aibrix.ai/name`, Ready, `podIP:<model.aibrix.ai/port>`); a server-sent-events
//!   response streams through unbuffered; the burst replica's runner cut takes it out of the
//!   EndpointSlice within the heartbeat timeout.
//! - A burst workload reads its ConfigMap file and calls an in-cluster Service it named
//!   (`cloud.aibrix.ai/egress`), a Pod on the real node, at its port on the machine's loopback,
//!   with its cluster name in the machine's hosts file; a Service it did not name is refused.

use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use neocloud_testenv::WorkerNode;
use serde_json::json;

mod runner_bin;
mod support;
mod vm_support;
use support::free_port;
use vm_support::{World, runner_pids, until};

const IMAGE: &str = "ghcr.io/aibrix/neocloud-node:e2e";
const BUSYBOX: &str = "neocloud.invalid/busybox:1";

/// How long the workload's readiness endpoint answers 503 after it starts.
const NOT_READY_SECONDS: u64 = 8;

/// The "inference server": `/ready` answers 503 for its first seconds, `/hello` says who it is.
const SERVER: &str = r#"
import http.server, sys, time
start = time.time()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/ready":
            code, body = (200, b"ok") if time.time() - start > float(sys.argv[2]) else (503, b"loading")
        elif self.path == "/events":
            # Server-sent events 5 s apart: the first must reach the client before the last
            # is written.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for n, event in enumerate(["first", "last"]):
                if n:
                    time.sleep(5)
                self.wfile.write(b"data: " + event.encode() + b"\n\n")
                self.wfile.flush()
            self.close_connection = True
            return
        elif self.path == "/hello":
            code, body = 200, b"hello from the burst replica\n"
        else:
            code, body = 404, b""
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

fn ready(pod: &Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    Some(
        conditions
            .iter()
            .find(|c| c.type_ == "Ready")?
            .status
            .clone(),
    )
}

fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.pod_ip.clone()
}

/// A shell command fetching `/hello` from `host:port` (busybox's static `wget` crashes in the
/// rig's image, so by hand with `nc`).
fn get(host: &str, port: u16) -> String {
    format!("printf 'GET /hello HTTP/1.0\\r\\n\\r\\n' | nc -w 10 {host} {port}")
}

/// Runs `script` in a busybox Pod on the worker node and returns its log once it succeeded.
async fn client(world: &World, worker: &str, name: &str, script: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": worker,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                "args": [script]}],
        }
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let phase = until(90, &format!("client {name} ends"), world, || async {
        let pod = world.pods().get(name).await.ok()?;
        let phase = pod.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await;
    let log = world
        .pods()
        .logs(name, &LogParams::default())
        .await
        .unwrap_or_default();
    assert_eq!(phase, "Succeeded", "client {name}: {log}");
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_pod_serves_on_the_cluster_network_through_its_relay() {
    let dir = tempfile::tempdir().unwrap();
    // The machine's hosts file, as the runner finds it (not this host's /etc/hosts).
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    let runner = vm_support::runner_with_hosts_file(dir.path(), &hosts);
    let mut world = World::containers_with("serving", runner).await;
    let worker = WorkerNode::start(world.ctx.control_plane, "serving-worker")
        .await
        .unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_neocloud-node"));
    support::import_node_image(&worker, binary, IMAGE, dir.path());
    worker.import_busybox(BUSYBOX, &["/bin/sh", "-c"]).unwrap();
    world.extra_config = format!(
        "kubeletApi:\n  relays: {{image: \"{IMAGE}\", address: \"{}:{}\"}}\n",
        worker.host_ip(),
        world.kubelet_port
    );
    let _node = world.spawn();

    // A UDP port: refused before anything is rented, naming the field.
    let udp: Pod = serde_json::from_value(json!({
        "metadata": {"name": "dns", "annotations": {"cloud.aibrix.ai/providers": "runpod"}},
        "spec": {"nodeName": world.node, "containers": [{"name": "main",
            "image": "registry.invalid/dns:1", "command": ["sleep", "600"],
            "ports": [{"containerPort": 8053}, {"containerPort": 53, "protocol": "UDP"}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &udp)
        .await
        .unwrap();
    let message = until(60, "the UDP Pod is refused", &world, || async {
        let status = world.pods().get("dns").await.ok()?.status?;
        (status.reason.as_deref() == Some("Unsupported")).then_some(status.message?)
    })
    .await;
    assert!(
        message.contains("spec.containers[0].ports[1].protocol: \"UDP\" is not carried"),
        "{message}"
    );

    // The burst replica.
    let port = free_port();
    let script = dir.path().join("server.py");
    std::fs::write(&script, SERVER).unwrap();
    let replica: Pod = serde_json::from_value(json!({
        "metadata": {"name": "llama-burst", "labels": {"app": "infer",
            "model.aibrix.ai/name": "llama"},
            "annotations": {"cloud.aibrix.ai/providers": "runpod"}},
        "spec": {"nodeName": world.node, "containers": [{"name": "main",
            "image": "registry.invalid/vllm:1",
            "command": ["python3", script.to_str().unwrap(), port.to_string(),
                NOT_READY_SECONDS.to_string()],
            "ports": [{"containerPort": port, "name": "http"}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"},
                "periodSeconds": 1, "failureThreshold": 1},
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    let created = world
        .pods()
        .create(&PostParams::default(), &replica)
        .await
        .unwrap();
    let uid = created.metadata.uid.unwrap();
    let relay_name = format!("neocloud-relay-{uid}");

    // Running, not Ready while its model "loads", with its relay's IP.
    let relay_ip = until(120, "the relay runs with an IP", &world, || async {
        let relay = world.pods().get(&relay_name).await.ok()?;
        (relay.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(())?;
        pod_ip(&relay)
    })
    .await;
    let relay = world.pods().get(&relay_name).await.unwrap();
    assert_eq!(
        relay.spec.as_ref().unwrap().node_name.as_deref(),
        Some("serving-worker")
    );
    assert!(!relay.metadata.labels.as_ref().unwrap().contains_key("app"));
    assert_eq!(
        relay.metadata.owner_references.as_ref().unwrap()[0].uid,
        uid
    );
    let pod = until(60, "the burst Pod takes its relay's IP", &world, || async {
        let pod = world.pods().get("llama-burst").await.ok()?;
        (pod_ip(&pod).as_deref() == Some(relay_ip.as_str())).then_some(pod)
    })
    .await;
    let started = pod.status.as_ref().and_then(|s| s.start_time.clone());
    let slices: Api<EndpointSlice> =
        Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let services: Api<Service> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "infer"},
        "spec": {"selector": {"app": "infer"}, "ports": [{"port": 80, "targetPort": "http"}]}
    }))
    .unwrap();
    let service = services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();
    // The endpoint, by whether it is ready.
    let endpoint = || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=infer"))
            .await
            .ok()?;
        list.items
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .find_map(|e| {
                (e.addresses.first() == Some(&relay_ip))
                    .then(|| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
            })
    };
    if ready(&pod).as_deref() == Some("True") {
        panic!("Ready before the readiness probe passed: {:?}", pod.status);
    }
    until(
        60,
        "the Service lists the burst Pod as not ready",
        &world,
        || async { (endpoint().await == Some(false)).then_some(()) },
    )
    .await;
    until(60, "the burst Pod turns Ready", &world, || async {
        let pod = world.pods().get("llama-burst").await.ok()?;
        (ready(&pod).as_deref() == Some("True")).then_some(())
    })
    .await;
    until(
        60,
        "the Service lists the burst Pod as ready",
        &world,
        || async { (endpoint().await == Some(true)).then_some(()) },
    )
    .await;
    let log = client(
        &world,
        "serving-worker",
        "caller",
        &format!("{} && {}", get(&cluster_ip, 80), get(&relay_ip, port)),
    )
    .await;
    assert_eq!(
        log.matches("hello from the burst replica").count(),
        2,
        "{log}"
    );
    // A server-sent-events response streams through unbuffered: each line is stamped as it
    // arrives, and the first event comes seconds before the last.
    let log = client(
        &world,
        "serving-worker",
        "sse",
        &format!(
            "(printf 'GET /events HTTP/1.0\\r\\n\\r\\n'; sleep 12) | nc -w 15 {relay_ip} {port} \
             | while read -r line; do echo \"$(date +%s) $line\"; done"
        ),
    )
    .await;
    let stamp = |event: &str| -> u64 {
        let line = log
            .lines()
            .find(|l| l.ends_with(event))
            .unwrap_or_else(|| panic!("{log}"));
        line.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (first, last) = (stamp("data: first"), stamp("data: last"));
    assert!(last >= first + 2, "the first event was held back: {log}");

    // The relay lost: not Ready until a new one runs, then at its address.
    let old_relay = relay.metadata.uid.clone();
    world
        .pods()
        .delete(&relay_name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    until(
        30,
        "the burst Pod is not Ready without its relay",
        &world,
        || async {
            let pod = world.pods().get("llama-burst").await.ok()?;
            (ready(&pod).as_deref() == Some("False")).then_some(())
        },
    )
    .await;
    let new_ip = until(120, "a new relay runs", &world, || async {
        let relay = world.pods().get(&relay_name).await.ok()?;
        (relay.metadata.uid != old_relay).then_some(())?;
        (relay.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(())?;
        pod_ip(&relay).filter(|ip| *ip != relay_ip)
    })
    .await;
    let pod = until(
        60,
        "the burst Pod is Ready at its new relay's IP",
        &world,
        || async {
            let pod = world.pods().get("llama-burst").await.ok()?;
            (pod_ip(&pod).as_deref() == Some(new_ip.as_str())
                && ready(&pod).as_deref() == Some("True"))
            .then_some(pod)
        },
    )
    .await;
    assert_eq!(
        pod.status.unwrap().start_time,
        started,
        "the same Pod, not restarted"
    );
    let log = client(
        &world,
        "serving-worker",
        "caller-again",
        &get(&cluster_ip, 80),
    )
    .await;
    assert!(log.contains("hello from the burst replica"), "{log}");

    // Deleted: the instance is released, and the relay and its Secret go with the Pod.
    world
        .pods()
        .delete("llama-burst", &DeleteParams::default())
        .await
        .unwrap();
    until(90, "the burst Pod is gone", &world, || async {
        world
            .pods()
            .get_opt("llama-burst")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    until(60, "the relay and its Secret are gone", &world, || async {
        let relay = world.pods().get_opt(&relay_name).await.ok()?;
        let secret = secrets.get_opt(&relay_name).await.ok()?;
        (relay.is_none() && secret.is_none()).then_some(())
    })
    .await;
    let ledger = world.sims.runpod.ledger();
    assert_eq!(
        ledger.entries.len(),
        1,
        "one rental, for the replica: {ledger:?}"
    );
    assert!(ledger.live().is_empty(), "no instance left: {ledger:?}");

    inference_deployment(&world, &worker).await;
    reaching_the_cluster(&world, &worker, &hosts).await;
    drop(worker);
}

/// A burst workload reads its ConfigMap file and calls an in-cluster Service it named (a "model
/// registry" Pod on the real node), at its port on the machine's loopback and by its cluster name in the hosts file, and
/// is refused one it did not name. The node runs on this host, so the Pod network is routed to
/// the worker (in a cluster the node is a Pod there).
async fn reaching_the_cluster(world: &World, worker: &WorkerNode, hosts: &Path) {
    worker.route_pod_network().unwrap();
    let ns = world.ctx.namespace.clone();
    // Its chat template, a ConfigMap file (the process executor writes it at the mount path on
    // the machine, here under the test's directory).
    let configmaps: Api<ConfigMap> = Api::namespaced(world.ctx.client.clone(), &ns);
    let template: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "chat-template"},
        "data": {"template.jinja": "{{ messages }} <- llama chat template"}
    }))
    .unwrap();
    configmaps
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let mount = hosts.with_file_name("model-config");
    let registry: Pod = serde_json::from_value(json!({
        "metadata": {"name": "model-registry", "labels": {"app": "model-registry"}},
        "spec": {"nodeName": worker.name(), "containers": [{"name": "main", "image": BUSYBOX,
            "imagePullPolicy": "Never",
            "args": ["mkdir -p /www && echo model-weights-v1 > /www/model && exec httpd -f -p 8080 -h /www"],
            "ports": [{"containerPort": 8080}]}]}
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &registry)
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(world.ctx.client.clone(), &ns);
    let (named, unnamed) = (free_port(), free_port());
    for (name, port) in [("model-registry", named), ("vault", unnamed)] {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"selector": {"app": "model-registry"},
                "ports": [{"port": port, "targetPort": 8080}]}
        }))
        .unwrap();
        services
            .create(&PostParams::default(), &service)
            .await
            .unwrap();
    }
    until(90, "the registry is ready", world, || async {
        let pod = world.pods().get("model-registry").await.ok()?;
        (ready(&pod).as_deref() == Some("True")).then_some(())
    })
    .await;
    let template = mount.join("template.jinja").display().to_string();
    let script = format!(
        "import socket, urllib.request\n\
         print(open('{template}').read())\n\
         print(urllib.request.urlopen('http://127.0.0.1:{named}/model', timeout=20).read().decode().strip())\n\
         try:\n    socket.create_connection(('127.0.0.1', {unnamed}), timeout=5)\n    print('vault: reached')\n\
         except OSError as e:\n    print('vault: refused')\n"
    );
    let fetcher: Pod = serde_json::from_value(json!({
        "metadata": {"name": "fetcher", "annotations": {"cloud.aibrix.ai/providers": "runpod",
            "cloud.aibrix.ai/egress": format!("model-registry.{ns}:{named}")}},
        "spec": {"nodeName": world.node, "restartPolicy": "Never", "containers": [{
            "name": "main", "image": "registry.invalid/tools:1",
            "command": ["python3", "-c", script],
            "volumeMounts": [{"name": "template", "mountPath": mount.display().to_string()}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "volumes": [{"name": "template", "configMap": {"name": "chat-template"}}]}
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &fetcher)
        .await
        .unwrap();
    world.wait_phase("fetcher", &["Succeeded", "Failed"]).await;
    let log = world
        .pods()
        .logs("fetcher", &LogParams::default())
        .await
        .unwrap_or_default();
    assert!(
        log.contains("model-weights-v1"),
        "{log}\n{}",
        world.node_log()
    );
    assert!(log.contains("vault: refused"), "{log}");
    assert!(log.contains("<- llama chat template"), "{log}");
    let hosts = std::fs::read_to_string(hosts).unwrap_or_default();
    assert!(
        hosts.contains(&format!("model-registry.{ns}.svc")),
        "{hosts}"
    );
}

/// The replicas' server: busybox's `httpd` in the image on the real node, Python's on the
/// burst machine (the process executor runs the command there), each saying where it runs;
/// `/health` (vLLM's readiness endpoint) exists only after [`LOADING_SECONDS`].
fn replica_script(port: u16) -> String {
    format!(
        "D=$(mktemp -d); \
         if command -v python3 >/dev/null; then echo 'hello from the burst replica' > $D/hello; \
         else echo 'hello from the real node' > $D/hello; fi; \
         (sleep {LOADING_SECONDS}; echo ok > $D/health) & \
         if command -v python3 >/dev/null; then \
         exec python3 -m http.server {port} --bind 127.0.0.1 --directory $D; \
         else exec httpd -f -p {port} -h $D; fi"
    )
}

/// The Deployment and Service of the README's serving example (`examples/serving.yaml`), as
/// written.
fn readme_example() -> (Deployment, Service) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/serving.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let (deployment, service) = text.split_once("\n---\n").expect("two documents");
    (
        serde_yaml::from_str(deployment).unwrap(),
        serde_yaml::from_str(service).unwrap(),
    )
}

/// How long each replica "loads its model" (its readiness probe fails).
const LOADING_SECONDS: u64 = 20;

/// The README's serving example (an inference Deployment of two replicas and its Service),
/// with one replica on the real node (its one GPU) and one that bursts; the gateway's view of
/// them; the burst replica's runner cut.
async fn inference_deployment(world: &World, worker: &WorkerNode) {
    let client_api = world.ctx.client.clone();
    let ns = world.ctx.namespace.clone();
    let nodes: Api<Node> = Api::all(client_api.clone());
    nodes
        .patch_status(
            worker.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"nvidia.com/gpu": "1"}}})),
        )
        .await
        .unwrap();
    until(30, "the worker allocating a GPU", world, || async {
        let status = nodes.get(worker.name()).await.ok()?.status?;
        (status.allocatable?.get("nvidia.com/gpu")?.0 == "1").then_some(())
    })
    .await;
    let (mut deployment, service) = readme_example();
    let labels = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap();
    let port: u16 = labels.labels.as_ref().unwrap()["model.aibrix.ai/port"]
        .parse()
        .unwrap();
    // Only what cannot run here is swapped: the image and the command.
    let container = &mut deployment
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0];
    container.image = Some(BUSYBOX.to_owned());
    container.image_pull_policy = Some("IfNotPresent".to_owned());
    container.command = Some(vec!["/bin/sh".into(), "-c".into(), replica_script(port)]);
    container.args = None;
    let deployments: Api<Deployment> = Api::namespaced(client_api.clone(), &ns);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let on = |pods: &[Pod], node: &str| -> Option<Pod> {
        pods.iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .cloned()
    };
    let (local, burst) = until(
        120,
        "one replica on each node, both Running",
        world,
        || async {
            let pods = world
                .pods()
                .list(&ListParams::default().labels("app=llama-8b"))
                .await
                .ok()?
                .items;
            let local = on(&pods, worker.name())?;
            let burst = on(&pods, &world.node)?;
            let running = |p: &Pod| p.status.as_ref()?.phase.as_deref().map(|p| p == "Running");
            (running(&local)? && running(&burst)?).then_some((local, burst))
        },
    )
    .await;
    let (local_name, burst_name) = (local.name_any(), burst.name_any());
    let local_ip = until(60, "the local replica's IP", world, || async {
        pod_ip(&world.pods().get(&local_name).await.ok()?)
    })
    .await;
    let burst_ip = until(120, "the burst replica's relay address", world, || async {
        pod_ip(&world.pods().get(&burst_name).await.ok()?)
    })
    .await;
    let services: Api<Service> = Api::namespaced(client_api.clone(), &ns);
    let created = services.create(&PostParams::default(), &service).await;
    let cluster_ip = created.unwrap().spec.unwrap().cluster_ip.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(client_api.clone(), &ns);
    let endpoints = || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=llama-8b"))
            .await
            .ok()?;
        let ready: std::collections::BTreeMap<String, bool> = (list.items.iter())
            .flat_map(|s| s.endpoints.iter())
            .filter_map(|e| {
                let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
                Some((e.addresses.first()?.clone(), ready))
            })
            .collect();
        Some(ready)
    };
    // The burst replica is listed, not ready, while it loads; then ready.
    let first = until(60, "the burst replica listed", world, || async {
        endpoints().await?.get(&burst_ip).copied()
    })
    .await;
    assert!(!first, "listed ready before its probe passed");
    until(
        90,
        "both replicas ready in the EndpointSlice",
        world,
        || async {
            let e = endpoints().await?;
            (e.get(&burst_ip) == Some(&true) && e.get(&local_ip) == Some(&true)).then_some(())
        },
    )
    .await;

    // Through the Service, from a Pod on the real node: both replicas answer.
    let many = (0..24)
        .map(|_| get(&cluster_ip, 80))
        .collect::<Vec<_>>()
        .join("; ");
    let log = client(world, worker.name(), "spread", &many).await;
    assert!(log.contains("hello from the burst replica"), "{log}");
    assert!(log.contains("hello from the real node"), "{log}");

    // The gateway's view (AIBrix's): Pods by `model.aibrix.ai/name` that have a podIP, are not
    // terminating and are Ready, each dialled at podIP:<model.aibrix.ai/port>.
    let listed = world
        .pods()
        .list(&ListParams::default().labels("model.aibrix.ai/name=llama-8b"))
        .await
        .unwrap();
    let targets: Vec<(String, u16)> = (listed.items.iter())
        .filter(|p| p.metadata.deletion_timestamp.is_none() && ready(p).as_deref() == Some("True"))
        .filter_map(|p| {
            let port = p.labels().get("model.aibrix.ai/port")?.parse().ok()?;
            Some((pod_ip(p)?, port))
        })
        .collect();
    assert_eq!(targets.len(), 2, "{targets:?}");
    let script = (targets.iter())
        .map(|(host, port)| get(host, *port))
        .collect::<Vec<_>>()
        .join(" && ");
    let log = client(world, worker.name(), "gateway", &script).await;
    assert!(
        log.contains("hello from the burst replica") && log.contains("hello from the real node"),
        "{log}"
    );

    // The burst replica's runner cut (stopped: no heartbeat, no session): it leaves the
    // EndpointSlice once the heartbeat timeout (3 s) and the controllers have run (3.3 s on an
    // idle machine). How long is printed, not asserted: a loaded machine only slows it.
    let pids = runner_pids(world.callback_port);
    assert_eq!(pids.len(), 1, "one runner: {pids:?}");
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let cut = std::time::Instant::now();
    until(
        30,
        "the burst replica leaves the EndpointSlice",
        world,
        || async {
            let e = endpoints().await?;
            (e.get(&burst_ip) != Some(&true)).then_some(())
        },
    )
    .await;
    let gone = cut.elapsed();
    eprintln!("the cut burst replica left the EndpointSlice after {gone:?}");

    // Scaled to zero: every instance released.
    deployments
        .patch(
            "llama-8b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    until(120, "no instance left", world, || async {
        world.sims.runpod.ledger().live().is_empty().then_some(())
    })
    .await;
}
