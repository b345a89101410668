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

    /// Whether the same request may succeed later once someone acts elsewhere without changing
    /// the reference: the registry comes back, the credentials are fixed, the artifact is
    /// pushed, or its signature is added. Not for bytes that do not match their digest, an
    /// artifact of another kind, or signatures that exist but do not verify.
    pub fn may_pass(&self) -> bool {
        matches!(
            self,
            OciError::Unreachable { .. }
                | OciError::Unauthorized { .. }
                | OciError::NotFound { .. }
                | OciError::Signature(signature::SignatureError::Unsigned { .. })
        )
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_may_pass_is_retried_and_what_is_wrong_with_the_bytes_is_not() {
        let text = |s: &str| s.to_owned();
        let passes = [
            OciError::Unreachable {
                registry: text("r"),
                message: text("refused"),
            },
            OciError::Unauthorized {
                registry: text("r"),
                reference: text("x"),
                message: text("401"),
            },
            OciError::NotFound {
                reference: text("x"),
                message: text("404"),
            },
            OciError::Signature(signature::SignatureError::Unsigned {
                digest: text("d"),
                tag: text("t"),
            }),
        ];
        for e in &passes {
            assert!(e.may_pass(), "{e}");
        }
        assert!(passes[0].is_transient() && !passes[1].is_transient());
        let stays = [
            OciError::DigestMismatch {
                reference: text("x"),
                message: text("m"),
            },
            OciError::NotAPolicy {
                reference: text("x"),
                message: text("m"),
            },
            OciError::Signature(signature::SignatureError::NotTrusted {
                digest: text("d"),
                count: 1,
                keys: text("k"),
                why: text("w"),
            }),
        ];
        for e in &stays {
            assert!(!e.may_pass(), "{e}");
        }
    }
}
