//! Registry traffic: pushing a component as a one-layer OCI artifact, pulling it by digest
//! with every byte checked, and reading and writing cosign signature manifests.

use std::collections::BTreeMap;
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{
    IMAGE_CONFIG_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;

use crate::signature::{self, PAYLOAD_MEDIA_TYPE, SIGNATURE_ANNOTATION, StoredSignature};
use crate::{
    COMPONENT_MEDIA_TYPE, CONFIG_MEDIA_TYPE, MAX_COMPONENT_BYTES, OciError, PolicyRef, PublicKey,
    SigningKey, Verified, sha256_digest,
};

/// The largest signature payload read.
const MAX_PAYLOAD_BYTES: i64 = 64 * 1024;

/// A registry user and password (HTTP basic auth, or the token exchange it leads to).
#[derive(Clone)]
pub struct RegistryCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// How to reach a registry.
#[derive(Debug, Clone)]
pub struct OciOptions {
    /// PEM certificates to trust beside the system's (a private registry's CA).
    pub ca_pem: Option<String>,
    /// Credentials; anonymous without.
    pub credentials: Option<RegistryCredentials>,
    /// Connect and read timeout of each request.
    pub timeout: Duration,
}

impl Default for OciOptions {
    fn default() -> Self {
        Self {
            ca_pem: None,
            credentials: None,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A pushed artifact.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// `<registry>/<repository>@sha256:<manifest digest>`: what a `BurstPolicy` names.
    pub reference: PolicyRef,
    /// The manifest's digest.
    pub digest: String,
    /// The component's digest (its bytes' sha256).
    pub component_digest: String,
}

/// A pulled component, checked against its digests.
#[derive(Debug, Clone)]
pub struct Pulled {
    pub bytes: Vec<u8>,
    /// The manifest's digest (the one the reference names).
    pub digest: String,
    /// The component's digest.
    pub component_digest: String,
}

/// A client of OCI registries for policy artifacts.
pub struct OciClient {
    client: oci_client::Client,
    auth: RegistryAuth,
}

impl std::fmt::Debug for OciClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciClient").finish_non_exhaustive()
    }
}

impl OciClient {
    /// A client over HTTPS only.
    pub fn new(options: OciOptions) -> Result<Self, OciError> {
        let mut extra = Vec::new();
        if let Some(pem) = &options.ca_pem {
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(OciError::Registry {
                    registry: "(any)".into(),
                    message: "the registry CA is not a PEM certificate".into(),
                });
            }
            extra.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data: pem.as_bytes().to_vec(),
            });
        }
        let config = ClientConfig {
            extra_root_certificates: extra,
            platform_resolver: None,
            connect_timeout: Some(options.timeout),
            read_timeout: Some(options.timeout),
            user_agent: concat!("neocloud-node/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        let auth = match options.credentials {
            Some(c) => RegistryAuth::Basic(c.username, c.password),
            None => RegistryAuth::Anonymous,
        };
        Ok(Self {
            client: oci_client::Client::new(config),
            auth,
        })
    }

    /// Stores `component` (a Wasm binary) at `target` (a tag or a repository) and returns
    /// the reference by digest.
    pub async fn push(&self, target: &PolicyRef, component: &[u8]) -> Result<Pushed, OciError> {
        if !component.starts_with(b"\0asm") {
            return Err(OciError::NotAPolicy {
                reference: target.to_string(),
                message: "the file to push is not a WebAssembly binary (no \\0asm header)".into(),
            });
        }
        self.login(target).await;
        let component_digest = sha256_digest(component);
        let config = serde_json::to_vec(&serde_json::json!({
            "component": { "digest": component_digest, "size": component.len() }
        }))
        .unwrap_or_default();
        let mut title = BTreeMap::new();
        title.insert(
            "org.opencontainers.image.title".to_owned(),
            "policy.wasm".to_owned(),
        );
        let layer = descriptor(COMPONENT_MEDIA_TYPE, component, Some(title));
        let config_descriptor = descriptor(CONFIG_MEDIA_TYPE, &config, None);
        self.blob(target, component).await?;
        self.blob(target, &config).await?;
        let digest = self
            .put_manifest(target, manifest(config_descriptor, vec![layer]))
            .await?;
        Ok(Pushed {
            reference: target.at_digest(&digest),
            digest,
            component_digest,
        })
    }

    /// Pulls the component `pinned` names (it must have a digest), refusing anything that is
    /// not a NeoCloud policy artifact or does not match its digests.
    pub async fn pull(&self, pinned: &PolicyRef) -> Result<Pulled, OciError> {
        let (manifest, digest) = self.pinned_manifest(pinned).await?;
        let not_a_policy = |message: String| OciError::NotAPolicy {
            reference: pinned.to_string(),
            message,
        };
        if manifest.config.media_type != CONFIG_MEDIA_TYPE {
            return Err(not_a_policy(format!(
                "its config media type is {:?}, not {CONFIG_MEDIA_TYPE} (push it with \
                 `neocloud-node policy push`)",
                manifest.config.media_type
            )));
        }
        let [layer] = manifest.layers.as_slice() else {
            return Err(not_a_policy(format!(
                "it has {} layers; a policy artifact has exactly one",
                manifest.layers.len()
            )));
        };
        if layer.media_type != COMPONENT_MEDIA_TYPE {
            return Err(not_a_policy(format!(
                "its layer's media type is {:?}, not {COMPONENT_MEDIA_TYPE}",
                layer.media_type
            )));
        }
        if layer.size < 0 || layer.size as u64 > MAX_COMPONENT_BYTES {
            return Err(not_a_policy(format!(
                "its component is {} bytes; at most {MAX_COMPONENT_BYTES} are pulled",
                layer.size
            )));
        }
        let mut bytes = Vec::with_capacity(layer.size as usize);
        self.client
            .pull_blob(pinned.inner(), layer, &mut bytes)
            .await
            .map_err(|e| classify(pinned, e))?;
        if bytes.len() as i64 != layer.size {
            return Err(OciError::DigestMismatch {
                reference: pinned.to_string(),
                message: format!(
                    "the component is {} bytes, its manifest says {}",
                    bytes.len(),
                    layer.size
                ),
            });
        }
        Ok(Pulled {
            bytes,
            digest,
            component_digest: layer.digest.clone(),
        })
    }

    /// Signs the artifact `pinned` names with `key`, adding the signature to the others stored
    /// under its cosign tag; returns the reference of the signature manifest.
    pub async fn sign(&self, pinned: &PolicyRef, key: &SigningKey) -> Result<PolicyRef, OciError> {
        let (_, digest) = self.pinned_manifest(pinned).await?;
        let payload = signature::payload(&pinned.repository_name(), &digest);
        let mut annotations = BTreeMap::new();
        annotations.insert(SIGNATURE_ANNOTATION.to_owned(), key.sign(&payload));
        let layer = descriptor(PAYLOAD_MEDIA_TYPE, &payload, Some(annotations));
        let tag = PolicyRef::signature_tag(&digest);
        let target = pinned.at_tag(&tag);
        let mut layers = match self.manifest(&target).await {
            Ok((existing, _)) => existing.layers,
            Err(OciError::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        let same =
            |l: &OciDescriptor| l.digest == layer.digest && l.annotations == layer.annotations;
        if !layers.iter().any(same) {
            layers.push(layer);
        }
        self.blob(&target, &payload).await?;
        let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "",
            "config": {},
            "created": "0001-01-01T00:00:00Z",
            "history": [{ "created": "0001-01-01T00:00:00Z" }],
            "os": "",
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        }))
        .unwrap_or_default();
        self.blob(&target, &config).await?;
        let config = descriptor(IMAGE_CONFIG_MEDIA_TYPE, &config, None);
        self.put_manifest(&target, manifest(config, layers)).await?;
        Ok(target)
    }

    /// The signatures stored for the artifact `pinned` names (none: an empty list).
    pub async fn signatures(&self, pinned: &PolicyRef) -> Result<Vec<StoredSignature>, OciError> {
        let digest = self.require_digest(pinned)?;
        let target = pinned.at_tag(&PolicyRef::signature_tag(&digest));
        let manifest = match self.manifest(&target).await {
            Ok((manifest, _)) => manifest,
            Err(OciError::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut found = Vec::new();
        for layer in &manifest.layers {
            let signature = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION));
            let (Some(signature), true) = (signature, layer.media_type == PAYLOAD_MEDIA_TYPE)
            else {
                continue;
            };
            if !(0..=MAX_PAYLOAD_BYTES).contains(&layer.size) {
                continue;
            }
            let mut payload = Vec::new();
            self.client
                .pull_blob(target.inner(), layer, &mut payload)
                .await
                .map_err(|e| classify(&target, e))?;
            found.push(StoredSignature {
                payload,
                signature: signature.clone(),
            });
        }
        Ok(found)
    }

    /// Checks that the artifact `pinned` names is signed by one of `keys`.
    pub async fn verify(
        &self,
        pinned: &PolicyRef,
        keys: &[PublicKey],
    ) -> Result<Verified, OciError> {
        let digest = self.require_digest(pinned)?;
        let stored = self.signatures(pinned).await?;
        let tag = PolicyRef::signature_tag(&digest);
        Ok(signature::verify(&digest, &stored, keys, &tag)?)
    }

    fn require_digest(&self, pinned: &PolicyRef) -> Result<String, OciError> {
        PolicyRef::pinned(&pinned.to_string())?;
        Ok(pinned.digest().unwrap_or_default().to_owned())
    }

    /// The manifest `pinned` names, with its bytes checked against the digest.
    async fn pinned_manifest(
        &self,
        pinned: &PolicyRef,
    ) -> Result<(OciImageManifest, String), OciError> {
        self.require_digest(pinned)?;
        self.manifest(pinned).await
    }

    async fn manifest(
        &self,
        reference: &PolicyRef,
    ) -> Result<(OciImageManifest, String), OciError> {
        self.login(reference).await;
        let (bytes, digest) = self
            .client
            .pull_manifest_raw(reference.inner(), &self.auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await
            .map_err(|e| classify(reference, e))?;
        let manifest = serde_json::from_slice(&bytes).map_err(|e| OciError::NotAPolicy {
            reference: reference.to_string(),
            message: format!("its manifest is not an OCI image manifest: {e}"),
        })?;
        Ok((manifest, digest))
    }

    async fn login(&self, reference: &PolicyRef) {
        self.client
            .store_auth_if_needed(reference.registry(), &self.auth)
            .await;
    }

    async fn blob(&self, target: &PolicyRef, data: &[u8]) -> Result<(), OciError> {
        self.client
            .push_blob(target.inner(), data, &sha256_digest(data))
            .await
            .map(drop)
            .map_err(|e| classify(target, e))
    }

    /// Puts `manifest` at `target` and returns its digest.
    async fn put_manifest(
        &self,
        target: &PolicyRef,
        manifest: OciImageManifest,
    ) -> Result<String, OciError> {
        let body = serde_json::to_vec(&manifest).unwrap_or_default();
        let digest = sha256_digest(&body);
        let content_type = http_value(OCI_IMAGE_MEDIA_TYPE);
        self.client
            .push_manifest_raw(target.inner(), body, content_type)
            .await
            .map_err(|e| classify(target, e))?;
        Ok(digest)
    }
}

fn http_value(value: &'static str) -> http::HeaderValue {
    http::HeaderValue::from_static(value)
}

fn descriptor(
    media_type: &str,
    data: &[u8],
    annotations: Option<BTreeMap<String, String>>,
) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.to_owned(),
        digest: sha256_digest(data),
        size: data.len() as i64,
        annotations,
        ..OciDescriptor::default()
    }
}

fn manifest(config: OciDescriptor, layers: Vec<OciDescriptor>) -> OciImageManifest {
    OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_owned()),
        config,
        layers,
        ..OciImageManifest::default()
    }
}

/// The message of `e` with its sources (reqwest's own says little: "error sending request").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// An [`OciError`] for a failed request about `reference`.
fn classify(reference: &PolicyRef, e: OciDistributionError) -> OciError {
    let registry = reference.registry().to_owned();
    let at = reference.to_string();
    let unauthorized = |message: String| OciError::Unauthorized {
        registry: registry.clone(),
        reference: at.clone(),
        message,
    };
    let not_found = |message: String| OciError::NotFound {
        reference: at.clone(),
        message,
    };
    match e {
        OciDistributionError::RequestError(e) => OciError::Unreachable {
            registry,
            message: chain(&e),
        },
        OciDistributionError::UnauthorizedError { .. } => {
            unauthorized("401 Unauthorized: check the credentials".into())
        }
        OciDistributionError::AuthenticationFailure(m) => unauthorized(m),
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            let message = envelope.to_string();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NameUnknown
                )
            }) {
                not_found(message)
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                unauthorized(message)
            } else {
                OciError::Registry { registry, message }
            }
        }
        OciDistributionError::ServerError { code, message, .. } => match code {
            404 => not_found(format!("404 {message}")),
            401 | 403 => unauthorized(format!("{code} {message}")),
            429 | 500.. => OciError::Unreachable {
                registry,
                message: format!("{code} {message}"),
            },
            _ => OciError::Registry {
                registry,
                message: format!("{code} {message}"),
            },
        },
        OciDistributionError::ImageManifestNotFoundError(m) => not_found(m),
        OciDistributionError::DigestError(e) => OciError::DigestMismatch {
            reference: at,
            message: e.to_string(),
        },
        OciDistributionError::ManifestParsingError(m)
        | OciDistributionError::VersionedParsingError(m) => OciError::NotAPolicy {
            reference: at,
            message: m,
        },
        OciDistributionError::UnsupportedMediaTypeError(m) => OciError::NotAPolicy {
            reference: at,
            message: format!("its manifest has media type {m}"),
        },
        other => OciError::Registry {
            registry,
            message: chain(&other),
        },
    }
}
