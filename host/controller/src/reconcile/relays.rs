//! A cluster address for each burst Pod that declares TCP `containerPort`s: its relay Pod (see
//! `neocloud_kubelet::relay`), made on a real node of the cluster while the burst Pod runs,
//! owned by it, running the node's own image unprivileged, with a Secret holding its token and
//! how to reach the node. The relay Pod's IP is the burst Pod's `podIP`, and the burst Pod is
//! `Ready` only while its relay is.
//!
//! - A relay lost or ended (its node drained, its Pod deleted or failed) is replaced; the API
//!   server accepts a changed `status.podIP` (it validates only the address), so the burst Pod
//!   takes the new relay's IP and is not Ready in between (it keeps the last address until the
//!   new one is known, as a Service's endpoint that is not ready).
//! - The relay carries only labels of its own ([`RELAY_LABEL`], managed-by): no Service or
//!   ReplicaSet of the user selects it. It does not schedule onto virtual nodes.
//! - A new leader finds each relay's token in its Secret and registers it again, writing its own
//!   address and certificate into the Secret, which running relays read for each connection.
//! - UDP and SCTP ports are refused with the field named: only TCP is carried.
//!
//! Not the relay process or the node's route (`neocloud_kubelet::relay`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector;
use kube::{Api, ResourceExt};
use neocloud_kubelet::PodRef;
use neocloud_kubelet::relay::client::{CERT_FILE, NODE_FILE, TOKEN_FILE};
use neocloud_kubelet::relay::{MAX_PORTS, RelayGrant, RelayTable};
use serde_json::json;

use super::pods::ignore_gone;
use super::{Error, Reconciler};

/// The label every relay Pod and Secret carries: the uid of the burst Pod it serves.
pub const RELAY_LABEL: &str = "cloud.aibrix.ai/relay-for";

/// Where the relay's Secret is mounted in its Pod.
const SECRET_DIR: &str = "/etc/neocloud-relay";

/// The user the relay runs as (no root, no capabilities).
const RELAY_USER: i64 = 65532;

/// How the node gives burst Pods their relays.
#[derive(Debug)]
pub struct Relays {
    /// The relay Pods' image (the node's own).
    pub image: String,
    /// `host:port` of the kubelet API as relays reach it.
    pub node_address: String,
    /// The kubelet API's certificate (PEM), which relays pin.
    pub certificate_pem: String,
    /// The relays the kubelet API admits.
    pub table: Arc<RelayTable>,
}

/// A relay as the burst Pod's status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RelayView {
    /// The relay Pod's IP, once it has one.
    pub ip: Option<String>,
    /// It runs and is ready.
    pub ready: bool,
}

/// The name of the relay Pod and Secret of the burst Pod `uid`.
pub fn relay_name(uid: &str) -> String {
    format!("neocloud-relay-{uid}")
}

/// The burst Pod's TCP ports (every container's `containerPort`s, each with its name), or why
/// a port cannot be carried, naming the field.
pub fn tcp_ports(pod: &Pod) -> Result<Vec<(u16, Option<String>)>, String> {
    let mut ports: Vec<(u16, Option<String>)> = Vec::new();
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
    for (c, container) in containers.unwrap_or_default().iter().enumerate() {
        for (p, port) in container.ports.iter().flatten().enumerate() {
            let field = format!("spec.containers[{c}].ports[{p}]");
            let protocol = port.protocol.as_deref().unwrap_or("TCP");
            if protocol != "TCP" {
                return Err(format!(
                    "pod is not supported: {field}.protocol: {protocol:?} is not carried to a \
                     burst Pod; only TCP ports reach it from the cluster network"
                ));
            }
            let number = u16::try_from(port.container_port)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    format!(
                        "pod is not supported: {field}.containerPort: {} is not a port",
                        port.container_port
                    )
                })?;
            if !ports.iter().any(|(n, _)| *n == number) {
                ports.push((number, port.name.clone()));
            }
        }
    }
    if ports.len() > MAX_PORTS {
        return Err(format!(
            "pod is not supported: spec.containers[*].ports: {} ports; a burst Pod's relay \
             carries at most {MAX_PORTS}",
            ports.len()
        ));
    }
    Ok(ports)
}

/// The relay Pod of `pod`, carrying `ports`.
pub fn relay_pod(pod: &Pod, relays: &Relays, ports: &[(u16, Option<String>)]) -> Pod {
    let uid = pod.uid().unwrap_or_default();
    let name = relay_name(&uid);
    let list = ports
        .iter()
        .map(|(n, _)| n.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let container_ports: Vec<_> = ports
        .iter()
        .map(|(n, port_name)| json!({"containerPort": n, "protocol": "TCP", "name": port_name}))
        .collect();
    let value = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": pod.namespace(),
            "labels": {
                RELAY_LABEL: uid,
                "app.kubernetes.io/managed-by": "neocloud-node",
                "app.kubernetes.io/component": "relay",
            },
            "annotations": {"cloud.aibrix.ai/relay-for-pod": pod.name_any()},
            "ownerReferences": [owner(pod)],
        },
        "spec": {
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 5,
            "restartPolicy": "Always",
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]},
                ]}],
            }}},
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": RELAY_USER,
                "runAsGroup": RELAY_USER,
                "fsGroup": RELAY_USER,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "relay",
                "image": relays.image,
                "imagePullPolicy": "IfNotPresent",
                "args": ["relay"],
                "env": [
                    {"name": "NEOCLOUD_RELAY_POD_UID", "value": uid},
                    {"name": "NEOCLOUD_RELAY_PORTS", "value": list},
                    {"name": "NEOCLOUD_RELAY_SECRET_DIR", "value": SECRET_DIR},
                ],
                "ports": container_ports,
                "resources": {
                    "requests": {"cpu": "10m", "memory": "16Mi"},
                    "limits": {"memory": "256Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "relay", "mountPath": SECRET_DIR, "readOnly": true}],
            }],
            "volumes": [{"name": "relay", "secret": {"secretName": name, "defaultMode": 0o440}}],
        },
    });
    serde_json::from_value(value).expect("a relay Pod is a Pod")
}

/// The relay's Secret: its token, and the node's address and certificate.
fn relay_secret(pod: &Pod, relays: &Relays, token: &str) -> Secret {
    let uid = pod.uid().unwrap_or_default();
    let value = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": relay_name(&uid),
            "namespace": pod.namespace(),
            "labels": {RELAY_LABEL: uid, "app.kubernetes.io/managed-by": "neocloud-node"},
            "ownerReferences": [owner(pod)],
        },
        "type": "Opaque",
        "stringData": secret_data(relays, token),
    });
    serde_json::from_value(value).expect("a relay Secret is a Secret")
}

fn secret_data(relays: &Relays, token: &str) -> BTreeMap<String, String> {
    [
        (TOKEN_FILE, token),
        (NODE_FILE, relays.node_address.as_str()),
        (CERT_FILE, relays.certificate_pem.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// An owner reference to the burst Pod (not its controller: the Pod's own controller is).
fn owner(pod: &Pod) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid()})
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let ByteString(bytes) = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.clone()).ok()
}

impl Reconciler {
    /// Makes sure the running burst Pod `pod` has its relay (Secret, registration, Pod) and
    /// says where it is; `None` when the node makes no relays or the Pod declares no port.
    pub(super) async fn ensure_relay(&self, pod: &Pod) -> Result<Option<RelayView>, Error> {
        let Some(relays) = &self.cfg.relays else {
            return Ok(None);
        };
        let ports = tcp_ports(pod).map_err(Error::Invalid)?;
        if ports.is_empty() {
            return Ok(None);
        }
        let uid = pod.uid().unwrap_or_default();
        let ns = pod.namespace().unwrap_or_default();
        let name = relay_name(&uid);
        let grant = RelayGrant {
            pod: PodRef {
                namespace: ns.clone(),
                name: pod.name_any(),
            },
            ports: ports.iter().map(|(n, _)| *n).collect(),
        };
        if !relays.table.has(&uid, &grant) {
            let token = self.relay_token(pod, relays).await?;
            relays.table.set(&uid, &token, grant);
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let relay = match self.caches().and_then(|c| c.relays.clone()) {
            Some(store) => store
                .get(&reflector::ObjectRef::new(&name).within(&ns))
                .map(|p| (*p).clone()),
            None => api.get_opt(&name).await?,
        };
        let Some(relay) = relay else {
            match api
                .create(&PostParams::default(), &relay_pod(pod, relays, &ports))
                .await
            {
                Ok(_) => {
                    tracing::info!(pod = %format!("{ns}/{}", pod.name_any()), relay = name, "made the burst Pod's relay")
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            return Ok(Some(RelayView {
                ip: None,
                ready: false,
            }));
        };
        let status = relay.status.clone().unwrap_or_default();
        let ended = matches!(status.phase.as_deref(), Some("Failed" | "Succeeded"));
        if relay.metadata.deletion_timestamp.is_none() && ended {
            tracing::info!(relay = name, phase = ?status.phase, "the relay ended; replacing it");
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: relay.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            ignore_gone(api.delete(&name, &dp).await)?;
        }
        let ready = relay.metadata.deletion_timestamp.is_none()
            && !ended
            && status.phase.as_deref() == Some("Running")
            && status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
        Ok(Some(RelayView {
            ip: status.pod_ip.filter(|ip| !ip.is_empty()),
            ready,
        }))
    }

    /// The relay's token: the one its Secret holds (brought up to date with this leader's
    /// address and certificate), or a new one in a new Secret.
    async fn relay_token(&self, pod: &Pod, relays: &Relays) -> Result<String, Error> {
        let uid = pod.uid().unwrap_or_default();
        let ns = pod.namespace().unwrap_or_default();
        let name = relay_name(&uid);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        if let Some(secret) = secrets.get_opt(&name).await?
            && let Some(token) = text(&secret, TOKEN_FILE).filter(|t| !t.is_empty())
        {
            let current = text(&secret, NODE_FILE).as_deref() == Some(&relays.node_address)
                && text(&secret, CERT_FILE).as_deref() == Some(&relays.certificate_pem);
            if !current {
                let patch = json!({"stringData": secret_data(relays, &token)});
                secrets
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            return Ok(token);
        }
        let token = hex::encode(rand::random::<[u8; 32]>());
        match secrets
            .create(&PostParams::default(), &relay_secret(pod, relays, &token))
            .await
        {
            Ok(_) => Ok(token),
            // Made meanwhile (a reconcile of a former leader): read it next time.
            Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::Invalid(format!(
                "the relay Secret {ns}/{name} was made meanwhile; reading it again"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Ends the relay of `pod` (it ended or is going): its connections are refused from now on,
    /// and its Pod and Secret are deleted (its owner, the burst Pod, would take them too).
    pub(super) async fn drop_relay(&self, pod: &Pod) -> Result<(), Error> {
        let Some(relays) = &self.cfg.relays else {
            return Ok(());
        };
        let uid = pod.uid().unwrap_or_default();
        relays.table.remove(&uid);
        if !tcp_ports(pod).is_ok_and(|p| !p.is_empty()) {
            return Ok(());
        }
        let ns = pod.namespace().unwrap_or_default();
        let name = relay_name(&uid);
        // Nothing to delete when the watch of relays has none (the Secret, if a relay Pod was
        // never made beside it, goes with the burst Pod, its owner).
        let key = reflector::ObjectRef::new(&name).within(&ns);
        if let Some(store) = self.caches().and_then(|c| c.relays.as_ref())
            && store.get(&key).is_none()
        {
            return Ok(());
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        ignore_gone(pods.delete(&name, &DeleteParams::default()).await)?;
        ignore_gone(secrets.delete(&name, &DeleteParams::default()).await)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ports: &serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "vllm-0", "namespace": "ml", "uid": "u-1",
                "labels": {"model.aibrix.ai/name": "llama", "app": "vllm"}},
            "spec": {"containers": [{"name": "main", "image": "vllm", "ports": ports}]},
        }))
        .unwrap()
    }

    fn relays() -> Relays {
        Relays {
            image: "ghcr.io/aibrix/neocloud-node:1".into(),
            node_address: "10.0.0.5:10250".into(),
            certificate_pem: "PEM".into(),
            table: Arc::default(),
        }
    }

    #[test]
    fn tcp_ports_are_carried_and_udp_is_refused_with_its_field() {
        let p = pod(
            &json!([{"containerPort": 8000, "name": "http"}, {"containerPort": 9090,
            "protocol": "TCP"}, {"containerPort": 8000}]),
        );
        assert_eq!(
            tcp_ports(&p).unwrap(),
            vec![(8000, Some("http".into())), (9090, None)]
        );
        let p = pod(&json!([{"containerPort": 8000}, {"containerPort": 53, "protocol": "UDP"}]));
        let err = tcp_ports(&p).unwrap_err();
        assert!(
            err.contains("spec.containers[0].ports[1].protocol: \"UDP\" is not carried"),
            "{err}"
        );
        assert_eq!(tcp_ports(&pod(&json!(null))).unwrap(), vec![]);
    }

    #[test]
    fn the_relay_pod_is_unprivileged_owned_by_the_burst_pod_and_selected_by_nothing_of_its() {
        let p = pod(&json!([{"containerPort": 8000, "name": "http"}]));
        let relay = relay_pod(&p, &relays(), &tcp_ports(&p).unwrap());
        assert_eq!(relay.name_any(), "neocloud-relay-u-1");
        let labels = relay.labels();
        assert!(!labels.contains_key("app") && !labels.contains_key("model.aibrix.ai/name"));
        assert_eq!(labels[RELAY_LABEL], "u-1");
        let owner = &relay.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Pod", "u-1"));
        assert_ne!(owner.controller, Some(true));
        let spec = relay.spec.unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("ghcr.io/aibrix/neocloud-node:1"));
        assert_eq!(c.args.as_deref(), Some(&["relay".to_owned()][..]));
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
        assert_eq!(spec.security_context.unwrap().run_as_non_root, Some(true));
        let env: Vec<_> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.clone()))
            .collect();
        assert!(
            env.contains(&("NEOCLOUD_RELAY_PORTS", Some("8000".into()))),
            "{env:?}"
        );
        // The token is in the Secret only, never in the Pod.
        let secret = relay_secret(&p, &relays(), "tok");
        assert_eq!(secret.string_data.unwrap()[TOKEN_FILE], "tok");
        assert!(
            !serde_json::to_string(&relay_pod(&p, &relays(), &[(8000, None)]))
                .unwrap()
                .contains("tok\"")
        );
    }
}
