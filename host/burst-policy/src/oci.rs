//! A `BurstPolicy`'s OCI source: the registry's credentials (a `dockerconfigjson` Secret) and
//! CA (a ConfigMap key), the component's bytes checked against the digests the reference
//! names, and the required signature checked before anything is compiled.
//!
//! Not the registry protocol (see `neocloud_oci`) or compiling the component (see
//! [`super::load`]).

use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use neocloud_oci::{OciClient, OciError, OciOptions, PolicyRef, PublicKey, RegistryCredentials};
use neocloud_policy::wasm::PolicySource;

use neocloud_api::{ConfigMapKeyRef, PolicyError, SecretRef, WasmSource};

/// Why an OCI source did not load: the errors for the status, and whether trying again
/// unchanged may succeed (the registry was down, refused the login, or lacked the artifact or
/// its signature; a Secret or ConfigMap it names was missing).
#[derive(Debug)]
pub(crate) struct OciFailure {
    pub errors: Vec<PolicyError>,
    pub transient: bool,
}

impl OciFailure {
    fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            errors: vec![super::load::error(field, message)],
            transient: false,
        }
    }

    /// A Secret or ConfigMap that could not be read: it may be created or fixed later.
    fn object(field: &str, message: impl Into<String>) -> Self {
        Self {
            transient: true,
            ..Self::new(field, message)
        }
    }

    fn from_oci(field: &str, e: &OciError) -> Self {
        Self {
            errors: vec![super::load::error(field, e.to_string())],
            transient: e.may_pass(),
        }
    }
}

/// Pulls the component `s.oci` names, after checking its signature when one is required.
pub(crate) async fn source(
    client: &kube::Client,
    s: &WasmSource,
) -> Result<PolicySource, OciFailure> {
    const FIELD: &str = "spec.wasm.oci";
    let text = s.oci.as_deref().unwrap_or_default();
    let reference = PolicyRef::pinned(text).map_err(|e| OciFailure::from_oci(FIELD, &e))?;
    let keys = match &s.require_signature {
        Some(required) => Some(public_keys(&required.public_keys)?),
        None => None,
    };
    let credentials = match &s.pull_secret {
        Some(r) => Some(
            credentials(client, r, reference.registry())
                .await
                .map_err(|m| OciFailure::object("spec.wasm.pullSecret", m))?,
        ),
        None => None,
    };
    let ca_pem = match &s.registry_ca {
        Some(r) => Some(
            ca(client, r)
                .await
                .map_err(|m| OciFailure::object("spec.wasm.registryCa", m))?,
        ),
        None => None,
    };
    let oci = OciClient::new(OciOptions {
        ca_pem,
        credentials,
        ..OciOptions::default()
    })
    .map_err(|e| OciFailure::from_oci("spec.wasm.registryCa", &e))?;
    // Pulled first, so an artifact that is missing or altered says so; its bytes are compiled
    // only after the signature is checked.
    let pulled = oci
        .pull(&reference)
        .await
        .map_err(|e| OciFailure::from_oci(FIELD, &e))?;
    if let Some(keys) = keys {
        let verified = oci.verify(&reference, &keys).await.map_err(|e| {
            let field = match e {
                OciError::Signature(_) => "spec.wasm.requireSignature",
                _ => FIELD,
            };
            OciFailure::from_oci(field, &e)
        })?;
        tracing::info!(%reference, key = %verified.key_id, "policy artifact signature verified");
    }
    let sha256 = pulled
        .component_digest
        .strip_prefix("sha256:")
        .map(str::to_owned);
    Ok(PolicySource::Bytes {
        name: format!("oci {reference}"),
        bytes: pulled.bytes,
        sha256,
    })
}

fn public_keys(pems: &[String]) -> Result<Vec<PublicKey>, OciFailure> {
    if pems.is_empty() {
        return Err(OciFailure::new(
            "spec.wasm.requireSignature.publicKeys",
            "lists no key; a required signature needs at least one",
        ));
    }
    pems.iter()
        .enumerate()
        .map(|(i, pem)| {
            let field = format!("spec.wasm.requireSignature.publicKeys[{i}]");
            PublicKey::from_pem(&field, pem).map_err(|e| OciFailure::new(&field, e.to_string()))
        })
        .collect()
}

/// The user and password for `registry` in a `dockerconfigjson` Secret.
async fn credentials(
    client: &kube::Client,
    r: &SecretRef,
    registry: &str,
) -> Result<RegistryCredentials, String> {
    let (ns, name) = (&r.namespace, &r.name);
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = api
        .get_opt(name)
        .await
        .map_err(|e| format!("failed to read secret {ns}/{name}: {e}"))?
        .ok_or_else(|| format!("secret {ns}/{name} does not exist"))?;
    let json = secret
        .data
        .as_ref()
        .and_then(|d| d.get(".dockerconfigjson"))
        .ok_or_else(|| {
            format!(
                "secret {ns}/{name} has no .dockerconfigjson key; create it with `kubectl create \
                 secret docker-registry {name} --docker-server={registry} ...`"
            )
        })?;
    docker_config_credentials(&json.0, registry).map_err(|m| format!("secret {ns}/{name}: {m}"))
}

/// The entry for `registry` in a Docker config's `auths` (keys may carry `https://`).
pub(crate) fn docker_config_credentials(
    json: &[u8],
    registry: &str,
) -> Result<RegistryCredentials, String> {
    #[derive(serde::Deserialize)]
    struct DockerConfig {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, Auth>,
    }
    #[derive(serde::Deserialize)]
    struct Auth {
        username: Option<String>,
        password: Option<String>,
        auth: Option<String>,
    }
    let config: DockerConfig = serde_json::from_slice(json)
        .map_err(|e| format!(".dockerconfigjson is not a Docker config: {e}"))?;
    let host = |key: &str| {
        key.trim_start_matches("https://")
            .trim_end_matches('/')
            .to_owned()
    };
    let auth = config
        .auths
        .iter()
        .find(|(key, _)| host(key) == registry)
        .map(|(_, auth)| auth)
        .ok_or_else(|| {
            let known: Vec<String> = config.auths.keys().map(|k| host(k)).collect();
            format!(
                ".dockerconfigjson has no credentials for {registry} (it has: {})",
                known.join(", ")
            )
        })?;
    match (&auth.username, &auth.password, &auth.auth) {
        (Some(username), Some(password), _) => Ok(RegistryCredentials {
            username: username.clone(),
            password: password.clone(),
        }),
        (_, _, Some(encoded)) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok()
                .and_then(|d| String::from_utf8(d).ok())
                .ok_or_else(|| {
                    format!("the auth entry for {registry} is not base64 of user:password")
                })?;
            let (username, password) = decoded
                .split_once(':')
                .ok_or_else(|| format!("the auth entry for {registry} is not user:password"))?;
            Ok(RegistryCredentials {
                username: username.to_owned(),
                password: password.to_owned(),
            })
        }
        _ => Err(format!(
            "the entry for {registry} has neither username and password nor auth"
        )),
    }
}

/// The PEM text under `r` (in `data`, or `binaryData` as UTF-8).
async fn ca(client: &kube::Client, r: &ConfigMapKeyRef) -> Result<String, String> {
    let (ns, name, key) = (&r.namespace, &r.name, &r.key);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = api
        .get_opt(name)
        .await
        .map_err(|e| format!("failed to read configmap {ns}/{name}: {e}"))?
        .ok_or_else(|| format!("configmap {ns}/{name} does not exist"))?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(key).cloned())
        .or_else(|| {
            cm.binary_data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        })
        .ok_or_else(|| format!("configmap {ns}/{name} has no key {key}"))?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(format!(
            "configmap {ns}/{name} key {key} holds no PEM certificate"
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_credentials_are_found_by_host_in_either_form() {
        let json = br#"{"auths":{
            "https://reg.example:5000/": {"username":"u","password":"p"},
            "other.example": {"auth":"dXNlcjpwYTpzcw=="}
        }}"#;
        let c = docker_config_credentials(json, "reg.example:5000").unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "p"));
        let c = docker_config_credentials(json, "other.example").unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("user", "pa:ss")
        );
        let missing = docker_config_credentials(json, "third.example").unwrap_err();
        assert!(
            missing.contains("no credentials for third.example")
                && missing.contains("reg.example:5000, other.example"),
            "{missing}"
        );
        let bad = docker_config_credentials(b"{\"auths\": []}", "x").unwrap_err();
        assert!(bad.contains("is not a Docker config"), "{bad}");
        let empty = docker_config_credentials(br#"{"auths":{"x":{}}}"#, "x").unwrap_err();
        assert!(
            empty.contains("neither username and password nor auth"),
            "{empty}"
        );
    }
}
