//! The login a Pod's image is pulled with: its `imagePullSecrets`, read from its namespace
//! (`get` only, as env and files are), each a `kubernetes.io/dockerconfigjson` Secret, and the
//! entry for the image's registry chosen as the kubelet does
//! ([`neocloud_core::pull_secret::login_for`]). Every provider gets it with the create (RunPod a
//! registry credential, Vast `image_login`, the runner a `docker login`).
//!
//! A missing Secret, a wrong type or a malformed config keeps the Pod pending with the field and
//! the value named, and nothing is rented. Secrets with no entry for the image's registry give
//! no login, and the image is pulled anonymously, as a kubelet does: a public image with a
//! ServiceAccount's pull secret for another registry runs. Credentials never appear in errors
//! or logs. Not for the environment (see `env`) or files (see `files`).

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{Api, Client, ResourceExt};
use neocloud_core::RegistryCredential;
use neocloud_core::pull_secret::{
    ConfigEntry, DOCKER_CONFIG_JSON_KEY, DOCKER_CONFIG_JSON_TYPE, login_for, parse_docker_config,
};

/// The reason on a Pod whose pull secrets cannot be used.
pub const REASON: &str = "ImagePullSecretError";

/// Why a Pod's pull secrets give no login for its image. Never carries a credential.
#[derive(Debug, thiserror::Error)]
pub enum PullSecretError {
    /// One secret cannot be used.
    #[error("spec.imagePullSecrets[{index}].name {name:?}: {problem}")]
    Unusable {
        /// Its index in `spec.imagePullSecrets`.
        index: usize,
        /// Its name.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Reading a Secret failed.
    #[error("failed to read Secret {name}: {source}")]
    Read {
        /// The Secret.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

/// The login for `image` from the Pod's pull secrets; `None` when it names none, or none of
/// them has an entry for the image's registry.
pub async fn resolve(
    client: &Client,
    pod: &Pod,
    image: &str,
) -> Result<Option<RegistryCredential>, PullSecretError> {
    let names: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.clone())
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let secrets: Api<Secret> =
        Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let mut read = Vec::with_capacity(names.len());
    for name in &names {
        let secret = secrets
            .get_opt(name)
            .await
            .map_err(|source| PullSecretError::Read {
                name: name.clone(),
                source,
            })?;
        read.push((name.clone(), secret));
    }
    login(image, &read)
}

/// The login for `image` from `secrets` (each by name, `None` if it does not exist), in Pod
/// order; `None` when none has an entry for its registry. Pure: the decisions of [`resolve`]
/// are exactly this function's.
pub fn login(
    image: &str,
    secrets: &[(String, Option<Secret>)],
) -> Result<Option<RegistryCredential>, PullSecretError> {
    let mut entries: Vec<ConfigEntry> = Vec::new();
    for (index, (name, secret)) in secrets.iter().enumerate() {
        let unusable = |problem: String| PullSecretError::Unusable {
            index,
            name: name.clone(),
            problem,
        };
        entries.extend(secret_entries(name, secret.as_ref()).map_err(unusable)?);
    }
    Ok(login_for(image, &entries).cloned())
}

fn secret_entries(name: &str, secret: Option<&Secret>) -> Result<Vec<ConfigEntry>, String> {
    let secret = secret.ok_or_else(|| format!("Secret {name} does not exist"))?;
    let kind = secret.type_.as_deref().unwrap_or("Opaque");
    if kind != DOCKER_CONFIG_JSON_TYPE {
        return Err(format!(
            "Secret {name} has type {kind}, want {DOCKER_CONFIG_JSON_TYPE}"
        ));
    }
    let data = super::objects::secret_keys(secret)
        .remove(DOCKER_CONFIG_JSON_KEY)
        .ok_or_else(|| format!("Secret {name} has no key {DOCKER_CONFIG_JSON_KEY}"))?;
    parse_docker_config(&data).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(kind: &str, config: &str) -> Option<Secret> {
        let data = BTreeMap::from([(
            DOCKER_CONFIG_JSON_KEY.to_owned(),
            ByteString(config.as_bytes().to_vec()),
        )]);
        Some(Secret {
            type_: Some(kind.to_owned()),
            data: Some(data),
            ..Secret::default()
        })
    }

    const GHCR: &str = r#"{"auths":{"ghcr.io":{"username":"bot","password":"hunter2"}}}"#;

    #[test]
    fn the_entry_for_the_images_registry_is_the_login() {
        let secrets = [
            (
                "hub".to_owned(),
                secret(
                    DOCKER_CONFIG_JSON_TYPE,
                    r#"{"auths":{"docker.io":{"username":"a","password":"b"}}}"#,
                ),
            ),
            ("regcred".to_owned(), secret(DOCKER_CONFIG_JSON_TYPE, GHCR)),
        ];
        let login = login("ghcr.io/org/model:1", &secrets).unwrap().unwrap();
        assert_eq!(
            (login.server.as_str(), login.username.as_str()),
            ("ghcr.io", "bot")
        );
    }

    #[test]
    fn a_missing_secret_is_named_by_its_field() {
        let err = login("ghcr.io/org/model", &[("regcred".to_owned(), None)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.imagePullSecrets[0].name \"regcred\": Secret regcred does not exist"
        );
    }

    #[test]
    fn a_secret_of_another_type_is_refused() {
        let secrets = [("regcred".to_owned(), secret("Opaque", GHCR))];
        let err = login("ghcr.io/org/model", &secrets)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("has type Opaque, want kubernetes.io/dockerconfigjson"),
            "{err}"
        );
    }

    #[test]
    fn malformed_json_is_refused_without_its_content() {
        let secrets = [(
            "regcred".to_owned(),
            secret(DOCKER_CONFIG_JSON_TYPE, "{\"auths\": hunter2"),
        )];
        let err = login("ghcr.io/org/model", &secrets)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("spec.imagePullSecrets[0].name \"regcred\": .dockerconfigjson is not a docker config"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn no_entry_for_the_registry_is_an_anonymous_pull_as_a_kubelet_does() {
        let secrets = [("regcred".to_owned(), secret(DOCKER_CONFIG_JSON_TYPE, GHCR))];
        assert_eq!(login("vllm/vllm-openai:v0.9", &secrets).unwrap(), None);
        assert_eq!(login("registry.example.com/app", &secrets).unwrap(), None);
    }
}
