//! Resolving a workload's environment: literal values, and Secret and ConfigMap references read
//! from the Pod's namespace, in Pod order (`envFrom` first, then `env`, later names winning, as
//! the kubelet does). A missing object or key that is not optional is an error that names the
//! variable and the reference; the values themselves never appear in errors or logs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use neocloud_core::{EnvFromKind, EnvValue, WorkloadSpec};

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
    #[error("failed to read {what}: {source}")]
    Read {
        /// The object.
        what: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Reads Secrets and ConfigMaps of one namespace, each at most once per resolution.
struct Objects {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    /// Keyed by (is a Secret, name).
    cache: BTreeMap<(bool, String), Option<BTreeMap<String, String>>>,
}

impl Objects {
    async fn data(
        &mut self,
        kind: EnvFromKind,
        name: &str,
    ) -> Result<Option<&BTreeMap<String, String>>, EnvError> {
        let key = (kind == EnvFromKind::Secret, name.to_owned());
        if !self.cache.contains_key(&key) {
            let what = format!("{} {name}", kind_name(kind));
            let data = match kind {
                EnvFromKind::Secret => self
                    .secrets
                    .get_opt(name)
                    .await
                    .map_err(|source| EnvError::Read { what, source })?
                    .map(|s| {
                        let mut out: BTreeMap<String, String> = s
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                            .collect();
                        out.extend(s.string_data.unwrap_or_default());
                        out
                    }),
                EnvFromKind::ConfigMap => self
                    .config_maps
                    .get_opt(name)
                    .await
                    .map_err(|source| EnvError::Read { what, source })?
                    .map(|c| c.data.unwrap_or_default()),
            };
            self.cache.insert(key.clone(), data);
        }
        Ok(self.cache.get(&key).and_then(Option::as_ref))
    }
}

fn kind_name(kind: EnvFromKind) -> &'static str {
    match kind {
        EnvFromKind::Secret => "Secret",
        EnvFromKind::ConfigMap => "ConfigMap",
    }
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
    let mut objects = Objects {
        secrets: Api::namespaced(client.clone(), namespace),
        config_maps: Api::namespaced(client.clone(), namespace),
        cache: BTreeMap::new(),
    };
    let mut out: Vec<(String, String)> = Vec::new();
    let set = |out: &mut Vec<(String, String)>, name: String, value: String| {
        out.retain(|(n, _)| *n != name);
        out.push((name, value));
    };
    for (i, from) in w.env_from.iter().enumerate() {
        match objects.data(from.kind, &from.name).await? {
            Some(data) => {
                for (k, v) in data {
                    let name = format!("{}{k}", from.prefix.as_deref().unwrap_or_default());
                    set(&mut out, name, v.clone());
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
            .data(kind, &r.name)
            .await?
            .and_then(|d| d.get(&r.key).cloned());
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
