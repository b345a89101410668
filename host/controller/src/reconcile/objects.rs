//! The Secrets and ConfigMaps a Pod refers to, read from its namespace (`get` only), each at
//! most once per resolution, as their keys' bytes: what the environment (`env`), the files
//! (`files`) and the pull secrets (`pull_secrets`) read.
//!
//! A Secret's `stringData` is laid over its `data`, as the API server folds it in on a write.
//! A ConfigMap's `binaryData` is kept apart from its `data`: files take both, and the
//! environment only `data`, as a kubelet does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use neocloud_core::EnvFromKind;
use neocloud_core::files::ObjectData;

/// One object's keys.
#[derive(Debug, Default)]
pub struct Keys {
    /// A Secret's keys, or a ConfigMap's `data`.
    pub text: ObjectData,
    /// A ConfigMap's `binaryData`; empty for a Secret.
    pub binary: ObjectData,
}

impl Keys {
    /// Every key: `binaryData` and then `data` (the API server refuses a key in both).
    pub fn all(&self) -> ObjectData {
        let mut all = self.binary.clone();
        all.extend(self.text.clone());
        all
    }
}

/// A Secret's keys: `data`, with `stringData` over it.
pub fn secret_keys(secret: &Secret) -> ObjectData {
    let mut keys: ObjectData = (secret.data.iter().flatten())
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    keys.extend(
        (secret.string_data.iter().flatten()).map(|(k, v)| (k.clone(), v.clone().into_bytes())),
    );
    keys
}

/// What a kind is called in messages.
pub fn kind_name(kind: EnvFromKind) -> &'static str {
    match kind {
        EnvFromKind::Secret => "Secret",
        EnvFromKind::ConfigMap => "ConfigMap",
    }
}

/// Reading an object failed (not: it does not exist).
#[derive(Debug, thiserror::Error)]
#[error("failed to read {what}: {source}")]
pub struct ReadError {
    /// The object, such as `Secret hf`.
    pub what: String,
    /// The API error.
    pub source: kube::Error,
}

/// The objects of one namespace read so far.
pub struct Objects {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    /// Keyed by (is a Secret, name); `None`: it does not exist.
    cache: BTreeMap<(bool, String), Option<Keys>>,
}

impl Objects {
    /// Reads from `namespace`.
    pub fn new(client: &Client, namespace: &str) -> Self {
        Objects {
            secrets: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client.clone(), namespace),
            cache: BTreeMap::new(),
        }
    }

    /// The keys of the `kind` object `name`; `None` when it does not exist.
    pub async fn get(&mut self, kind: EnvFromKind, name: &str) -> Result<Option<&Keys>, ReadError> {
        let key = (kind == EnvFromKind::Secret, name.to_owned());
        if !self.cache.contains_key(&key) {
            let fail = |source| ReadError {
                what: format!("{} {name}", kind_name(kind)),
                source,
            };
            let keys = match kind {
                EnvFromKind::Secret => {
                    self.secrets
                        .get_opt(name)
                        .await
                        .map_err(fail)?
                        .map(|s| Keys {
                            text: secret_keys(&s),
                            binary: ObjectData::new(),
                        })
                }
                EnvFromKind::ConfigMap => {
                    let found = self.config_maps.get_opt(name).await.map_err(fail)?;
                    found.map(|c| Keys {
                        text: (c.data.into_iter().flatten())
                            .map(|(k, v)| (k, v.into_bytes()))
                            .collect(),
                        binary: (c.binary_data.into_iter().flatten())
                            .map(|(k, v)| (k, v.0))
                            .collect(),
                    })
                }
            };
            self.cache.insert(key.clone(), keys);
        }
        Ok(self.cache.get(&key).and_then(Option::as_ref))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn string_data_is_laid_over_data() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("a".to_owned(), ByteString(b"from data".to_vec())),
                ("b".to_owned(), ByteString(vec![0xff, 0])),
            ])),
            string_data: Some(BTreeMap::from([("a".to_owned(), "from stringData".into())])),
            ..Secret::default()
        };
        let keys = secret_keys(&secret);
        assert_eq!(keys["a"], b"from stringData");
        assert_eq!(keys["b"], vec![0xff, 0]);
    }

    #[test]
    fn all_keys_are_binary_and_text_together() {
        let keys = Keys {
            text: ObjectData::from([("t".to_owned(), b"x".to_vec())]),
            binary: ObjectData::from([("b".to_owned(), vec![1])]),
        };
        assert_eq!(keys.all().keys().collect::<Vec<_>>(), ["b", "t"]);
    }
}
