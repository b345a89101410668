//! Proves Kueue v0.17 runs against the rig's control plane with its webhooks and admits by quota
//! (a Job is suspended on create, admitted and unsuspended within quota, held with a reason
//! over it), and that its ProvisioningRequest admission check holds a Workload until the
//! request it created is `Provisioned=True`, the part the node's provisioner will play. No Pod
//! runs: there is no kubelet here; this is about admission.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PodTemplate};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use neocloud_testenv::kueue::{
    PROVISIONING_REQUEST_CONTROLLER, QUEUE_NAME_LABEL, provisioning_request_resource, resource,
};
use neocloud_testenv::{ControlPlane, Kueue, Options};
use serde_json::{Value, json};

const NAMESPACE: &str = "team-a";
const CLASS: &str = "rent.cloud.aibrix.ai";
const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";
const CLASS_ANNOTATION: &str = "autoscaling.x-k8s.io/provisioning-class-name";

struct Rig {
    client: Client,
    kueue: Kueue,
}

impl Rig {
    /// Waits up to 60 s for `check` to return something; panics with Kueue's log otherwise.
    async fn wait<T>(&self, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
        for _ in 0..600 {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what} did not happen; kueue:\n{}", self.kueue.log_tail(60));
    }

    fn cluster_api(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &resource(kind, plural))
    }

    fn workloads(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            NAMESPACE,
            &resource("Workload", "workloads"),
        )
    }

    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    async fn create(&self, api: &Api<DynamicObject>, object: Value) -> DynamicObject {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        let name = object.metadata.name.clone().unwrap();
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"))
    }

    /// The Workload Kueue made for Job `job`.
    async fn workload_of(&self, job: &str) -> DynamicObject {
        self.wait(&format!("a Workload for job {job}"), async || {
            let list = self.workloads().list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|w| {
                let owners = w.metadata.owner_references.as_deref().unwrap_or_default();
                owners.iter().any(|o| o.kind == "Job" && o.name == job)
            })
        })
        .await
    }

    /// The Workload `name` once `check` holds for it.
    async fn workload_when(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&DynamicObject) -> bool,
    ) -> DynamicObject {
        self.wait(&format!("workload {name}: {what}"), async || {
            let w = self.workloads().get(name).await.ok()?;
            check(&w).then_some(w)
        })
        .await
    }

    async fn suspended(&self, job: &str) -> bool {
        let job = self.jobs().get(job).await.unwrap();
        job.spec.unwrap().suspend == Some(true)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.kueue.log_path();
            eprintln!("\n----- kueue (last 80 lines of {}) -----", log.display());
            eprintln!("{}", self.kueue.log_tail(80));
        }
    }
}

/// The condition `type_` of an object's status.
fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn is_true(object: &DynamicObject, type_: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == "True")
}

/// A Job in `queue` whose one Pod asks for `gpus` GPUs, created as a user creates it (not
/// suspended).
fn job(name: &str, queue: &str, gpus: u32, annotations: &Value) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {QUEUE_NAME_LABEL: queue}, "annotations": annotations},
        "spec": {
            "parallelism": 1, "completions": 1,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "train", "image": "registry.invalid/train:1",
                    "resources": {"requests": {"cpu": "1"},
                        "limits": {"nvidia.com/gpu": gpus.to_string()}}}],
            }},
        },
    }))
    .unwrap()
}

/// A ClusterQueue `name` with `gpus` GPUs (and 8 CPUs) of flavor `default-flavor`, running the
/// admission checks named `checks` before admission.
fn cluster_queue(name: &str, gpus: u32, checks: &[&str]) -> Value {
    let mut queue = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/gpu"], "flavors": [{
                "name": "default-flavor",
                "resources": [{"name": "cpu", "nominalQuota": "8"},
                    {"name": "nvidia.com/gpu", "nominalQuota": gpus.to_string()}],
            }]}],
        },
    });
    if !checks.is_empty() {
        let rules: Vec<Value> = checks.iter().map(|c| json!({"name": c})).collect();
        queue["spec"]["admissionChecksStrategy"] = json!({"admissionChecks": rules});
    }
    queue
}

async fn start() -> (ControlPlane, Rig) {
    let cp = ControlPlane::start(Options::default()).await.unwrap();
    let kueue = Kueue::start(&cp).await.unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    (cp, Rig { client, kueue })
}

async fn local_queue(rig: &Rig, name: &str, cluster_queue: &str) {
    let api = Api::namespaced_with(
        rig.client.clone(),
        NAMESPACE,
        &resource("LocalQueue", "localqueues"),
    );
    let lq = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"clusterQueue": cluster_queue}});
    rig.create(&api, lq).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kueue_admits_jobs_by_quota_and_waits_for_a_provisioned_request() {
    let (_cp, rig) = start().await;
    let flavor = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "default-flavor"}});
    rig.create(
        &rig.cluster_api("ResourceFlavor", "resourceflavors"),
        flavor,
    )
    .await;
    let queues = rig.cluster_api("ClusterQueue", "clusterqueues");
    rig.create(&queues, cluster_queue("gpus", 4, &[])).await;
    local_queue(&rig, "gpus", "gpus").await;

    converts_between_versions_through_the_webhook(&rig).await;
    quota_admits_one_job_and_holds_the_next(&rig).await;
    provisioning_request_holds_admission_until_provisioned(&rig).await;
}

/// The API server reaches Kueue's `/convert` endpoint for a v1beta1 read of a v1beta2 object.
async fn converts_between_versions_through_the_webhook(rig: &Rig) {
    let mut v1beta1 = resource("ClusterQueue", "clusterqueues");
    v1beta1.version = "v1beta1".into();
    v1beta1.api_version = "kueue.x-k8s.io/v1beta1".into();
    let queue = Api::<DynamicObject>::all_with(rig.client.clone(), &v1beta1)
        .get("gpus")
        .await
        .unwrap_or_else(|e| panic!("read ClusterQueue gpus as v1beta1: {e}"));
    assert_eq!(
        queue.types.map(|t| t.api_version).as_deref(),
        Some("kueue.x-k8s.io/v1beta1")
    );
    assert_eq!(
        queue.data["spec"]["resourceGroups"][0]["flavors"][0]["name"],
        "default-flavor"
    );
}

async fn quota_admits_one_job_and_holds_the_next(rig: &Rig) {
    let created = rig
        .jobs()
        .create(&PostParams::default(), &job("first", "gpus", 3, &json!({})))
        .await
        .unwrap();
    assert_eq!(
        created.spec.unwrap().suspend,
        Some(true),
        "Kueue's webhook suspends a queued Job on create"
    );
    let first = rig.workload_of("first").await;
    let name = first.metadata.name.clone().unwrap();
    let first = rig
        .workload_when(&name, "admitted", |w| is_true(w, "Admitted"))
        .await;
    assert!(is_true(&first, "QuotaReserved"), "{:?}", first.data);
    assert_eq!(
        first.data["status"]["admission"]["clusterQueue"], "gpus",
        "{:?}",
        first.data
    );
    rig.wait("job first unsuspended", async || {
        (!rig.suspended("first").await).then_some(())
    })
    .await;

    rig.jobs()
        .create(
            &PostParams::default(),
            &job("second", "gpus", 2, &json!({})),
        )
        .await
        .unwrap();
    let second = rig.workload_of("second").await;
    let name = second.metadata.name.clone().unwrap();
    let second = rig
        .workload_when(&name, "pending for quota", |w| {
            condition(w, "QuotaReserved").is_some_and(|c| c["status"] == "False")
        })
        .await;
    let message = condition(&second, "QuotaReserved").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    eprintln!("over quota, Kueue says: {message}");
    assert!(
        message.contains("insufficient") && message.contains("nvidia.com/gpu"),
        "{message}"
    );
    assert!(!is_true(&second, "Admitted"));
    assert!(rig.suspended("second").await, "over quota stays suspended");
}

/// The AdmissionCheck `rent` of Kueue's ProvisioningRequest controller with its config (class
/// [`CLASS`], for GPU PodSets), Active, on a ClusterQueue `rented` with LocalQueue `rented`.
async fn rent_check_on_a_queue(rig: &Rig) {
    let configs = rig.cluster_api("ProvisioningRequestConfig", "provisioningrequestconfigs");
    let config = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ProvisioningRequestConfig",
    "metadata": {"name": "rent"},
    "spec": {
        "provisioningClassName": CLASS,
        "managedResources": ["nvidia.com/gpu"],
        "parameters": {"MaxPricePerHour": "3.00"},
        "podSetUpdates": {"nodeSelector": [
            {"key": "neocloud.io/reservation", "valueFromProvisioningClassDetail": "RequestKey"},
        ]},
    }});
    rig.create(&configs, config).await;
    let checks = rig.cluster_api("AdmissionCheck", "admissionchecks");
    let check = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
        "metadata": {"name": "rent"},
        "spec": {"controllerName": PROVISIONING_REQUEST_CONTROLLER,
            "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
                "name": "rent"}}});
    rig.create(&checks, check).await;
    rig.wait("admission check rent Active", async || {
        let c = checks.get("rent").await.ok()?;
        is_true(&c, "Active").then_some(())
    })
    .await;
    let queues = rig.cluster_api("ClusterQueue", "clusterqueues");
    rig.create(&queues, cluster_queue("rented", 8, &["rent"]))
        .await;
    local_queue(rig, "rented", "rented").await;
}

async fn provisioning_request_holds_admission_until_provisioned(rig: &Rig) {
    rent_check_on_a_queue(rig).await;
    let annotations = json!({"provreq.kueue.x-k8s.io/ValidUntilSeconds": "600"});
    rig.jobs()
        .create(
            &PostParams::default(),
            &job("burst", "rented", 2, &annotations),
        )
        .await
        .unwrap();
    let workload = rig.workload_of("burst").await;
    let wl = workload.metadata.name.clone().unwrap();
    let requests: Api<DynamicObject> = Api::namespaced_with(
        rig.client.clone(),
        NAMESPACE,
        &provisioning_request_resource(),
    );
    let request_name = format!("{wl}-rent-1");
    let request = rig
        .wait(&format!("ProvisioningRequest {request_name}"), async || {
            requests.get(&request_name).await.ok()
        })
        .await;
    eprintln!(
        "ProvisioningRequest: {}",
        serde_json::to_string_pretty(&request.data["spec"]).unwrap()
    );
    let spec = &request.data["spec"];
    assert_eq!(spec["provisioningClassName"], CLASS);
    assert_eq!(
        spec["parameters"]["MaxPricePerHour"], "3.00",
        "from the config"
    );
    assert_eq!(
        spec["parameters"]["ValidUntilSeconds"], "600",
        "from the Job"
    );
    let template_name = format!("ppt-{request_name}-main");
    assert_eq!(spec["podSets"][0]["podTemplateRef"]["name"], template_name);
    assert_eq!(spec["podSets"][0]["count"], 1);
    let owner = &request.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Workload", wl.as_str())
    );

    let templates: Api<PodTemplate> = Api::namespaced(rig.client.clone(), NAMESPACE);
    let template = rig
        .wait(&format!("PodTemplate {template_name}"), async || {
            templates.get(&template_name).await.ok()
        })
        .await;
    let labels = template.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["kueue.x-k8s.io/managed"], "true");
    let pod = template.template.unwrap().spec.unwrap();
    let limits = pod.containers[0].resources.as_ref().unwrap().limits.clone();
    assert_eq!(limits.unwrap()["nvidia.com/gpu"].0, "2");

    let pending = rig
        .workload_when(&wl, "check rent Pending with quota reserved", |w| {
            is_true(w, "QuotaReserved") && check_state(w, "rent") == Some("Pending")
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pending = rig.workloads().get(&wl).await.unwrap_or(pending);
    assert!(
        !is_true(&pending, "Admitted"),
        "{:?}",
        pending.data["status"]
    );
    assert!(
        rig.suspended("burst").await,
        "not admitted, still suspended"
    );

    provision(&requests, &request_name).await;
    let admitted = rig
        .workload_when(&wl, "admitted after Provisioned=True", |w| {
            is_true(w, "Admitted")
        })
        .await;
    let state = &admitted.data["status"]["admissionChecks"][0];
    eprintln!("admission check state: {state}");
    assert_eq!(state["state"], "Ready");
    let update = &state["podSetUpdates"][0];
    assert_eq!(
        update["annotations"][CONSUME_ANNOTATION],
        request_name.as_str()
    );
    assert_eq!(update["annotations"][CLASS_ANNOTATION], CLASS);
    assert_eq!(update["nodeSelector"]["neocloud.io/reservation"], "nc-7f3a");
    rig.wait("job burst unsuspended with the podSetUpdates", async || {
        let job = rig.jobs().get("burst").await.ok()?;
        let spec = job.spec?;
        let template = spec.template;
        let annotations = template.metadata?.annotations?;
        let selector = template.spec?.node_selector?;
        (spec.suspend != Some(true)
            && annotations.get(CONSUME_ANNOTATION) == Some(&request_name)
            && selector.get("neocloud.io/reservation").map(String::as_str) == Some("nc-7f3a"))
        .then_some(())
    })
    .await;
}

/// The state of admission check `name` on a Workload.
fn check_state<'a>(workload: &'a DynamicObject, name: &str) -> Option<&'a str> {
    workload.data["status"]["admissionChecks"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)?["state"]
        .as_str()
}

/// Acts as the provisioner: marks the request Accepted and Provisioned, with a class detail
/// the ProvisioningRequestConfig turns into a node selector.
async fn provision(requests: &Api<DynamicObject>, name: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted",
                "message": "renting", "lastTransitionTime": now},
            {"type": "Provisioned", "status": "True", "reason": "Provisioned",
                "message": "machines rented and connected", "lastTransitionTime": now},
        ],
        "provisioningClassDetails": {"RequestKey": "nc-7f3a"},
    }});
    requests
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("set Provisioned on {name}: {e}"));
}
