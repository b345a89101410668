//! The node installed as users install it, on a real worker node (kubelet, containerd, runc,
//! kube-proxy): the image built by `hack/image/build.py` and imported into the node's
//! containerd, `config/default` applied with kubectl through an overlay that only sets the image.
//!
//! - Both replicas run under the manifests' security context and pass their probes; one holds
//!   the Lease, and only its Pod carries the leader label.
//! - A fake-provider Pod bound to the virtual node goes Running through the in-cluster leader,
//!   which reached the API server at the `kubernetes` Service with its ServiceAccount.
//! - Reconfigured for RunPod (its simulator, reached from the Pods) with the runner callback
//!   behind `config/components/runner-callback`: the rollout completes (a standby is ready), the
//!   callback Service's only endpoint is the leader and answers a Pod there; deleting the leader
//!   Pod hands leadership, the label and the Service to another replica (the standby, or the
//!   replacement if it reads the handed-back Lease first) within the Lease's term, and the
//!   RunPod Pod keeps its one instance.
//! - Bursting (the real node's capacity patched, as a device plugin would report it): with the
//!   real node advertising two `nvidia.com/gpu`, a Deployment of four GPU Pods
//!   that prefer real nodes fills the real node and overflows onto the virtual node; scaling it to
//!   zero releases the instances.
//! - The Helm chart installs beside it (`helm install --wait`, which needs every replica ready),
//!   leads its own virtual node, and its callback Service routes to its leader.
//!
//! At the end the worker node leaves nothing behind.
//!
//! The image is built from the test build's (debug) binary, or `$NEOCLOUD_E2E_NODE_BINARY`;
//! `make image` ships the release build through the same script. Figures (apply to Ready, leader change, resident memory) are printed
//! for docs/BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use neocloud_cloudsim::{RunpodSim, SimConfig};
use neocloud_node::run::LEADER_LABEL;
use neocloud_testenv::{ControlPlane, Options, WorkerNode};
use serde_json::json;

mod support;

/// The binary the image holds: this build's unless set (`target/release/neocloud-node` for the
/// figures in docs/BENCHMARKS.md).
const BINARY_ENV: &str = "NEOCLOUD_E2E_NODE_BINARY";

const NS: &str = "aibrix-system";
const IMAGE: &str = "ghcr.io/aibrix/neocloud-node:e2e";

/// Where an install's replicas are: namespace, Pod selector, Lease.
struct Install {
    ns: &'static str,
    selector: &'static str,
    lease: &'static str,
    callback: &'static str,
}

/// The kustomize install (`config/default`).
const KUSTOMIZE: Install = Install {
    ns: NS,
    selector: "app.kubernetes.io/name=aibrix-neocloud-node",
    lease: "neocloud-node-neocloud-node",
    callback: "aibrix-neocloud-node-callback",
};

/// The Helm chart, installed beside it under other names.
const HELM: Install = Install {
    ns: "neocloud-helm",
    selector: "app.kubernetes.io/name=neocloud-helm",
    lease: "neocloud-node-neocloud-helm",
    callback: "neocloud-helm-callback",
};
const BUSYBOX: &str = "neocloud.invalid/busybox:1";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// `target` as a path relative to `from` (kustomize refuses absolute paths to bases).
fn relative(from: &Path, target: &Path) -> String {
    let up = from.components().count().saturating_sub(1);
    let down = target.strip_prefix("/").unwrap();
    format!("{}{}", "../".repeat(up), down.display())
}

struct Rig {
    cp: ControlPlane,
    client: Client,
    worker: WorkerNode,
    dir: tempfile::TempDir,
}

impl Rig {
    fn kubectl(&self, args: &[&str]) -> String {
        let out = self.cp.kubectl().args(args).output().unwrap();
        support::succeeded(&format!("kubectl {args:?}"), out)
    }

    /// Writes an overlay of `config/default` (with `components`) whose kustomization also holds
    /// `extra`, and applies it.
    fn apply_overlay(&self, name: &str, components: &[&str], extra: &str, files: &[(&str, &str)]) {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let base = relative(&dir, &repo().join("config/default"));
        let components: Vec<String> = components
            .iter()
            .map(|c| relative(&dir, &repo().join("config/components").join(c)))
            .collect();
        let text = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{base}]\ncomponents: [{}]\n\
             images:\n  - name: ghcr.io/aibrix/neocloud-node\n    newTag: e2e\n{extra}",
            components.join(", ")
        );
        std::fs::write(dir.join("kustomization.yaml"), text).unwrap();
        for (file, body) in files {
            std::fs::write(dir.join(file), body).unwrap();
        }
        self.kubectl(&["apply", "-k", dir.to_str().unwrap()]);
    }

    async fn wait<T>(&self, what: &str, secs: u64, mut check: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let pods = self
            .cp
            .kubectl()
            .args(["get", "pods", "-A", "-o", "wide"])
            .output()
            .unwrap();
        let logs = self
            .cp
            .kubectl()
            .args([
                "logs",
                "-n",
                NS,
                "-l",
                "app.kubernetes.io/name",
                "--tail=30",
                "--prefix",
            ])
            .output()
            .unwrap();
        panic!(
            "{what} did not happen in {secs} s\n{}\n{}\n{}",
            String::from_utf8_lossy(&pods.stdout),
            String::from_utf8_lossy(&logs.stdout),
            self.worker.logs(30)
        );
    }

    fn node_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn replicas(&self, install: &Install) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), install.ns)
            .list(&ListParams::default().labels(install.selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect()
    }

    async fn holder(&self, install: &Install) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), install.ns);
        leases
            .get_opt(install.lease)
            .await
            .ok()??
            .spec?
            .holder_identity
    }

    /// Waits for two ready replicas, one holding the Lease and alone labelled the leader;
    /// returns (leader, standby).
    async fn leader_and_standby(&self, install: &Install, secs: u64) -> (Pod, Pod) {
        self.wait("two ready replicas, one leading", secs, async || {
            let pods = self.replicas(install).await;
            if pods.len() != 2 || !pods.iter().all(ready) {
                return None;
            }
            let holder = self.holder(install).await?;
            let (leader, standby): (Vec<Pod>, Vec<Pod>) =
                pods.into_iter().partition(|p| name(p) == holder);
            let [leader] = <[Pod; 1]>::try_from(leader).ok()?;
            let [standby] = <[Pod; 1]>::try_from(standby).ok()?;
            (labelled(&leader) && !labelled(&standby)).then_some((leader, standby))
        })
        .await
    }

    /// Waits until Node `name` is Ready.
    async fn node_ready(&self, name: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.wait(&format!("Node {name} Ready"), 60, async || {
            nodes
                .get_opt(name)
                .await
                .ok()??
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        })
        .await;
    }

    /// Waits until the callback Service's only endpoint is `pod`.
    async fn callback_routes_to(&self, install: &Install, pod: &Pod) {
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), install.ns);
        let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
        self.wait(
            "the callback Service routing to the leader only",
            60,
            async || {
                let list = slices
                    .list(
                        &ListParams::default()
                            .labels(&format!("kubernetes.io/service-name={}", install.callback)),
                    )
                    .await
                    .ok()?;
                let endpoints: Vec<(String, Option<bool>)> = list
                    .items
                    .iter()
                    .flat_map(|s| s.endpoints.iter())
                    .flat_map(|e| {
                        let ready = e.conditions.as_ref().and_then(|c| c.ready);
                        e.addresses.iter().map(move |a| (a.clone(), ready))
                    })
                    .collect();
                (endpoints == vec![(ip.clone(), Some(true))]).then_some(())
            },
        )
        .await;
    }
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn labelled(p: &Pod) -> bool {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LEADER_LABEL))
        .is_some_and(|v| v == "true")
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum())
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// The resident set of each running `neocloud-node run` process on this machine, in MiB.
fn resident_mib() -> Vec<f64> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.starts_with("/usr/local/bin/neocloud-node run") {
            continue;
        }
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        if let Some(kb) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        {
            out.push(kb / 1024.0);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_manifests_run_on_a_real_node_lead_fail_over_and_burst() {
    let cp = ControlPlane::start(Options::default()).await.unwrap();
    let client = cp.client().await.unwrap();
    let mut worker = WorkerNode::start(&cp, "worker-1").await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    // The image, as `make image` builds it, from this build's binary.
    let binary: PathBuf = std::env::var_os(BINARY_ENV)
        .unwrap_or(env!("CARGO_BIN_EXE_neocloud-node").into())
        .into();
    support::import_node_image(&worker, &binary, IMAGE, dir.path());
    worker.import_busybox(BUSYBOX, &["/bin/sh", "-c"]).unwrap();

    let sim = RunpodSim::start(SimConfig::fast()).await.unwrap();
    let sim_address = worker.expose(sim.addr().port()).unwrap();
    let rig = Rig {
        cp,
        client,
        worker,
        dir,
    };

    // The real node has two GPUs from the start (its capacity patched, as a device plugin would
    // report it), so that by the bursting step the scheduler has long seen them: patched just
    // before the trainers, a loaded scheduler once placed all four before it saw the GPUs.
    let nodes: Api<Node> = Api::all(rig.client.clone());
    nodes
        .patch_status(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"nvidia.com/gpu": "2"}}})),
        )
        .await
        .unwrap();
    rig.wait("worker-1 allocating two GPUs", 30, async || {
        let status = nodes.get("worker-1").await.ok()?.status?;
        (status.allocatable?.get("nvidia.com/gpu")?.0 == "2").then_some(())
    })
    .await;

    // 1. The default install, with only the image set.
    let applied = Instant::now();
    rig.apply_overlay("default", &[], "", &[]);
    let (leader, standby) = rig.leader_and_standby(&KUSTOMIZE, 180).await;
    let to_ready = applied.elapsed();
    for pod in [&leader, &standby] {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("worker-1"));
        let security = spec.security_context.as_ref().unwrap();
        assert_eq!(security.run_as_user, Some(65532));
        assert_eq!(security.run_as_non_root, Some(true));
        let container = spec.containers[0].security_context.as_ref().unwrap();
        assert_eq!(container.read_only_root_filesystem, Some(true));
        assert_eq!(container.allow_privilege_escalation, Some(false));
    }
    rig.node_ready("neocloud-node").await;
    rig.kubectl(&[
        "apply",
        "-f",
        repo()
            .join("config/samples/fake-pod.yaml")
            .to_str()
            .unwrap(),
    ]);
    let pods: Api<Pod> = Api::namespaced(rig.client.clone(), "default");
    let fake = rig
        .wait("the fake-provider Pod Running", 60, async || {
            let pod = pods.get_opt("neocloud-node-fake-smoke").await.ok()??;
            (phase(&pod) == Some("Running")).then_some(pod)
        })
        .await;
    assert_eq!(
        fake.spec.unwrap().node_name.as_deref(),
        Some("neocloud-node")
    );
    // The probes keep passing on both (the standby too): nothing restarted after 25 s, two and a
    // half liveness periods past the first.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let replicas = rig.replicas(&KUSTOMIZE).await;
    assert_eq!(replicas.len(), 2);
    for pod in &replicas {
        assert_eq!(restarts(pod), 0, "{} restarted", name(pod));
    }
    let resident = resident_mib();
    assert_eq!(resident.len(), 2, "two node processes: {resident:?}");
    pods.delete("neocloud-node-fake-smoke", &DeleteParams::default())
        .await
        .unwrap();
    rig.wait("the fake Pod gone", 60, async || {
        pods.get_opt("neocloud-node-fake-smoke")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;

    // 2. RunPod (its simulator) with the runner callback behind its Service.
    let node_yaml = "node:\n  name: neocloud-node\nmetricsAddress: 0.0.0.0:8080\n\
        runner:\n  callbackUrl: https://aibrix-neocloud-node-callback.aibrix-system.svc:8443\n\
        \x20 listen: 0.0.0.0:8443\n  containerProviders: []\n";
    let extra = format!(
        "configMapGenerator:\n  - name: aibrix-neocloud-node-config\n    namespace: {NS}\n\
         \x20   behavior: replace\n    files: [node.yaml]\n\
         secretGenerator:\n  - name: aibrix-neocloud-node-runpod\n    namespace: {NS}\n\
         \x20   literals: [RUNPOD_API_KEY={key}]\n\
         generatorOptions:\n  disableNameSuffixHash: true\n\
         patches:\n  - target: {{kind: Deployment, name: aibrix-neocloud-node}}\n    patch: |-\n\
         \x20     - op: replace\n        path: /spec/template/spec/containers/0/env/0/value\n\
         \x20       value: runpod\n\
         \x20     - op: add\n        path: /spec/template/spec/containers/0/env/-\n\
         \x20       value: {{name: RUNPOD_API_BASE_URL, value: \"http://{sim_address}\"}}\n",
        key = sim.api_key(),
    );
    rig.apply_overlay(
        "runpod",
        &["runner-callback"],
        &extra,
        &[("node.yaml", node_yaml)],
    );
    let old: Vec<String> = [&leader, &standby].iter().map(|p| name(p)).collect();
    rig.wait("the rollout to the RunPod template", 240, async || {
        let pods = rig.replicas(&KUSTOMIZE).await;
        (pods.len() == 2 && pods.iter().all(|p| !old.contains(&name(p)))).then_some(())
    })
    .await;
    let (leader, standby) = rig.leader_and_standby(&KUSTOMIZE, 180).await;

    rig.callback_routes_to(&KUSTOMIZE, &leader).await;

    let runpod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "on-runpod", "annotations": {
            "cloud.aibrix.ai/providers": "runpod",
            "cloud.aibrix.ai/gpu-type": "A40",
            "cloud.aibrix.ai/max-price": "0.60"}},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"type": "virtual-kubelet"},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                            "command": ["sleep", "infinity"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &runpod).await.unwrap();
    rig.wait("the RunPod Pod Running", 90, async || {
        let pod = pods.get_opt("on-runpod").await.ok()??;
        (phase(&pod) == Some("Running")).then_some(())
    })
    .await;
    let rentals = || sim.ledger().entries.len();
    let live = || sim.ledger().live().len();
    assert_eq!(rentals(), 1, "one rental: {:?}", sim.ledger());

    // A Pod on the real node reaches the callback through its Service: only the leader listens.
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"name": "callback-probe"},
        "spec": {"nodeName": "worker-1", "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                // Plain HTTP to a TLS server: it answers with a TLS alert record (0x15 0x03).
                "args": ["for i in 1 2 3 4 5 6; do \
                    got=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 $AIBRIX_NEOCLOUD_NODE_CALLBACK_SERVICE_HOST 8443 | od -An -tx1 -N2); \
                    case \"$got\" in *'15 03'*) ;; *) echo \"no TLS answer at $AIBRIX_NEOCLOUD_NODE_CALLBACK_SERVICE_HOST:8443: $got\"; exit 1;; esac; done"]}]}
    }))
    .unwrap();
    let probes: Api<Pod> = Api::namespaced(rig.client.clone(), NS);
    probes.create(&PostParams::default(), &probe).await.unwrap();
    rig.wait("the callback probe to succeed", 60, async || {
        let pod = probes.get_opt("callback-probe").await.ok()??;
        match phase(&pod) {
            Some("Succeeded") => Some(()),
            Some("Failed") => {
                let log = probes.logs("callback-probe", &Default::default()).await;
                let leader = rig
                    .node_pods()
                    .logs(&name(&leader), &Default::default())
                    .await;
                panic!(
                    "the callback Service did not answer: {log:?}\nthe leader's log:\n{leader:?}"
                )
            }
            _ => None,
        }
    })
    .await;

    // The leader goes: another replica leads within the Lease's term, and nothing is rented again.
    let deleted = Instant::now();
    rig.node_pods()
        .delete(&name(&leader), &DeleteParams::default())
        .await
        .unwrap();
    // The standby usually wins; the Deployment's replacement replica, started at once, may
    // instead when it reads the handed-back Lease first. Either is a replica of the node.
    let new_leader = rig
        .wait("another replica leading and ready", 60, async || {
            let holder = rig.holder(&KUSTOMIZE).await?;
            if holder == name(&leader) {
                return None;
            }
            let pod = rig.node_pods().get_opt(&holder).await.ok()??;
            (ready(&pod) && labelled(&pod)).then_some(pod)
        })
        .await;
    let handover = deleted.elapsed();
    // The Lease's term is 15 s; a leader deleted cleanly hands it back at once.
    assert!(handover < Duration::from_secs(20), "{handover:?}");
    rig.callback_routes_to(&KUSTOMIZE, &new_leader).await;
    let (leading, standing_by) = rig.leader_and_standby(&KUSTOMIZE, 120).await;
    assert_eq!(name(&leading), name(&new_leader));
    assert_ne!(name(&standing_by), name(&leader));
    println!(
        "in-cluster: the leader's Pod deleted; {} leads, the {}",
        name(&new_leader),
        if name(&new_leader) == name(&standby) {
            "standby"
        } else {
            "replacement replica"
        }
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pod = pods.get("on-runpod").await.unwrap();
    assert_eq!(phase(&pod), Some("Running"));
    assert_eq!(rentals(), 1, "no second rental: {:?}", sim.ledger());

    println!(
        "in-cluster figures: kubectl apply to both replicas ready and one leading {:.1} s; leader change (Pod deleted to \
         another replica ready and leading) {:.1} s; resident memory of the two replicas {resident:?} MiB",
        to_ready.as_secs_f64(),
        handover.as_secs_f64()
    );
    pods.delete("on-runpod", &DeleteParams::default())
        .await
        .unwrap();
    rig.wait(
        "the RunPod Pod gone and its instance released",
        60,
        async || (pods.get_opt("on-runpod").await.ok()?.is_none() && live() == 0).then_some(()),
    )
    .await;

    // 4. Bursting: the real node has two GPUs; four GPU Pods that prefer real nodes fill it and
    // overflow onto the virtual node, as the scheduler decides.
    rig.wait("worker-1 still allocating two GPUs", 30, async || {
        let status = nodes.get("worker-1").await.ok()?.status?;
        (status.allocatable?.get("nvidia.com/gpu")?.0 == "2").then_some(())
    })
    .await;
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "trainer"}},
            "template": {
                "metadata": {"labels": {"app": "trainer"}, "annotations": {
                    "cloud.aibrix.ai/providers": "runpod",
                    "cloud.aibrix.ai/gpu-type": "A40",
                    "cloud.aibrix.ai/max-price": "0.60"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists",
                                     "effect": "NoSchedule"}],
                    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "preference": {"matchExpressions": [
                            {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}]}}]}},
                    "containers": [{"name": "main", "image": BUSYBOX,
                        "imagePullPolicy": "IfNotPresent", "args": ["exec sleep 3600"],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    });
    let path = rig.dir.path().join("trainer.json");
    std::fs::write(&path, deployment.to_string()).unwrap();
    rig.kubectl(&["apply", "-f", path.to_str().unwrap()]);
    let placed = rig
        .wait("four trainers Running, two on each node", 120, async || {
            let list = pods
                .list(&ListParams::default().labels("app=trainer"))
                .await
                .ok()?;
            if list.items.len() != 4 || !list.items.iter().all(|p| phase(p) == Some("Running")) {
                return None;
            }
            let on = |node: &str| {
                list.items
                    .iter()
                    .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
                    .count()
            };
            (on("worker-1") == 2 && on("neocloud-node") == 2).then_some(list.items)
        })
        .await;
    assert_eq!(
        live(),
        2,
        "two instances for the overflow: {:?}",
        sim.ledger()
    );
    assert_eq!(placed.len(), 4);
    rig.kubectl(&[
        "scale",
        "deployment/trainer",
        "--replicas=0",
        "-n",
        "default",
    ]);
    rig.wait(
        "the trainers gone and their instances released",
        90,
        async || {
            let list = pods
                .list(&ListParams::default().labels("app=trainer"))
                .await
                .ok()?;
            (list.items.is_empty() && live() == 0).then_some(())
        },
    )
    .await;
    assert_eq!(
        rentals(),
        3,
        "one rental per virtual-node Pod: {:?}",
        sim.ledger()
    );

    // 5. The Helm chart, installed beside the kustomize install under other names; `--wait`
    // returns once the Deployment is available, which needs the standby ready too.
    let home = rig.dir.path().join("helm");
    let kubeconfig = rig.cp.admin_kubeconfig();
    let run_helm = |args: &[&str]| support::helm_on(&kubeconfig, &home, args);
    let helm_started = Instant::now();
    run_helm(&[
        "install",
        "second",
        "deploy/helm/neocloud-node",
        "--namespace",
        HELM.ns,
        "--create-namespace",
        "--skip-crds",
        "--wait",
        "--timeout",
        "4m",
        "--set",
        "createNamespace=false",
        "--set",
        "fullname=neocloud-helm",
        "--set",
        "nodeName=neocloud-helm",
        "--set",
        "image.tag=e2e",
        "--set",
        "callbackService.enabled=true",
        "--set",
        "extraConfig.runner.callbackUrl=https://neocloud-helm-callback.neocloud-helm.svc:8443",
    ]);
    let helm_ready = helm_started.elapsed();
    let (helm_leader, _) = rig.leader_and_standby(&HELM, 60).await;
    rig.callback_routes_to(&HELM, &helm_leader).await;
    rig.node_ready("neocloud-helm").await;
    run_helm(&["uninstall", "second", "--namespace", HELM.ns, "--wait"]);
    println!(
        "in-cluster figures: helm install --wait {:.1} s",
        helm_ready.as_secs_f64()
    );

    let Rig { worker, .. } = rig;
    let left = worker.leftovers_after();
    assert_eq!(left.0, Vec::<String>::new(), "what the worker node left");
}
