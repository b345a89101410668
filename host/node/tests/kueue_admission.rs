//! Kueue admits only what the node can rent: `neocloud-node run` as a process serves the
//! ProvisioningRequest class `rent.cloud.aibrix.ai`, with Kueue v0.17 (webhooks included) on the
//! control plane, the guide's manifests (`examples/kueue/queue.yaml`: a ClusterQueue whose first
//! flavor is the rig's real worker node with two GPUs, and whose second, with the
//! ProvisioningRequest check, is the virtual node), and RunPod's simulator with one A40 offer in
//! one region:
//! - a 1-Pod Job runs on the worker node, with no request and no rental;
//! - a 4-Pod Job, which does not fit there, is admitted once the node has rented four machines
//!   (their runners up and waiting), and its Pods land on the virtual node and take those four
//!   machines: four rentals in the ledger, no more;
//! - deleting it leaves no hold (metric) and no instance (ledger);
//! - the same Job left out of Kueue rents as its Pods come (the benchmark's other half);
//! - under a budget that pays for three, a 4-Pod Job is not admitted, the Workload's check says
//!   over budget, and nothing is rented; once the budget is raised, Kueue's next try is
//!   provisioned and the Job runs, within the budget;
//! - a hold keeps its GPUs advertised for its Pods but its budget from other requests, and is
//!   released when its Pods do not come in
//!   time (`BookingExpired`) or when its request is deleted (requests made directly, as any
//!   ProvisioningRequest client makes them, for Pods the runner cannot run: budget only);
//! - a Job deleted as soon as its machines are rented leaves none; machines rented ahead for
//!   Pods that never come are released by `BookingExpired` and by deleting the request, the
//!   ledger showing no instance left.
//!
//! RunPod's simulator runs each container's start command, the node's runner (process
//! executor), so the Jobs' Pods, which name their command, are run through it.
//!
//! Kueue's webhooks intercept every Job of the control plane, so this binary has this one test.
//! Needs root (Kueue runs in a mount namespace of its own; see docs/KUEUE.md).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplate};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client};
use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};
use neocloud_testenv::kueue::{
    PROVISIONING_REQUEST_CONTROLLER, QUEUE_NAME_LABEL, provisioning_request_resource, resource,
};
use neocloud_testenv::{Kueue, TestContext, WorkerNode};
use serde_json::{Value, json};
use tokio::process::Child;

mod support;
use support::{free_port, http_get, metric, node_process, runner_yaml};
mod runner_bin;

const CLASS: &str = "rent.cloud.aibrix.ai";
const CONSUME: &str = "autoscaling.x-k8s.io/consume-provisioning-request";
/// The local GPU node: the rig's real worker node (kubelet, containerd).
const WORKER: &str = "worker-1";
/// The image the Jobs run, imported into the worker's containerd (it can pull nothing).
const BUSYBOX: &str = "neocloud.invalid/busybox:1";
/// RunPod's price of one A40, per GPU-hour, in the simulator's market.
const A40: f64 = 0.40;

struct Rig {
    ctx: TestContext,
    kueue: Kueue,
    /// The local GPU node (taken at the end, to check what it leaves).
    worker: Option<WorkerNode>,
    sims: CloudSim,
    node: String,
    dir: tempfile::TempDir,
    metrics_port: u16,
    /// The node's runner callback (kept across restarts, so the runners find the new leader).
    callback_port: u16,
    process: Option<Child>,
}

/// RunPod with one offer: A40s in CA-MTL-1 at $0.40/h, eight of them; the other two clouds
/// offer nothing the test uses (they are not enabled on the node).
async fn sims() -> CloudSim {
    let offers = serde_json::from_value(json!([{"gpu": "NVIDIA A40", "gpu_count": 8,
        "gpu_memory_gb": 48, "region": "CA-MTL-1", "price_per_hour": A40, "capacity": 8,
        "cloud": "SECURE"}]))
    .unwrap();
    let runpod = SimConfig {
        offers: Some(offers),
        ..SimConfig::fast().with_user_data_runner(runner_bin::runner_binary())
    };
    CloudSim::start(CloudSimConfig {
        runpod,
        lambda: SimConfig::fast(),
        vast: SimConfig::fast(),
    })
    .await
    .unwrap()
}

impl Rig {
    async fn start() -> Rig {
        let ctx = TestContext::new("kueue-adm").await;
        let kueue = Kueue::start(ctx.control_plane)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let node = format!("neocloud-{}", ctx.namespace);
        let worker = WorkerNode::start(ctx.control_plane, WORKER)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        worker.import_busybox(BUSYBOX, &["/bin/sh", "-c"]).unwrap();
        // Two GPUs, as a device plugin would report them, and the GPU operator's label, which
        // the local flavor selects.
        let nodes: Api<Node> = Api::all(ctx.client.clone());
        let gpus = json!({"status": {"capacity": {"nvidia.com/gpu": "2"}}});
        (nodes.patch_status(WORKER, &PatchParams::default(), &Patch::Merge(gpus)))
            .await
            .unwrap();
        let label = json!({"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}});
        (nodes.patch(WORKER, &PatchParams::default(), &Patch::Merge(label)))
            .await
            .unwrap();
        Rig {
            ctx,
            kueue,
            worker: Some(worker),
            sims: sims().await,
            node,
            dir: tempfile::tempdir().unwrap(),
            metrics_port: free_port(),
            callback_port: free_port(),
            process: None,
        }
    }

    /// (Re)starts the node with a cluster budget of `budget` USD per hour.
    async fn run_node(&mut self, budget: f64) {
        if let Some(mut old) = self.process.take() {
            old.kill().await.unwrap();
        }
        let yaml = format!(
            "clusterId: kueuetest\n\
             node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
             providers: [runpod]\n\
             budgetUsdPerHour: {budget}\n\
             installCrds: true\n\
             metricsAddress: 127.0.0.1:{port}\n\
             healthIntervalSeconds: 1\n\
             leaderElection: {{namespace: {ns}, leaseDurationSeconds: 2, renewGraceSeconds: 1}}\n\
             reconciler: {{pollIntervalMs: 300, retryIntervalMs: 1000}}\n\
             sweeper: {{intervalSeconds: 3600, graceSeconds: 3600}}\n\
             provisioning: {{enabled: true, bookingSeconds: 600}}\n{runner}",
            runner = runner_yaml(self.callback_port, &self.ctx.namespace, 10, 60),
            node = self.node,
            ns = self.ctx.namespace,
            kubelet = free_port(),
            port = self.metrics_port,
        );
        let config = self.dir.path().join("node.yaml");
        std::fs::write(&config, yaml).unwrap();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let child = node_process(&config, &self.ctx, &self.sims, log);
        self.process = Some(child);
        // Ready once it leads and its caches are synced.
        self.wait("the node ready", 120, async || {
            http_get(self.metrics_port, "/readyz")
                .starts_with("HTTP/1.1 200")
                .then_some(())
        })
        .await;
        // The scheduler places Pods on it only once it advertises GPUs.
        self.wait("the node advertising GPUs", 60, async || {
            (self.gpus().await? != "0").then_some(())
        })
        .await;
    }

    /// The GPUs the node advertises (`status.allocatable`).
    async fn gpus(&self) -> Option<String> {
        let node = Api::<Node>::all(self.client()).get(&self.node).await.ok()?;
        Some(node.status?.allocatable?.get("nvidia.com/gpu")?.0.clone())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("node.log")
    }

    fn client(&self) -> Client {
        self.ctx.client.clone()
    }

    /// Waits up to `seconds` for `check` to return something; panics with the node's and
    /// Kueue's logs otherwise.
    async fn wait<T>(
        &self,
        what: &str,
        seconds: u64,
        mut check: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        for _ in 0..seconds * 10 {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what} did not happen within {seconds}s");
    }

    fn api(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::all_with(self.client(), &resource(kind, plural))
    }

    fn namespaced(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(), &self.ctx.namespace, &resource(kind, plural))
    }

    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client(), &self.ctx.namespace)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), &self.ctx.namespace)
    }

    fn requests(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client(),
            &self.ctx.namespace,
            &provisioning_request_resource(),
        )
    }

    async fn create(&self, api: &Api<DynamicObject>, object: Value) {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        let name = object.metadata.name.clone().unwrap();
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }

    /// The Workload Kueue made for Job `job`.
    async fn workload_of(&self, job: &str) -> String {
        self.wait(&format!("a Workload for job {job}"), 60, async || {
            let list = self
                .namespaced("Workload", "workloads")
                .list(&ListParams::default())
                .await
                .ok()?;
            list.items.into_iter().find_map(|w| {
                let owners = w.metadata.owner_references.as_deref().unwrap_or_default();
                owners
                    .iter()
                    .any(|o| o.kind == "Job" && o.name == job)
                    .then(|| w.metadata.name.clone().unwrap())
            })
        })
        .await
    }

    /// The held budget the node's metrics report.
    fn held(&self) -> f64 {
        let body = http_get(self.metrics_port, "/metrics");
        metric(&body, "neocloud_provisioning_held_usd_per_hour")
            .unwrap_or_else(|| panic!("no held-budget gauge in:\n{body}"))
    }

    /// The ResourceFlavor of the virtual node, the check, and a ClusterQueue `burst` (16 GPUs
    /// of quota: only the check limits what is admitted) with its LocalQueue.
    /// Applies `examples/kueue/queue.yaml`, the guide's manifests, with this rig's node and
    /// namespace, and a refused request tried again after `retry_seconds` (then twice that, up
    /// to 10 s) rather than the example's minute.
    async fn queue(&self, retry_seconds: u32) {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/kueue/queue.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let text = text.replace("neocloud-node", &self.node).replace(
            "namespace: team-a",
            &format!("namespace: {}", self.ctx.namespace),
        );
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut object: Value = serde::Deserialize::deserialize(doc).unwrap();
            let kind = object["kind"].as_str().unwrap().to_owned();
            let api = match kind.as_str() {
                "ResourceFlavor" => self.api(&kind, "resourceflavors"),
                "ProvisioningRequestConfig" => {
                    assert_eq!(object["spec"]["provisioningClassName"], CLASS);
                    object["spec"]["retryStrategy"] = json!({"backoffLimitCount": 8,
                        "backoffBaseSeconds": retry_seconds, "backoffMaxSeconds": 10});
                    self.api(&kind, "provisioningrequestconfigs")
                }
                "AdmissionCheck" => {
                    let controller = &object["spec"]["controllerName"];
                    assert_eq!(controller, PROVISIONING_REQUEST_CONTROLLER);
                    self.api(&kind, "admissionchecks")
                }
                "ClusterQueue" => {
                    // The local flavor's quota is the worker's two GPUs.
                    let flavors = &mut object["spec"]["resourceGroups"][0]["flavors"];
                    let local = (flavors.as_array_mut().unwrap().iter_mut())
                        .find(|f| f["name"] == "local-gpus")
                        .expect("a local-gpus flavor");
                    for r in local["resources"].as_array_mut().unwrap() {
                        if r["name"] == "nvidia.com/gpu" {
                            r["nominalQuota"] = json!("2");
                        }
                    }
                    self.api(&kind, "clusterqueues")
                }
                "LocalQueue" => self.namespaced(&kind, "localqueues"),
                other => panic!("{path}: unexpected kind {other}"),
            };
            self.create(&api, object).await;
        }
        let checks = self.api("AdmissionCheck", "admissionchecks");
        self.wait("admission check rent Active", 60, async || {
            let c = checks.get("rent").await.ok()?;
            is_true(&c, "Active").then_some(())
        })
        .await;
        let queues = self.api("ClusterQueue", "clusterqueues");
        self.wait("cluster queue burst Active", 60, async || {
            let q = queues.get("burst").await.ok()?;
            is_true(&q, "Active").then_some(())
        })
        .await;
    }

    /// A Job of `pods` Pods of one A40 each, queued in `burst`.
    async fn job(&self, name: &str, pods: u32) {
        self.create_job(name, pods, true).await;
    }

    /// The same Job left out of Kueue (no queue label): its Pods go to the virtual node as the
    /// flavor would send them (its hostname and its taint), and each rents as it comes.
    async fn direct_job(&self, name: &str, pods: u32) {
        self.create_job(name, pods, false).await;
    }

    async fn create_job(&self, name: &str, pods: u32, queued: bool) {
        let labels = match queued {
            true => json!({QUEUE_NAME_LABEL: "burst"}),
            false => json!({}),
        };
        let mut spec = json!({
            "restartPolicy": "Never",
            "containers": [{"name": "train", "image": BUSYBOX, "command": ["/bin/sh", "-c"],
                "args": ["exec sleep 3600"], "imagePullPolicy": "IfNotPresent",
                "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}],
        });
        if !queued {
            spec["nodeSelector"] = json!({"kubernetes.io/hostname": self.node});
            spec["tolerations"] = json!([{"key": "virtual-kubelet.io/provider",
                "operator": "Exists", "effect": "NoSchedule"}]);
        }
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "parallelism": pods, "completions": pods,
                "template": {
                    "metadata": {"annotations": {"cloud.aibrix.ai/gpu-type": "A40"}},
                    "spec": spec,
                },
            },
        }))
        .unwrap();
        self.jobs()
            .create(&PostParams::default(), &job)
            .await
            .unwrap_or_else(|e| panic!("create job {name}: {e}"));
    }

    /// Waits for `count` Pods of Job `job` to be Running on the virtual node, and returns them.
    async fn running(&self, job: &str, count: usize) -> Vec<Pod> {
        self.running_on(job, count, &self.node).await
    }

    /// Waits for `count` Pods of Job `job` to be Running on node `node`, and returns them.
    async fn running_on(&self, job: &str, count: usize, node: &str) -> Vec<Pod> {
        let what = format!("{count} Pods of {job} Running on {node}");
        self.wait(&what, 120, async || {
            let selector = format!("job-name={job}");
            let params = ListParams::default().labels(&selector);
            let list = self.pods().list(&params).await.ok()?;
            let running: Vec<Pod> = (list.items.into_iter())
                .filter(|p| {
                    let on_node =
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
                    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                    on_node && phase == Some("Running")
                })
                .collect();
            (running.len() == count).then_some(running)
        })
        .await
    }

    /// Deletes Job `job` and waits for its Pods and every instance to be gone.
    async fn delete_job(&self, job: &str) {
        self.jobs()
            .delete(job, &DeleteParams::foreground())
            .await
            .unwrap();
        self.wait(&format!("the Pods of {job} gone"), 120, async || {
            let params = ListParams::default().labels(&format!("job-name={job}"));
            let list = self.pods().list(&params).await.ok()?;
            list.items.is_empty().then_some(())
        })
        .await;
        self.wait("every instance terminated", 60, async || {
            self.sims.runpod.ledger().live().is_empty().then_some(())
        })
        .await;
    }

    /// The newest ProvisioningRequest Kueue made for Workload `wl` (`<wl>-rent-<attempt>`).
    async fn latest_request(&self, wl: &str) -> Option<DynamicObject> {
        let prefix = format!("{wl}-rent-");
        let list = self.requests().list(&ListParams::default()).await.ok()?;
        (list.items.into_iter())
            .filter_map(|r| {
                let attempt = r.metadata.name.as_deref()?.strip_prefix(&prefix)?;
                Some((attempt.parse::<u32>().ok()?, r))
            })
            .max_by_key(|(attempt, _)| *attempt)
            .map(|(_, r)| r)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!("\n----- node (last 80 lines) -----");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
            eprintln!(
                "\n----- kueue (last 60 lines) -----\n{}",
                self.kueue.log_tail(60)
            );
        }
    }
}

fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn is_true(object: &DynamicObject, type_: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == "True")
}

/// The state and message of admission check `rent` on a Workload.
fn check(workload: &DynamicObject) -> (String, String) {
    let states = workload.data["status"]["admissionChecks"].as_array();
    let rent = states.and_then(|s| s.iter().find(|c| c["name"] == "rent"));
    let field = |f: &str| {
        rent.and_then(|c| c[f].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    (field("state"), field("message"))
}

#[tokio::test(flavor = "multi_thread")]
async fn kueue_admits_a_job_only_when_the_node_holds_the_budget_of_all_its_pods() {
    let mut rig = Rig::start().await;
    // Exactly four A40s' worth ($1.60/h): the held budget stays advertised for the Job's own
    // Pods, and once they run their GPUs stay counted (the scheduler subtracts them).
    rig.run_node(1.6).await;
    rig.queue(2).await;

    a_small_job_runs_on_the_local_gpus_and_asks_the_node_for_nothing(&rig).await;
    // One of the two local GPUs is taken: the 4-Pod Job goes to the virtual node's flavor.
    let queued = a_four_pod_job_is_admitted_and_each_pod_is_rented_once(&rig).await;
    deleting_the_job_leaves_no_hold_and_no_instance(&rig).await;
    rig.delete_job("small").await;
    let direct = the_same_job_left_out_of_kueue_rents_as_its_pods_come(&rig).await;
    // The figure docs/BENCHMARKS.md records; not asserted (timing belongs in benchmarks).
    eprintln!(
        "bench: a 4-Pod Job from creation to 4 Pods Running: through Kueue {:.1} s, \
         without Kueue {:.1} s",
        queued.as_secs_f64(),
        direct.as_secs_f64()
    );
    // Three A40s' worth.
    rig.run_node(1.2).await;
    let refused =
        under_a_budget_for_three_a_four_pod_job_is_not_admitted_and_nothing_is_rented(&rig).await;
    once_the_budget_is_raised_the_refused_job_is_admitted_at_kueue_s_next_try(&mut rig, &refused)
        .await;
    a_job_deleted_once_its_machines_are_rented_leaves_no_instance(&rig).await;
    rig.run_node(1.2).await;
    a_hold_keeps_its_gpus_for_its_pods_and_is_released_by_expiry_or_deletion(&rig).await;
    a_new_leader_holds_what_the_old_one_held_less_what_its_pods_took(&mut rig).await;
    machines_rented_ahead_for_pods_that_never_come_are_released(&rig).await;

    let worker = rig.worker.take().unwrap();
    let left = worker.leftovers_after();
    assert_eq!(left.0, Vec::<String>::new(), "what the worker node left");
}

/// A 1-Pod Job fits the local flavor (two GPUs on the worker node): Kueue admits it there with
/// no check, and it runs on the worker with no request and no rental.
async fn a_small_job_runs_on_the_local_gpus_and_asks_the_node_for_nothing(rig: &Rig) {
    let before = rig.sims.runpod.ledger().entries.len();
    rig.job("small", 1).await;
    let wl = rig.workload_of("small").await;
    let workloads = rig.namespaced("Workload", "workloads");
    let admitted = rig
        .wait("the 1-Pod Workload admitted", 60, async || {
            let w = workloads.get(&wl).await.ok()?;
            is_true(&w, "Admitted").then_some(w)
        })
        .await;
    let flavors = &admitted.data["status"]["admission"]["podSetAssignments"][0]["flavors"];
    assert_eq!(flavors["nvidia.com/gpu"], "local-gpus", "{flavors}");
    rig.running_on("small", 1, WORKER).await;
    assert!(
        rig.latest_request(&wl).await.is_none(),
        "no ProvisioningRequest for local work"
    );
    assert_eq!(rig.sims.runpod.ledger().entries.len(), before);
}

/// Returns the time from the Job's creation to its four Pods Running.
async fn a_four_pod_job_is_admitted_and_each_pod_is_rented_once(rig: &Rig) -> Duration {
    let created = Instant::now();
    rig.job("train", 4).await;
    let wl = rig.workload_of("train").await;
    let workloads = rig.namespaced("Workload", "workloads");
    let admitted = rig
        .wait("the 4-Pod Workload admitted", 120, async || {
            let w = workloads.get(&wl).await.ok()?;
            is_true(&w, "Admitted").then_some(w)
        })
        .await;
    let (state, message) = check(&admitted);
    eprintln!("admission check rent: {state}: {message}");
    assert_eq!(state, "Ready");
    assert!(
        message.contains(
            "4 machines rented and held for the pods on runpod CA-MTL-1: 4x A40 at $0.4000/h"
        ),
        "{message}"
    );
    // Admitted only once the four machines are rented: they are in the ledger now.
    let held: Vec<String> = (rig.sims.runpod.ledger().live().iter())
        .map(|e| e.instance_id.clone())
        .collect();
    assert_eq!(held.len(), 4, "rented before the Pods: {held:?}");
    let request = rig.requests().get(&format!("{wl}-rent-1")).await.unwrap();
    let details = &request.data["status"]["provisioningClassDetails"];
    assert_eq!(details["Provider"], "runpod", "{details}");
    assert_eq!(details["NodeName"], rig.node.as_str(), "{details}");

    let pods = rig.running("train", 4).await;
    let took = created.elapsed();
    for p in &pods {
        let consumed = p.metadata.annotations.as_ref().and_then(|a| a.get(CONSUME));
        assert_eq!(
            consumed.map(String::as_str),
            Some(format!("{wl}-rent-1").as_str())
        );
    }
    let ledger = rig.sims.runpod.ledger();
    eprintln!(
        "runpod ledger after admission: {} rentals",
        ledger.entries.len()
    );
    assert_eq!(ledger.entries.len(), 4, "{ledger:?}");
    assert_eq!(ledger.live().len(), 4, "{ledger:?}");
    for e in &ledger.entries {
        assert!((e.price_per_hour - A40).abs() < 1e-9, "{e:?}");
    }
    // Each Pod landed on one of the machines rented ahead.
    let bindings: Api<DynamicObject> = Api::namespaced_with(
        rig.client(),
        &rig.ctx.namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cloud.aibrix.ai", "v1alpha1", "CloudPodBinding"),
            "cloudpodbindings",
        ),
    );
    let mut machines = Vec::new();
    for p in &pods {
        let name = p.metadata.name.as_deref().unwrap();
        let b = bindings.get(name).await.unwrap();
        let id = b.data["status"]["instanceId"].as_str().unwrap().to_owned();
        let attempts = b.data["status"]["attempts"].as_array().unwrap().clone();
        let last = attempts.last().unwrap()["message"]
            .as_str()
            .unwrap_or_default();
        assert!(last.starts_with("took runpod instance"), "{name}: {last}");
        machines.push(id);
    }
    machines.sort();
    let mut held = held;
    held.sort();
    assert_eq!(
        machines, held,
        "the four Pods took the four machines rented ahead"
    );
    // Every Pod took its hold: nothing is held any more.
    rig.wait("the held budget taken by the Pods", 30, async || {
        (rig.held() == 0.0).then_some(())
    })
    .await;
    took
}

async fn deleting_the_job_leaves_no_hold_and_no_instance(rig: &Rig) {
    rig.delete_job("train").await;
    let ledger = rig.sims.runpod.ledger();
    eprintln!(
        "runpod ledger after deletion: {} rentals, {} live",
        ledger.entries.len(),
        ledger.live().len()
    );
    assert_eq!(
        ledger.entries.len(),
        4,
        "no rental after deletion: {ledger:?}"
    );
    assert_eq!(rig.held(), 0.0);
    let body = http_get(rig.metrics_port, "/metrics");
    assert_eq!(
        metric(&body, "neocloud_budget_in_flight_usd_per_hour"),
        Some(0.0)
    );
}

/// The same Job without Kueue: no request, no hold, each Pod rents as it comes. Returns the time
/// from its creation to its four Pods Running.
async fn the_same_job_left_out_of_kueue_rents_as_its_pods_come(rig: &Rig) -> Duration {
    let before = rig.sims.runpod.ledger().entries.len();
    let created = Instant::now();
    rig.direct_job("direct", 4).await;
    let pods = rig.running("direct", 4).await;
    let took = created.elapsed();
    for p in &pods {
        let annotations = p.metadata.annotations.clone().unwrap_or_default();
        assert!(!annotations.contains_key(CONSUME), "{annotations:?}");
    }
    let ledger = rig.sims.runpod.ledger();
    assert_eq!(ledger.entries.len(), before + 4, "{ledger:?}");
    assert_eq!(ledger.live().len(), 4, "{ledger:?}");
    assert_eq!(rig.held(), 0.0, "nothing is held without a request");
    rig.delete_job("direct").await;
    took
}

/// Returns the refused Job's Workload.
async fn under_a_budget_for_three_a_four_pod_job_is_not_admitted_and_nothing_is_rented(
    rig: &Rig,
) -> String {
    let before = rig.sims.runpod.ledger().entries.len();
    rig.job("big", 4).await;
    let wl = rig.workload_of("big").await;
    let workloads = rig.namespaced("Workload", "workloads");
    let (state, message) = rig
        .wait("the Workload's check saying over budget", 120, async || {
            let w = workloads.get(&wl).await.ok()?;
            let (state, message) = check(&w);
            message.contains("over budget").then_some((state, message))
        })
        .await;
    eprintln!("admission check rent: {state}: {message}");
    assert!(
        message.contains("cluster budget of $1.2000/h would be exceeded")
            && message.contains("$1.6000/h requested")
            && message.contains("for 4 pods on runpod CA-MTL-1"),
        "{message}"
    );
    // Kueue tries again every few seconds here (and is refused each time): the newest try.
    let request = rig
        .wait("a refused request", 30, async || {
            let r = rig.latest_request(&wl).await?;
            is_true(&r, "Failed").then_some(r)
        })
        .await;
    assert_eq!(
        condition(&request, "Failed").unwrap()["reason"],
        "OverBudget"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let w = workloads.get(&wl).await.unwrap();
    assert!(!is_true(&w, "Admitted"), "{:?}", w.data["status"]);
    let job = rig.jobs().get("big").await.unwrap();
    assert_eq!(
        job.spec.unwrap().suspend,
        Some(true),
        "not admitted, still suspended"
    );
    let ledger = rig.sims.runpod.ledger();
    eprintln!(
        "runpod ledger after the over-budget Job: {} rentals, {} live",
        ledger.entries.len(),
        ledger.live().len()
    );
    assert_eq!(ledger.entries.len(), before, "nothing rented: {ledger:?}");
    assert!(ledger.live().is_empty(), "{ledger:?}");
    assert_eq!(rig.held(), 0.0, "nothing held for a refused request");
    wl
}

/// The operator raises the budget (the node restarts with the new configuration): Kueue's next
/// try of the refused Workload is provisioned, the Job runs on four rentals, and nothing is
/// rented past the new budget.
async fn once_the_budget_is_raised_the_refused_job_is_admitted_at_kueue_s_next_try(
    rig: &mut Rig,
    wl: &str,
) {
    let before = rig.sims.runpod.ledger().entries.len();
    rig.run_node(1.6).await;
    let workloads = rig.namespaced("Workload", "workloads");
    let admitted = rig
        .wait("the refused Workload admitted", 120, async || {
            let w = workloads.get(wl).await.ok()?;
            is_true(&w, "Admitted").then_some(w)
        })
        .await;
    let (state, message) = check(&admitted);
    eprintln!("after the raise, admission check rent: {state}: {message}");
    assert_eq!(state, "Ready");
    let request = rig.latest_request(wl).await.expect("a provisioned request");
    let name = request.metadata.name.clone().unwrap();
    assert!(
        is_true(&request, "Provisioned"),
        "{name}: {:?}",
        request.data["status"]
    );
    assert!(
        !name.ends_with("-rent-1"),
        "a later try than the refused one: {name}"
    );
    rig.running("big", 4).await;
    let ledger = rig.sims.runpod.ledger();
    eprintln!(
        "runpod ledger after the raise: {} rentals, {} live",
        ledger.entries.len(),
        ledger.live().len()
    );
    assert_eq!(ledger.entries.len(), before + 4, "{ledger:?}");
    let spend: f64 = ledger.live().iter().map(|e| e.price_per_hour).sum();
    assert!(spend <= 1.6 + 1e-9, "rented past the budget: ${spend}/h");
    rig.delete_job("big").await;
}

/// A request of the node's class for `pods` Pods of one A40, made directly with its PodTemplate,
/// whose container names no command: the runner cannot run it, so only budget is held.
async fn direct_request(rig: &Rig, name: &str, pods: u32, valid_seconds: u32) {
    direct_request_of(rig, name, pods, valid_seconds, None).await;
}

/// [`direct_request`] for Pods running `command`: their machines are rented ahead.
async fn direct_request_of(
    rig: &Rig,
    name: &str,
    pods: u32,
    valid_seconds: u32,
    command: Option<&[&str]>,
) {
    let mut container = json!({"name": "train", "image": "registry.invalid/train:1",
        "resources": {"limits": {"nvidia.com/gpu": "1"}}});
    if let Some(command) = command {
        container["command"] = json!(command);
    }
    let template: PodTemplate = serde_json::from_value(json!({
        "metadata": {"name": format!("ppt-{name}")},
        "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
    }))
    .unwrap();
    Api::<PodTemplate>::namespaced(rig.client(), &rig.ctx.namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let request = json!({"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": rig.ctx.namespace},
        "spec": {"provisioningClassName": CLASS,
            "podSets": [{"podTemplateRef": {"name": format!("ppt-{name}")}, "count": pods}],
            "parameters": {"ValidUntilSeconds": valid_seconds.to_string()}}});
    rig.create(&rig.requests(), request).await;
}

/// Waits for request `name` to be `Provisioned`.
async fn provisioned(rig: &Rig, name: &str) {
    rig.wait(&format!("{name} Provisioned"), 30, async || {
        let r = rig.requests().get(name).await.ok()?;
        is_true(&r, "Provisioned").then_some(())
    })
    .await;
}

/// Deletes request `name` and waits for the node to hold nothing.
async fn deleted_and_released(rig: &Rig, name: &str) {
    rig.requests()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    rig.wait("the deleted request's hold released", 30, async || {
        (rig.held() == 0.0).then_some(())
    })
    .await;
}

async fn a_hold_keeps_its_gpus_for_its_pods_and_is_released_by_expiry_or_deletion(rig: &Rig) {
    let before = rig.sims.runpod.ledger().entries.len();
    // $1.20/h buys three A40s; two held stay advertised (for the request's Pods), but the
    // budget they hold is not another request's.
    rig.wait("three GPUs advertised", 30, async || {
        (rig.gpus().await? == "3").then_some(())
    })
    .await;
    direct_request(rig, "lapse", 2, 6).await;
    provisioned(rig, "lapse").await;
    assert!((rig.held() - 2.0 * A40).abs() < 1e-9, "{}", rig.held());
    direct_request(rig, "greedy", 2, 600).await;
    let refused = rig
        .wait("greedy Failed", 30, async || {
            let r = rig.requests().get("greedy").await.ok()?;
            is_true(&r, "Failed").then_some(r)
        })
        .await;
    let failed = condition(&refused, "Failed").unwrap();
    assert_eq!(failed["reason"], "OverBudget", "{failed}");
    rig.requests()
        .delete("greedy", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        rig.gpus().await.as_deref(),
        Some("3"),
        "held GPUs stay advertised"
    );
    let expired = rig
        .wait("lapse BookingExpired", 30, async || {
            let r = rig.requests().get("lapse").await.ok()?;
            is_true(&r, "BookingExpired").then_some(r)
        })
        .await;
    eprintln!(
        "BookingExpired: {}",
        condition(&expired, "BookingExpired").unwrap()["message"]
    );
    assert_eq!(rig.held(), 0.0, "the lapsed booking is released");
    rig.wait("three GPUs advertised again", 30, async || {
        (rig.gpus().await? == "3").then_some(())
    })
    .await;

    direct_request(rig, "dropped", 2, 600).await;
    provisioned(rig, "dropped").await;
    assert!((rig.held() - 2.0 * A40).abs() < 1e-9, "{}", rig.held());
    deleted_and_released(rig, "dropped").await;
    let ledger = rig.sims.runpod.ledger();
    assert_eq!(
        ledger.entries.len(),
        before,
        "holding rents nothing: {ledger:?}"
    );
}

/// The node restarts (a new leader) while a request is held and one of its two Pods has taken
/// its share: the new leader holds the other Pod's budget again, from the request's status, and
/// releases it when the request is deleted.
async fn a_new_leader_holds_what_the_old_one_held_less_what_its_pods_took(rig: &mut Rig) {
    let before = rig.sims.runpod.ledger().entries.len();
    direct_request(rig, "kept", 2, 600).await;
    provisioned(rig, "kept").await;
    assert!((rig.held() - 2.0 * A40).abs() < 1e-9, "{}", rig.held());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "kept-0", "annotations": {CONSUME: "kept",
            "cloud.aibrix.ai/gpu-type": "A40"}},
        "spec": {"restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": rig.node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists",
                "effect": "NoSchedule"}],
            "containers": [{"name": "train", "image": BUSYBOX, "args": ["exec sleep 3600"],
                "imagePullPolicy": "IfNotPresent",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    rig.pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    rig.wait("kept-0 Running", 120, async || {
        let p = rig.pods().get("kept-0").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    assert!((rig.held() - A40).abs() < 1e-9, "{}", rig.held());

    rig.run_node(1.2).await;
    let held = rig
        .wait(
            "the new leader holding the untaken Pod's budget",
            30,
            async || {
                let held = rig.held();
                (held > 0.0).then_some(held)
            },
        )
        .await;
    assert!((held - A40).abs() < 1e-9, "held again: {held}");
    let r = rig.requests().get("kept").await.unwrap();
    assert!(
        is_true(&r, "Provisioned") && !is_true(&r, "BookingExpired"),
        "{:?}",
        r.data["status"]
    );

    deleted_and_released(rig, "kept").await;
    rig.pods()
        .delete("kept-0", &DeleteParams::default())
        .await
        .unwrap();
    rig.wait("kept-0's instance terminated", 60, async || {
        rig.sims.runpod.ledger().live().is_empty().then_some(())
    })
    .await;
    let ledger = rig.sims.runpod.ledger();
    assert_eq!(
        ledger.entries.len(),
        before + 1,
        "one rental, kept-0's: {ledger:?}"
    );
}

/// Machines rented ahead for two Pods that never come: released when the booking ends
/// (`BookingExpired`) and when the request is deleted, with no instance left in the ledger.
async fn machines_rented_ahead_for_pods_that_never_come_are_released(rig: &Rig) {
    let before = rig.sims.runpod.ledger().entries.len();
    let sleep: &[&str] = &["sleep", "3600"];
    direct_request_of(rig, "ahead-lapse", 2, 6, Some(sleep)).await;
    provisioned(rig, "ahead-lapse").await;
    let r = rig.requests().get("ahead-lapse").await.unwrap();
    let reason = &condition(&r, "Provisioned").unwrap()["reason"];
    assert_eq!(reason, "Rented", "{:?}", r.data["status"]);
    assert_eq!(rig.sims.runpod.ledger().live().len(), 2);
    rig.wait("ahead-lapse BookingExpired", 30, async || {
        let r = rig.requests().get("ahead-lapse").await.ok()?;
        is_true(&r, "BookingExpired").then_some(())
    })
    .await;
    rig.wait(
        "the expired booking's machines terminated",
        30,
        async || rig.sims.runpod.ledger().live().is_empty().then_some(()),
    )
    .await;

    direct_request_of(rig, "ahead-dropped", 2, 600, Some(sleep)).await;
    provisioned(rig, "ahead-dropped").await;
    assert_eq!(rig.sims.runpod.ledger().live().len(), 2);
    deleted_and_released(rig, "ahead-dropped").await;
    rig.wait(
        "the deleted request's machines terminated",
        30,
        async || rig.sims.runpod.ledger().live().is_empty().then_some(()),
    )
    .await;
    let ledger = rig.sims.runpod.ledger();
    assert_eq!(
        ledger.entries.len(),
        before + 4,
        "two rentals each: {ledger:?}"
    );
    assert_eq!(rig.held(), 0.0);
}

/// A Job deleted as soon as its request is provisioned (its machines rented; its Pods may not
/// have come yet): every machine is released, whether a Pod had taken it or not, and nothing
/// stays held.
async fn a_job_deleted_once_its_machines_are_rented_leaves_no_instance(rig: &Rig) {
    let before = rig.sims.runpod.ledger().entries.len();
    // Three Pods: more than the worker's two GPUs, so the virtual node's flavor.
    rig.job("early", 3).await;
    let wl = rig.workload_of("early").await;
    rig.wait("early's machines rented", 60, async || {
        let r = rig.latest_request(&wl).await?;
        is_true(&r, "Provisioned").then_some(())
    })
    .await;
    assert_eq!(rig.sims.runpod.ledger().entries.len(), before + 3);
    rig.delete_job("early").await;
    rig.wait("nothing held", 30, async || {
        (rig.held() == 0.0).then_some(())
    })
    .await;
    let ledger = rig.sims.runpod.ledger();
    assert_eq!(
        ledger.entries.len(),
        before + 3,
        "no more rentals: {ledger:?}"
    );
    assert!(ledger.live().is_empty(), "{ledger:?}");
}
