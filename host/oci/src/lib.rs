//! Policy distribution: a Wasm policy component as an OCI artifact in a registry, pulled only
//! by digest, and signed and verified in cosign's key-pair format so operators can use their
//! existing tools on the same artifacts.
//!
//! - [`PolicyRef`]: a reference; [`PolicyRef::pinned`] refuses one without a digest.
//! - [`OciClient`]: push, pull by digest (every byte checked against its digest), sign, and the
//!   signatures stored beside an artifact.
//! - [`signature`]: ECDSA P-256 keys (PKCS#8 and SPKI PEM, what `cosign import-key-pair` and
//!   `cosign verify --key` read), the simple-signing payload, and verification.
//!
//! Not the Wasm engine that loads what is pulled (`neocloud-policy`), nor where a
//! `BurstPolicy` says to pull from (`neocloud-node`).

mod client;
mod reference;
pub mod signature;

pub use client::{OciClient, OciOptions, Pulled, Pushed, RegistryCredentials};
pub use reference::PolicyRef;
pub use signature::{PublicKey, SigningKey, Verified};

/// The artifact's config media type: a NeoCloud policy, whatever tool stored it.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.aibrix.neocloud.policy.config.v1+json";
/// The one layer's media type: the Wasm component's bytes.
pub const COMPONENT_MEDIA_TYPE: &str = "application/vnd.aibrix.neocloud.policy.component.v1+wasm";
/// The largest component pulled (a Python guest is about 40 MB).
pub const MAX_COMPONENT_BYTES: u64 = 128 * 1024 * 1024;

/// What went wrong, naming the reference or key. [`OciError::is_transient`] says whether trying
/// again later may help.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference cannot be used.
    #[error("{reference:?} {message}")]
    Reference { reference: String, message: String },
    /// The registry cannot be reached (refused, timed out, TLS failed, 5xx).
    #[error("registry {registry} cannot be reached: {message}")]
    Unreachable { registry: String, message: String },
    /// The registry refused the credentials or has none for this repository.
    #[error("registry {registry} refused access to {reference}: {message}")]
    Unauthorized {
        registry: String,
        reference: String,
        message: String,
    },
    /// No manifest with that digest (or tag).
    #[error("{reference} does not exist in the registry: {message}")]
    NotFound { reference: String, message: String },
    /// The registry answered with something that is not a NeoCloud policy artifact.
    #[error("{reference} is not a NeoCloud policy artifact: {message}")]
    NotAPolicy { reference: String, message: String },
    /// Bytes that do not match their digest.
    #[error("{reference} was tampered with or corrupted: {message}")]
    DigestMismatch { reference: String, message: String },
    /// The registry answered in a way the client did not expect.
    #[error("registry {registry}: {message}")]
    Registry { registry: String, message: String },
    /// A key or signature problem; see [`signature::SignatureError`].
    #[error(transparent)]
    Signature(#[from] signature::SignatureError),
}

impl OciError {
    /// Whether the same request may succeed later unchanged (the registry is down or busy).
    pub fn is_transient(&self) -> bool {
        matches!(self, OciError::Unreachable { .. })
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}
