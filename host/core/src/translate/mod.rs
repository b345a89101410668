//! Pod -> [`WorkloadSpec`]: a pure function over the Kubernetes Pod type that accepts the
//! constrained single-container GPU subset and refuses everything else, naming the field and the
//! value ("spec.volumes[0]: persistentVolumeClaim is not supported").
//!
//! Not for resolving Secret or ConfigMap references (the node does that, with a client) and not
//! for validating CEL expressions (the policy engine compiles them).

mod annotations;
mod container;
mod egress;
mod image_ref;
mod pod_level;
mod probes;
mod volumes;

use std::fmt;

use k8s_openapi::api::core::v1::Pod;

use crate::files::FileMount;
use crate::workload::WorkloadSpec;

pub use annotations::{ANNOTATION_PREFIX, KNOWN_ANNOTATIONS, MAX_EXPRESSION_BYTES};
pub use container::GPU_RESOURCE;
pub use egress::{
    EGRESS_ANNOTATION, EgressDestination, MAX_EGRESS_DESTINATIONS, egress, is_dns_label,
    parse_egress,
};
pub use probes::{ContainerProbe, first_probe_field, probes};

/// One reason a Pod cannot be run by the virtual node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field path, e.g. `spec.volumes[0]` or `metadata.annotations[cloud.aibrix.ai/max-price]`.
    pub field: String,
    /// What is wrong with it, naming the value.
    pub reason: String,
}

impl Refusal {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Refusal {
        Refusal {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// The error of [`translate_pod`]: every reason the Pod was refused, in field order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PodRefused {
    /// Every refusal found (never empty).
    pub refusals: Vec<Refusal>,
}

impl fmt::Display for PodRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.refusals.iter().map(Refusal::to_string).collect();
        write!(f, "pod is not supported: {}", parts.join("; "))
    }
}

/// Translates a Pod into a workload, or explains every reason it cannot be run.
pub fn translate_pod(pod: &Pod) -> Result<WorkloadSpec, PodRefused> {
    let mut refusals = Vec::new();
    pod_level::check_owner(&pod.metadata, &mut refusals);
    let parsed = annotations::parse(pod.metadata.annotations.as_ref(), &mut refusals);
    let container = match &pod.spec {
        Some(spec) => {
            pod_level::check_spec(spec, &mut refusals);
            volumes::mounts(spec, &mut refusals);
            if let Some(c) = spec.containers.first() {
                probes::check(c, "spec.containers[0]", &mut refusals);
            }
            container::translate(spec, &mut refusals)
        }
        None => {
            refusals.push(Refusal::new("spec", "a Pod spec is required"));
            None
        }
    };
    match container {
        Some(c) if refusals.is_empty() => {
            let mut w = parsed.into_workload(c);
            let first = pod.spec.as_ref().and_then(|s| s.containers.first());
            w.hints.remote_probes = first
                .map(|c| crate::workload::RemoteProbes {
                    readiness: c.readiness_probe.clone(),
                    liveness: c.liveness_probe.clone(),
                    startup: c.startup_probe.clone(),
                })
                .filter(|p| p != &crate::workload::RemoteProbes::default());
            Ok(w)
        }
        _ => Err(PodRefused { refusals }),
    }
}

/// The file volumes (ConfigMap, Secret, downward API, projected) the Pod's container mounts, and
/// where; refused as [`translate_pod`] refuses them. The service-account token volume the
/// API server injects (`kube-api-access-*`) is not among them.
pub fn file_mounts(pod: &Pod) -> Result<Vec<FileMount>, PodRefused> {
    let mut refusals = Vec::new();
    let mounts = match &pod.spec {
        Some(spec) => volumes::mounts(spec, &mut refusals),
        None => Vec::new(),
    };
    if refusals.is_empty() {
        Ok(mounts)
    } else {
        Err(PodRefused { refusals })
    }
}
