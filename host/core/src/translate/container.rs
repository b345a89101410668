//! The single container: image, command, env, ports, the GPU limit and its other resources.
//!
//! Not for annotations (see `annotations`) or Pod-level fields (see `pod_level`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvFromSource, EnvVar as K8sEnvVar, PodSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Refusal;
use crate::workload::{
    EnvFromKind, EnvFromRef, EnvValue, EnvVar, KeyRef, PortProtocol, PortSpec, Resources,
};

/// The extended resource that counts GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// What the container contributes to the workload.
#[derive(Debug)]
pub(super) struct ContainerParts {
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub env_from: Vec<EnvFromRef>,
    pub ports: Vec<PortSpec>,
    pub gpu_count: u32,
    pub resources: Resources,
}

pub(super) fn translate(spec: &PodSpec, out: &mut Vec<Refusal>) -> Option<ContainerParts> {
    let [c] = spec.containers.as_slice() else {
        let reason = format!(
            "{} containers are not supported; exactly one is required",
            spec.containers.len()
        );
        out.push(Refusal::new("spec.containers", reason));
        return None;
    };
    let at = "spec.containers[0]";
    check_security(c, at, out);
    let image = c.image.clone().filter(|i| !i.trim().is_empty());
    match &image {
        None => out.push(Refusal::new(format!("{at}.image"), "an image is required")),
        Some(i) => {
            if let Some(why) = image_refused(i) {
                out.push(Refusal::new(format!("{at}.image"), why));
            }
        }
    }
    let parts = ContainerParts {
        image: image.unwrap_or_default(),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        env: env(c.env.as_deref().unwrap_or_default(), at, out),
        env_from: env_from(c.env_from.as_deref().unwrap_or_default(), at, out),
        ports: ports(c.ports.as_deref().unwrap_or_default(), at, out),
        gpu_count: gpu_count(c, at, out).unwrap_or(0),
        resources: other_resources(c),
    };
    Some(parts)
}

/// Why `image` is not an image reference by the OCI distribution grammar (`[host[:port]/]name
/// [:tag][@digest]`, lower-case names), or `None`. The image goes on the `docker run` command
/// line of a rented VM: anything else (an option such as `--privileged`, whitespace, a newline)
/// is refused here, before anything is rented.
fn image_refused(image: &str) -> Option<String> {
    super::image_ref::reference_error(image).map(|e| {
        format!(
            "{image:?} is not an image reference ([registry/]name[:tag][@digest], lower-case \
             name): {e}"
        )
    })
}

fn check_security(c: &Container, at: &str, out: &mut Vec<Refusal>) {
    if c.security_context.as_ref().and_then(|s| s.privileged) == Some(true) {
        out.push(Refusal::new(
            format!("{at}.securityContext.privileged"),
            "true is not supported",
        ));
    }
    if c.volume_devices.as_ref().is_some_and(|d| !d.is_empty()) {
        out.push(Refusal::new(
            format!("{at}.volumeDevices"),
            "block devices are not supported",
        ));
    }
}

/// The container's requests and limits without GPUs (the quantities were validated by the API
/// server that stored the Pod).
fn other_resources(c: &Container) -> Resources {
    let without_gpus = |m: Option<&BTreeMap<String, Quantity>>| {
        m.into_iter()
            .flatten()
            .filter(|(k, _)| k.as_str() != GPU_RESOURCE)
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect()
    };
    let r = c.resources.as_ref();
    Resources {
        requests: without_gpus(r.and_then(|r| r.requests.as_ref())),
        limits: without_gpus(r.and_then(|r| r.limits.as_ref())),
    }
}

fn gpu_count(c: &Container, at: &str, out: &mut Vec<Refusal>) -> Option<u32> {
    let field = format!("{at}.resources.limits[{GPU_RESOURCE}]");
    let resources = c.resources.as_ref();
    let quantity = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(GPU_RESOURCE))
        .or_else(|| {
            resources
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(GPU_RESOURCE))
        });
    let Some(quantity) = quantity else {
        out.push(Refusal::new(field, "a GPU limit is required"));
        return None;
    };
    match quantity.0.trim().parse::<u32>() {
        Ok(0) => out.push(Refusal::new(
            field,
            "0 GPUs is not supported; at least one is required",
        )),
        Ok(n) => return Some(n),
        Err(_) => out.push(Refusal::new(
            field,
            format!("{:?} is not a whole number of GPUs", quantity.0),
        )),
    }
    None
}

fn env(vars: &[K8sEnvVar], at: &str, out: &mut Vec<Refusal>) -> Vec<EnvVar> {
    let mut result = Vec::with_capacity(vars.len());
    for (i, var) in vars.iter().enumerate() {
        let field = format!("{at}.env[{i}]");
        let value = match &var.value_from {
            None => Some(EnvValue::Literal {
                value: var.value.clone().unwrap_or_default(),
            }),
            Some(from) => {
                if let Some(s) = &from.secret_key_ref {
                    Some(EnvValue::SecretKey(key_ref(&s.name, &s.key, s.optional)))
                } else if let Some(c) = &from.config_map_key_ref {
                    Some(EnvValue::ConfigMapKey(key_ref(&c.name, &c.key, c.optional)))
                } else {
                    out.push(unsupported_value_from(&field, from));
                    None
                }
            }
        };
        if let Some(value) = value {
            result.push(EnvVar {
                name: var.name.clone(),
                value,
            });
        }
    }
    result
}

fn unsupported_value_from(field: &str, from: &k8s_openapi::api::core::v1::EnvVarSource) -> Refusal {
    let kind = if from.field_ref.is_some() {
        "fieldRef"
    } else if from.resource_field_ref.is_some() {
        "resourceFieldRef"
    } else if from.file_key_ref.is_some() {
        "fileKeyRef"
    } else {
        return Refusal::new(
            format!("{field}.valueFrom"),
            "an empty valueFrom is not supported",
        );
    };
    Refusal::new(
        format!("{field}.valueFrom.{kind}"),
        format!("{kind} is not supported"),
    )
}

fn key_ref(name: &str, key: &str, optional: Option<bool>) -> KeyRef {
    KeyRef {
        name: name.to_owned(),
        key: key.to_owned(),
        optional: optional.unwrap_or(false),
    }
}

fn env_from(sources: &[EnvFromSource], at: &str, out: &mut Vec<Refusal>) -> Vec<EnvFromRef> {
    let mut result = Vec::with_capacity(sources.len());
    for (i, s) in sources.iter().enumerate() {
        let (kind, name, optional) = match (&s.secret_ref, &s.config_map_ref) {
            (Some(r), None) => (EnvFromKind::Secret, &r.name, r.optional),
            (None, Some(r)) => (EnvFromKind::ConfigMap, &r.name, r.optional),
            _ => {
                let reason = "exactly one of secretRef or configMapRef is required";
                out.push(Refusal::new(format!("{at}.envFrom[{i}]"), reason));
                continue;
            }
        };
        let optional = optional.unwrap_or(false);
        result.push(EnvFromRef {
            kind,
            name: name.clone(),
            prefix: s.prefix.clone(),
            optional,
        });
    }
    result
}

fn ports(ports: &[ContainerPort], at: &str, out: &mut Vec<Refusal>) -> Vec<PortSpec> {
    let mut result = Vec::with_capacity(ports.len());
    for (i, p) in ports.iter().enumerate() {
        let field = format!("{at}.ports[{i}]");
        if p.host_port.is_some() {
            out.push(Refusal::new(
                format!("{field}.hostPort"),
                "host ports are not supported",
            ));
        }
        let protocol = match p.protocol.as_deref() {
            None | Some("TCP") => Some(PortProtocol::Tcp),
            Some("UDP") => Some(PortProtocol::Udp),
            Some(other) => {
                let reason = format!("{other:?} is not supported (expected TCP or UDP)");
                out.push(Refusal::new(format!("{field}.protocol"), reason));
                None
            }
        };
        let number = u16::try_from(p.container_port).ok().filter(|n| *n > 0);
        if number.is_none() {
            let reason = format!("{} is not a port number", p.container_port);
            out.push(Refusal::new(format!("{field}.containerPort"), reason));
        }
        if let (Some(protocol), Some(container_port)) = (protocol, number) {
            result.push(PortSpec {
                container_port,
                protocol,
                name: p.name.clone(),
            });
        }
    }
    result
}
