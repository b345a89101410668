//! Pod-level checks: owners, extra containers, volumes and host namespaces.
//!
//! Not for the main container's contents (see `container`).

use k8s_openapi::api::core::v1::{PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::Refusal;

/// Volume sources the remote host can serve: scratch space (emptyDir, served from the container
/// disk) and files the runner writes (configMap, secret, downwardAPI, projected; checked in
/// `volumes`).
const ALLOWED_VOLUME_SOURCES: [&str; 5] = [
    "projected",
    "emptyDir",
    "configMap",
    "secret",
    "downwardAPI",
];

pub(super) fn check_owner(meta: &ObjectMeta, out: &mut Vec<Refusal>) {
    for (i, owner) in meta.owner_references.iter().flatten().enumerate() {
        if owner.kind == "DaemonSet" {
            let reason = format!("pods owned by DaemonSet {:?} are not supported", owner.name);
            out.push(Refusal::new(
                format!("metadata.ownerReferences[{i}]"),
                reason,
            ));
        }
    }
}

pub(super) fn check_spec(spec: &PodSpec, out: &mut Vec<Refusal>) {
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let what = if c.restart_policy.as_deref() == Some("Always") {
            "sidecar"
        } else {
            "init"
        };
        let reason = format!("{what} container {:?} is not supported", c.name);
        out.push(Refusal::new(format!("spec.initContainers[{i}]"), reason));
    }
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let reason = format!("ephemeral container {:?} is not supported", c.name);
        out.push(Refusal::new(
            format!("spec.ephemeralContainers[{i}]"),
            reason,
        ));
    }
    let host_flags = [
        ("spec.hostNetwork", spec.host_network),
        ("spec.hostPID", spec.host_pid),
        ("spec.hostIPC", spec.host_ipc),
    ];
    for (field, flag) in host_flags {
        if flag == Some(true) {
            out.push(Refusal::new(field, "true is not supported"));
        }
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if let Some(source) = unsupported_source(v) {
            out.push(Refusal::new(
                format!("spec.volumes[{i}]"),
                format!("{source} is not supported"),
            ));
        }
    }
}

/// The Kubernetes name of a volume's source when it is not allowed, e.g. `persistentVolumeClaim`.
fn unsupported_source(v: &Volume) -> Option<String> {
    let value = serde_json::to_value(v).ok()?;
    let object = value.as_object()?;
    let source = object.keys().find(|k| k.as_str() != "name")?;
    (!ALLOWED_VOLUME_SOURCES.contains(&source.as_str())).then(|| source.clone())
}
