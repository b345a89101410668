//! The remote side of a rental: the Pod the node creates on a remote cluster for a local Pod, the
//! Secret its environment travels in, and how the remote Pod's status reads as an instance's.
//!
//! Pure. Every environment value goes into the Secret and the remote Pod refers to it by key, so
//! no value (a local Secret's, or any other) is ever written into the remote Pod's spec.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, Pod, PodSpec, ResourceRequirements, Secret,
    SecretKeySelector, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use neocloud_core::{
    GpuModel, InstancePhase, InstanceState, PortProtocol, ProviderId, UNSCHEDULABLE,
};
use neocloud_providers::CreateRequest;

use crate::capacity::{GPU_RESOURCE, MEMORY_LABEL, PRODUCT_LABEL, pod_gpus};

/// The label every object the node creates on a remote cluster carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "neocloud-node");
/// The label naming the rental (the local Pod's external name).
pub const EXTERNAL_NAME_LABEL: &str = "cloud.aibrix.ai/external-name";
/// Annotation: the price per hour the rental was made at.
pub const PRICE_ANNOTATION: &str = "cloud.aibrix.ai/price-per-hour";
/// Annotation: the GPU product rented.
pub const PRODUCT_ANNOTATION: &str = "cloud.aibrix.ai/gpu-product";
/// Annotation: memory per GPU in GiB, if known.
pub const MEMORY_ANNOTATION: &str = "cloud.aibrix.ai/gpu-memory-gib";
/// The workload's container name on the remote Pod.
pub const CONTAINER: &str = "workload";

/// The Secret holding a rental's environment.
pub fn secret_name(external_name: &str) -> String {
    format!("{external_name}-env")
}

fn labels(external_name: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())]);
    if external_name.len() <= 63 {
        labels.insert(EXTERNAL_NAME_LABEL.to_owned(), external_name.to_owned());
    }
    labels
}

/// The key of the `i`-th variable in the Secret (variable names need not be valid keys).
fn env_key(i: usize) -> String {
    format!("env-{i}")
}

/// The Secret with the request's environment, in order, under keys `env-0`, `env-1`, ...
pub fn env_secret(req: &CreateRequest, namespace: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&req.external_name)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels(&req.external_name)),
            ..ObjectMeta::default()
        },
        string_data: Some(
            req.env
                .iter()
                .enumerate()
                .map(|(i, (_, value))| (env_key(i), value.clone()))
                .collect(),
        ),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}

/// Makes the remote Pod own its Secret, so the remote cluster's garbage collector removes the
/// Secret with the Pod even if the node never comes back.
pub fn owned_by(pod: &Pod) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: pod.metadata.name.clone()?,
        uid: pod.metadata.uid.clone()?,
        ..OwnerReference::default()
    })
}

/// The remote Pod for a rental of `product` GPUs: the local Pod's image, command, args, ports,
/// probes (whose outcome, its `Ready`, is mirrored back), GPUs and other resources (CPU, memory: its scheduler fits the Pod as the local one would), its environment by reference to [`env_secret`], pinned to nodes of that product,
/// never restarted (the local Pod's outcome is this Pod's), with no service account token.
pub fn remote_pod(
    req: &CreateRequest,
    namespace: &str,
    product: &str,
    memory_gib: Option<u32>,
) -> Pod {
    let secret = secret_name(&req.external_name);
    let env = req
        .env
        .iter()
        .enumerate()
        .map(|(i, (name, _))| EnvVar {
            name: name.clone(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.clone(),
                    key: env_key(i),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        })
        .collect::<Vec<_>>();
    let ports = req
        .workload
        .ports
        .iter()
        .map(|p| ContainerPort {
            container_port: i32::from(p.container_port),
            protocol: Some(
                match p.protocol {
                    PortProtocol::Tcp => "TCP",
                    PortProtocol::Udp => "UDP",
                }
                .to_owned(),
            ),
            name: p.name.clone(),
            ..ContainerPort::default()
        })
        .collect::<Vec<_>>();
    let gpus = Quantity(req.offer.gpu_count.max(1).to_string());
    let mut annotations = BTreeMap::from([
        (
            PRICE_ANNOTATION.to_owned(),
            req.offer.price_per_hour.to_string(),
        ),
        (PRODUCT_ANNOTATION.to_owned(), product.to_owned()),
    ]);
    if let Some(m) = memory_gib {
        annotations.insert(MEMORY_ANNOTATION.to_owned(), m.to_string());
    }
    let non_empty = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    let probes = req.workload.hints.remote_probes.as_ref();
    Pod {
        metadata: ObjectMeta {
            name: Some(req.external_name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels(&req.external_name)),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_owned()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            node_selector: Some(BTreeMap::from([(
                PRODUCT_LABEL.to_owned(),
                product.to_owned(),
            )])),
            tolerations: Some(vec![Toleration {
                key: Some(GPU_RESOURCE.to_owned()),
                operator: Some("Exists".to_owned()),
                effect: Some("NoSchedule".to_owned()),
                ..Toleration::default()
            }]),
            containers: vec![Container {
                name: CONTAINER.to_owned(),
                image: Some(req.workload.image.clone()),
                command: non_empty(&req.workload.command),
                args: non_empty(&req.workload.args),
                env: (!env.is_empty()).then_some(env),
                ports: (!ports.is_empty()).then_some(ports),
                // The remote kubelet runs the Pod's probes; its `Ready` is mirrored back.
                readiness_probe: probes.and_then(|p| p.readiness.clone()),
                liveness_probe: probes.and_then(|p| p.liveness.clone()),
                startup_probe: probes.and_then(|p| p.startup.clone()),
                resources: Some(ResourceRequirements {
                    limits: Some(with_gpus(&req.workload.resources.limits, &gpus)),
                    requests: Some(with_gpus(&req.workload.resources.requests, &gpus)),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The local container's requests or limits (GPUs left out) with the rental's GPUs.
fn with_gpus(other: &BTreeMap<String, String>, gpus: &Quantity) -> BTreeMap<String, Quantity> {
    let mut all: BTreeMap<String, Quantity> = other
        .iter()
        .map(|(k, v)| (k.clone(), Quantity(v.clone())))
        .collect();
    all.insert(GPU_RESOURCE.to_owned(), gpus.clone());
    all
}

/// The workload container's exit code, once it terminated.
pub fn exit_code(pod: &Pod) -> Option<i32> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let status = statuses.iter().find(|s| s.name == CONTAINER)?;
    let terminated = status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| {
            status
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
        })?;
    Some(terminated.exit_code)
}

/// Phase, provider status and message of a remote Pod.
fn classify(pod: &Pod) -> (InstancePhase, String, Option<String>) {
    if pod.metadata.deletion_timestamp.is_some() {
        return (InstancePhase::Terminating, "Terminating".to_owned(), None);
    }
    let status = pod.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == CONTAINER));
    let terminated = container
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    let waiting = container
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref());
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") => (
            InstancePhase::Stopped,
            "Succeeded".to_owned(),
            Some("the workload exited with code 0".to_owned()),
        ),
        Some("Failed") => {
            let message = match terminated {
                Some(t) => format!(
                    "the workload exited with code {}{}",
                    t.exit_code,
                    t.reason
                        .as_deref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                ),
                None => {
                    let s = status.expect("a phase comes with a status");
                    format!(
                        "the remote Pod failed: {} {}",
                        s.reason.as_deref().unwrap_or(""),
                        s.message.as_deref().unwrap_or("")
                    )
                    .trim_end()
                    .to_owned()
                }
            };
            (InstancePhase::Failed, "Failed".to_owned(), Some(message))
        }
        Some("Running") => (InstancePhase::Running, "Running".to_owned(), None),
        Some("Pending") | None => {
            let unschedulable = status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .find(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some(UNSCHEDULABLE)
                });
            if let Some(c) = unschedulable {
                return (
                    InstancePhase::Pending,
                    UNSCHEDULABLE.to_owned(),
                    c.message.clone(),
                );
            }
            let bound = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some();
            match waiting {
                Some(w) => (
                    InstancePhase::Starting,
                    w.reason.clone().unwrap_or_else(|| "Waiting".to_owned()),
                    w.message.clone(),
                ),
                None if bound => (
                    InstancePhase::Starting,
                    "ContainerCreating".to_owned(),
                    None,
                ),
                None => (InstancePhase::Pending, "Pending".to_owned(), None),
            }
        }
        Some(other) => (InstancePhase::Unknown, other.to_owned(), None),
    }
}

/// The instance a remote Pod on `cluster` is: id `<cluster>/<pod>`, the price and GPU recorded
/// when it was created, the phase its status gives, its Pod IP as the address.
pub fn instance_state(cluster: &str, pod: &Pod) -> InstanceState {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    let product = annotation(PRODUCT_ANNOTATION)
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.node_selector.as_ref())
                .and_then(|n| n.get(PRODUCT_LABEL))
                .map(String::as_str)
        })
        .unwrap_or("unknown");
    let memory = annotation(MEMORY_ANNOTATION)
        .and_then(|m| m.parse().ok())
        .or_else(|| annotation(MEMORY_LABEL).and_then(|m| m.parse::<u32>().ok()));
    let (phase, provider_status, message) = classify(pod);
    // Succeeded means 0 even before the container's status says so; a Pod that failed without
    // its container ending (evicted, rejected) has no code.
    let code = match (phase, provider_status.as_str()) {
        (InstancePhase::Stopped, "Succeeded") => Some(exit_code(pod).unwrap_or(0)),
        (InstancePhase::Failed, _) => exit_code(pod),
        _ => None,
    };
    InstanceState {
        provider: ProviderId::Kube,
        id: format!("{cluster}/{name}"),
        external_name: name,
        phase,
        provider_status,
        message,
        gpu: GpuModel::from_provider(product, memory),
        gpu_count: pod_gpus(pod),
        price_per_hour: annotation(PRICE_ANNOTATION)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0.0),
        region: cluster.to_owned(),
        endpoints: Vec::new(),
        public_ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
        created_at: pod.metadata.creation_timestamp.as_ref().and_then(|t| {
            let nanos = u32::try_from(t.0.subsec_nanosecond()).unwrap_or(0);
            DateTime::<Utc>::from_timestamp(t.0.as_second(), nanos)
        }),
        interruptible: false,
        exit_code: code,
        ready: pod.status.as_ref().map(|s| {
            s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        }),
    }
}

/// What a rental's Secret left without its Pod reads as: an instance named by the Pod it was for
/// (`<cluster>/<pod>`), stopped, costing nothing, so the sweeper deletes it (with the Secret)
/// when no binding names it. A crash between creating the Secret and the Pod leaves one.
pub fn orphan_secret_state(cluster: &str, pod_name: &str, secret: &Secret) -> InstanceState {
    InstanceState {
        provider: ProviderId::Kube,
        id: format!("{cluster}/{pod_name}"),
        external_name: pod_name.to_owned(),
        phase: InstancePhase::Stopped,
        provider_status: ORPHAN_SECRET.to_owned(),
        message: Some(format!(
            "Secret {} holds the environment of a remote Pod that does not exist",
            secret.metadata.name.as_deref().unwrap_or_default()
        )),
        gpu: GpuModel::from_provider("unknown", None),
        gpu_count: 0,
        price_per_hour: 0.0,
        region: cluster.to_owned(),
        endpoints: Vec::new(),
        public_ip: None,
        created_at: secret.metadata.creation_timestamp.as_ref().and_then(|t| {
            let nanos = u32::try_from(t.0.subsec_nanosecond()).unwrap_or(0);
            DateTime::<Utc>::from_timestamp(t.0.as_second(), nanos)
        }),
        interruptible: false,
        exit_code: None,
        ready: None,
    }
}

/// The provider status of a rental's Secret whose Pod does not exist.
pub const ORPHAN_SECRET: &str = "SecretWithoutPod";

/// The Pod a rental's Secret is for: `<pod>` of `<pod>-env`.
pub fn secret_pod(secret_name: &str) -> Option<&str> {
    secret_name.strip_suffix("-env").filter(|p| !p.is_empty())
}

/// The cluster and Pod name an instance id names.
pub fn parse_instance_id(id: &str) -> Option<(&str, &str)> {
    id.split_once('/')
        .filter(|(c, p)| !c.is_empty() && !p.is_empty() && !p.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use neocloud_core::Offer;
    use serde_json::json;

    fn request() -> CreateRequest {
        let mut workload = neocloud_fixtures::workload();
        workload.image = "ghcr.io/acme/train:1".into();
        workload.command = vec!["python".into()];
        workload.args = vec!["train.py".into(), "--epochs=3".into()];
        workload.resources.requests = [("cpu", "16"), ("memory", "128Gi")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into();
        workload.resources.limits = [("memory".to_owned(), "200Gi".to_owned())].into();
        CreateRequest {
            external_name: "nc-abc-0001".into(),
            offer: Offer {
                gpu: GpuModel::from_provider("NVIDIA-A100-SXM4-80GB", Some(80)),
                gpu_count: 2,
                price_per_hour: 4.25,
                region: "gpu-west".into(),
                ..neocloud_fixtures::offer(
                    ProviderId::Kube,
                    "gpu-west/NVIDIA-A100-SXM4-80GB",
                    "A100",
                    4.25,
                )
            },
            workload,
            env: vec![
                ("HF_TOKEN".into(), "hf_secret_value".into()),
                ("MODE".into(), "fast".into()),
            ],
            bid_per_hour: None,
            boot: None,
            registry_login: None,
        }
    }

    #[test]
    fn the_remote_pod_carries_the_workload_and_no_environment_value() {
        let req = request();
        let pod = remote_pod(&req, "burst", "NVIDIA-A100-SXM4-80GB", Some(80));
        let text = serde_json::to_string(&pod).unwrap();
        assert!(!text.contains("hf_secret_value"), "{text}");
        assert!(!text.contains("fast"), "{text}");
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("ghcr.io/acme/train:1"));
        assert_eq!(c.command.as_deref(), Some(&["python".to_owned()][..]));
        assert_eq!(c.args.as_ref().unwrap().len(), 2);
        let env = c.env.as_ref().unwrap();
        assert_eq!(env[0].name, "HF_TOKEN");
        let key = env[0]
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (key.name.as_str(), key.key.as_str()),
            ("nc-abc-0001-env", "env-0")
        );
        let resources = c.resources.as_ref().unwrap();
        let limits = resources.limits.as_ref().unwrap();
        let requests = resources.requests.as_ref().unwrap();
        assert_eq!(
            (limits[GPU_RESOURCE].0.as_str(), limits["memory"].0.as_str()),
            ("2", "200Gi"),
            "the rental's GPUs, the local Pod's memory limit"
        );
        assert_eq!(
            (requests["cpu"].0.as_str(), requests["memory"].0.as_str()),
            ("16", "128Gi")
        );
        assert_eq!(requests[GPU_RESOURCE].0, "2");
        let secret = env_secret(&req, "burst");
        assert_eq!(
            secret.string_data.as_ref().unwrap()["env-0"],
            "hf_secret_value"
        );
        assert_eq!(secret.metadata.name.as_deref(), Some("nc-abc-0001-env"));
    }

    fn with_status(status: serde_json::Value) -> Pod {
        let mut pod = remote_pod(&request(), "burst", "NVIDIA-A100-SXM4-80GB", Some(80));
        pod.metadata.uid = Some("u".into());
        pod.status = Some(serde_json::from_value(status).unwrap());
        pod
    }

    #[test]
    fn the_remote_pod_runs_the_probes_and_its_ready_condition_is_read_back() {
        let mut req = request();
        let probe: k8s_openapi::api::core::v1::Probe = serde_json::from_value(
            json!({"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 2}),
        )
        .unwrap();
        req.workload.hints.remote_probes = Some(neocloud_core::RemoteProbes {
            readiness: Some(probe.clone()),
            ..Default::default()
        });
        let pod = remote_pod(&req, "burst", "NVIDIA-A100-SXM4-80GB", Some(80));
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.readiness_probe.as_ref(), Some(&probe));
        assert!(c.liveness_probe.is_none() && c.startup_probe.is_none());
        let not_ready = with_status(json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "False"}]}));
        assert_eq!(instance_state("gpu-west", &not_ready).ready, Some(false));
        let ready = with_status(json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}]}));
        assert_eq!(instance_state("gpu-west", &ready).ready, Some(true));
    }

    #[test]
    fn remote_pod_statuses_read_as_instance_phases() {
        let s = instance_state(
            "gpu-west",
            &with_status(json!({"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}
            ]})),
        );
        assert_eq!(
            (s.phase, s.provider_status.as_str()),
            (InstancePhase::Pending, "Unschedulable")
        );
        assert_eq!(s.message.as_deref(), Some("0/3 nodes are available"));
        assert_eq!(s.id, "gpu-west/nc-abc-0001");
        assert_eq!(s.price_per_hour, 4.25);
        assert_eq!(s.gpu_count, 2);
        assert_eq!(parse_instance_id(&s.id), Some(("gpu-west", "nc-abc-0001")));

        let s = instance_state(
            "gpu-west",
            &with_status(json!({"phase": "Pending", "containerStatuses": [
                {"name": "workload", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                 "state": {"waiting": {"reason": "ErrImagePull", "message": "manifest unknown"}}}
            ]})),
        );
        assert_eq!(
            (s.phase, s.provider_status.as_str()),
            (InstancePhase::Starting, "ErrImagePull")
        );
        assert_eq!(s.message.as_deref(), Some("manifest unknown"));

        let s = instance_state(
            "gpu-west",
            &with_status(json!({"phase": "Running", "podIP": "10.1.2.3"})),
        );
        assert_eq!(
            (s.phase, s.public_ip.as_deref()),
            (InstancePhase::Running, Some("10.1.2.3"))
        );

        let failed = with_status(json!({"phase": "Failed", "containerStatuses": [
            {"name": "workload", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
             "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}
        ]}));
        let s = instance_state("gpu-west", &failed);
        assert_eq!(s.phase, InstancePhase::Failed);
        assert_eq!(
            s.message.as_deref(),
            Some("the workload exited with code 3 (Error)")
        );
        assert_eq!((exit_code(&failed), s.exit_code), (Some(3), Some(3)));

        let s = instance_state("gpu-west", &with_status(json!({"phase": "Succeeded"})));
        assert_eq!(
            (s.phase, s.provider_status.as_str()),
            (InstancePhase::Stopped, "Succeeded")
        );
        assert_eq!(s.exit_code, Some(0));

        let s = instance_state(
            "gpu-west",
            &with_status(
                json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}),
            ),
        );
        assert_eq!(
            s.message.as_deref(),
            Some("the remote Pod failed: Evicted low on memory")
        );
        assert_eq!(s.exit_code, None);
    }

    #[test]
    fn instance_ids_have_one_cluster_and_one_pod() {
        assert_eq!(parse_instance_id("a/b/c"), None);
        assert_eq!(parse_instance_id("/b"), None);
        assert_eq!(parse_instance_id("b"), None);
    }
}
