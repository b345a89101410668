//! Resolving a workload's environment: literal values, and Secret and ConfigMap references read
//! from the Pod's namespace, in Pod order (`envFrom` first, then `env`, later names winning, as
//! the kubelet does). A missing object or key that is not optional is an error that names the
//! variable and the reference; the values themselves never appear in errors or logs.

use kube::Client;
use neocloud_core::{EnvFromKind, EnvValue, WorkloadSpec};

use super::objects::{Objects, ReadError, kind_name};

/// Why the environment could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A required object or key is missing.
    #[error("{field}: {what} does not exist")]
    Missing {
        /// The Pod field, such as `spec.containers[0].env[2]` (named by variable).
        field: String,
        /// The missing reference, such as `key token of Secret hf`.
        what: String,
    },
    /// Reading an object failed.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// A value as the environment holds it (a ConfigMap's `binaryData` is not read).
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The workload's environment with every reference resolved.
pub async fn resolve(
    client: &Client,
    namespace: &str,
    w: &WorkloadSpec,
) -> Result<Vec<(String, String)>, EnvError> {
    if w.env_from.is_empty()
        && w.env
            .iter()
            .all(|e| matches!(e.value, EnvValue::Literal { .. }))
    {
        return Ok(w
            .env
            .iter()
            .filter_map(|e| match &e.value {
                EnvValue::Literal { value } => Some((e.name.clone(), value.clone())),
                _ => None,
            })
            .collect());
    }
    let mut objects = Objects::new(client, namespace);
    let mut out: Vec<(String, String)> = Vec::new();
    let set = |out: &mut Vec<(String, String)>, name: String, value: String| {
        out.retain(|(n, _)| *n != name);
        out.push((name, value));
    };
    for (i, from) in w.env_from.iter().enumerate() {
        match objects.get(from.kind, &from.name).await? {
            Some(keys) => {
                for (k, v) in &keys.text {
                    let name = format!("{}{k}", from.prefix.as_deref().unwrap_or_default());
                    set(&mut out, name, text(v));
                }
            }
            None if from.optional => {}
            None => {
                return Err(EnvError::Missing {
                    field: format!("spec.containers[0].envFrom[{i}]"),
                    what: format!("{} {}", kind_name(from.kind), from.name),
                });
            }
        }
    }
    for e in &w.env {
        let (kind, r) = match &e.value {
            EnvValue::Literal { value } => {
                set(&mut out, e.name.clone(), value.clone());
                continue;
            }
            EnvValue::SecretKey(r) => (EnvFromKind::Secret, r),
            EnvValue::ConfigMapKey(r) => (EnvFromKind::ConfigMap, r),
        };
        let value = objects
            .get(kind, &r.name)
            .await?
            .and_then(|keys| keys.text.get(&r.key).map(|v| text(v)));
        match value {
            Some(v) => set(&mut out, e.name.clone(), v),
            None if r.optional => {}
            None => {
                return Err(EnvError::Missing {
                    field: format!("spec.containers[0].env[{}]", e.name),
                    what: format!("key {} of {} {}", r.key, kind_name(kind), r.name),
                });
            }
        }
    }
    Ok(out)
}
