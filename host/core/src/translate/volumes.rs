//! Volumes of files: which ConfigMap, Secret, downward-API and projected volumes the container
//! mounts, and where ([`FileMount`]), refusing what the runner cannot write safely (a
//! service-account token, `..` or absolute item paths, modes over 0777, `subPath` mounts),
//! each refusal naming its field.
//!
//! Not for reading the objects or the size bound (see [`crate::files::build`]) and not for other
//! volume kinds (see `pod_level`).

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIVolumeFile, KeyToPath, PodSpec, SecretProjection, VolumeMount,
    VolumeProjection,
};

use super::Refusal;
use crate::files::{
    DEFAULT_FILE_MODE, DownwardItem, FileMount, FileSource, KeyPath, downward_field_supported,
    mount_path_error, relative_path_error,
};
use crate::workload::EnvFromKind;

/// The prefix of the projected volume the ServiceAccount admission adds to every Pod (token,
/// cluster CA, namespace): it is left out, as before files were supported; its token is for the
/// API server of a cluster the rented machine does not reach.
pub(super) const INJECTED_TOKEN_VOLUME: &str = "kube-api-access-";

/// The mounts of file volumes by the Pod's first container; refusals go to `out`.
pub(super) fn mounts(spec: &PodSpec, out: &mut Vec<Refusal>) -> Vec<FileMount> {
    let mut sources = Vec::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let at = format!("spec.volumes[{i}]");
        if let Some(s) = volume_sources(v, &at, out) {
            sources.push((v.name.as_str(), at, s));
        }
    }
    let Some(c) = spec.containers.first() else {
        return Vec::new();
    };
    let mut result = Vec::new();
    for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
        let Some((_, field, s)) = sources.iter().find(|(name, _, _)| *name == m.name) else {
            continue;
        };
        let at = format!("spec.containers[0].volumeMounts[{j}]");
        if check_mount(m, &at, out) {
            result.push(FileMount {
                volume: m.name.clone(),
                field: field.clone(),
                mount_path: m.mount_path.clone(),
                sources: s.clone(),
            });
        }
    }
    result
}

fn check_mount(m: &VolumeMount, at: &str, out: &mut Vec<Refusal>) -> bool {
    let before = out.len();
    if let Some(why) = mount_path_error(&m.mount_path) {
        let reason = format!("{:?} {why}", m.mount_path);
        out.push(Refusal::new(format!("{at}.mountPath"), reason));
    }
    for (name, value) in [("subPath", &m.sub_path), ("subPathExpr", &m.sub_path_expr)] {
        if let Some(value) = value.as_deref().filter(|s| !s.is_empty()) {
            let reason = format!(
                "{value:?} is not supported on a file volume; mount the whole volume (its files \
                 follow updates)"
            );
            out.push(Refusal::new(format!("{at}.{name}"), reason));
        }
    }
    out.len() == before
}

/// The sources of a file volume, `None` for another kind (or the injected token volume).
fn volume_sources(
    v: &k8s_openapi::api::core::v1::Volume,
    at: &str,
    out: &mut Vec<Refusal>,
) -> Option<Vec<FileSource>> {
    if let Some(c) = &v.config_map {
        let mode = mode(c.default_mode, &format!("{at}.configMap.defaultMode"), out);
        let projection = ConfigMapProjection {
            name: c.name.clone(),
            items: c.items.clone(),
            optional: c.optional,
        };
        return Some(vec![config_map(
            &projection,
            mode,
            &format!("{at}.configMap"),
            out,
        )]);
    }
    if let Some(s) = &v.secret {
        let mode = mode(s.default_mode, &format!("{at}.secret.defaultMode"), out);
        let projection = SecretProjection {
            name: s.secret_name.clone().unwrap_or_default(),
            items: s.items.clone(),
            optional: s.optional,
        };
        return Some(vec![secret(
            &projection,
            mode,
            &format!("{at}.secret"),
            out,
        )]);
    }
    if let Some(d) = &v.downward_api {
        let at = format!("{at}.downwardAPI");
        let mode = mode(d.default_mode, &format!("{at}.defaultMode"), out);
        let items = downward(d.items.as_deref().unwrap_or_default(), &at, out);
        return Some(vec![FileSource::Downward {
            items,
            default_mode: mode,
        }]);
    }
    if let Some(p) = &v.projected {
        if v.name.starts_with(INJECTED_TOKEN_VOLUME) {
            return None;
        }
        let at = format!("{at}.projected");
        let mode = mode(p.default_mode, &format!("{at}.defaultMode"), out);
        let sources = p.sources.iter().flatten().enumerate();
        return Some(
            sources
                .filter_map(|(k, s)| projection(s, mode, &format!("{at}.sources[{k}]"), out))
                .collect(),
        );
    }
    None
}

fn projection(
    s: &VolumeProjection,
    mode: u32,
    at: &str,
    out: &mut Vec<Refusal>,
) -> Option<FileSource> {
    if let Some(c) = &s.config_map {
        return Some(config_map(c, mode, &format!("{at}.configMap"), out));
    }
    if let Some(secret_source) = &s.secret {
        return Some(secret(secret_source, mode, &format!("{at}.secret"), out));
    }
    if let Some(d) = &s.downward_api {
        let at = format!("{at}.downwardAPI");
        let items = downward(d.items.as_deref().unwrap_or_default(), &at, out);
        return Some(FileSource::Downward {
            items,
            default_mode: mode,
        });
    }
    let kind = if s.service_account_token.is_some() {
        "serviceAccountToken"
    } else if s.cluster_trust_bundle.is_some() {
        "clusterTrustBundle"
    } else {
        "this projection"
    };
    let reason = format!(
        "{kind} is not supported: the rented machine does not reach this cluster's API server"
    );
    out.push(Refusal::new(format!("{at}.{kind}"), reason));
    None
}

fn config_map(c: &ConfigMapProjection, mode: u32, at: &str, out: &mut Vec<Refusal>) -> FileSource {
    FileSource::Object {
        kind: EnvFromKind::ConfigMap,
        name: c.name.clone(),
        items: c.items.as_deref().map(|i| items(i, at, out)),
        optional: c.optional.unwrap_or(false),
        default_mode: mode,
        field: at.to_owned(),
    }
}

fn secret(s: &SecretProjection, mode: u32, at: &str, out: &mut Vec<Refusal>) -> FileSource {
    FileSource::Object {
        kind: EnvFromKind::Secret,
        name: s.name.clone(),
        items: s.items.as_deref().map(|i| items(i, at, out)),
        optional: s.optional.unwrap_or(false),
        default_mode: mode,
        field: at.to_owned(),
    }
}

fn items(items: &[KeyToPath], at: &str, out: &mut Vec<Refusal>) -> Vec<KeyPath> {
    let mut result = Vec::with_capacity(items.len());
    for (j, item) in items.iter().enumerate() {
        let at = format!("{at}.items[{j}]");
        let ok = path_ok(&item.path, &format!("{at}.path"), out);
        let mode = item
            .mode
            .map(|m| self::mode(Some(m), &format!("{at}.mode"), out));
        if ok {
            result.push(KeyPath {
                key: item.key.clone(),
                path: item.path.clone(),
                mode,
            });
        }
    }
    result
}

fn downward(
    items: &[DownwardAPIVolumeFile],
    at: &str,
    out: &mut Vec<Refusal>,
) -> Vec<DownwardItem> {
    let mut result = Vec::with_capacity(items.len());
    for (j, item) in items.iter().enumerate() {
        let at = format!("{at}.items[{j}]");
        let mut ok = path_ok(&item.path, &format!("{at}.path"), out);
        let mode = item
            .mode
            .map(|m| self::mode(Some(m), &format!("{at}.mode"), out));
        if item.resource_field_ref.is_some() {
            let reason = "resourceFieldRef is not supported in a downwardAPI volume";
            out.push(Refusal::new(format!("{at}.resourceFieldRef"), reason));
            ok = false;
        }
        let field_path = item.field_ref.as_ref().map(|f| f.field_path.clone());
        match field_path {
            Some(f) if downward_field_supported(&f) => {
                if ok {
                    result.push(DownwardItem {
                        path: item.path.clone(),
                        field_path: f,
                        mode,
                    });
                }
            }
            Some(f) => {
                let reason = format!(
                    "{f:?} is not supported (metadata.name, metadata.namespace, metadata.uid, \
                     metadata.labels, metadata.annotations, or one label or annotation)"
                );
                out.push(Refusal::new(format!("{at}.fieldRef.fieldPath"), reason));
            }
            None if item.resource_field_ref.is_some() => {}
            None => out.push(Refusal::new(at, "a fieldRef is required")),
        }
    }
    result
}

fn path_ok(path: &str, at: &str, out: &mut Vec<Refusal>) -> bool {
    match relative_path_error(path) {
        None => true,
        Some(why) => {
            out.push(Refusal::new(at, format!("{path:?} {why}")));
            false
        }
    }
}

/// A file mode of 0 to 0777, or a refusal (and the default mode).
fn mode(value: Option<i32>, at: &str, out: &mut Vec<Refusal>) -> u32 {
    match value {
        None => DEFAULT_FILE_MODE,
        Some(m) if (0..=0o777).contains(&m) => m as u32,
        Some(m) => {
            let reason = format!("{m} is not a file mode of 0 to 0777 (511 in decimal)");
            out.push(Refusal::new(at, reason));
            DEFAULT_FILE_MODE
        }
    }
}
