//! Signatures in cosign's key-pair format: an ECDSA P-256 / SHA-256 signature (ASN.1 DER,
//! base64) over a "simple signing" JSON payload that names the artifact's repository and
//! manifest digest, stored as a layer of an OCI manifest tagged `sha256-<hex>.sig` in the same
//! repository, with the signature in the layer's `dev.cosignproject.cosign/signature`
//! annotation. Keys are PEM: PKCS#8 (or SEC1) private keys, SPKI public keys, which
//! `cosign import-key-pair`, `cosign verify --key` and `openssl` read.
//!
//! Not the registry traffic (see [`crate::OciClient`]), and no transparency log: verification
//! is against the keys a policy lists, offline.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{DerSignature, Signature};
use p256::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, LineEnding,
};
use serde::{Deserialize, Serialize};

/// The layer media type of a signature payload.
pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The payload's `critical.type`.
const PAYLOAD_TYPE: &str = "cosign container image signature";

/// What is wrong with a key or with an artifact's signatures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A key that cannot be read.
    #[error("{what} is not a usable key: {message}")]
    Key { what: String, message: String },
    /// No signature stored for the artifact.
    #[error("{digest} has no signature (looked for the cosign tag {tag})")]
    Unsigned { digest: String, tag: String },
    /// Signatures exist but none verifies with a listed key for this digest.
    #[error(
        "{digest} has {count} signature(s) and none is valid from a listed key ({keys}): {why}"
    )]
    NotTrusted {
        digest: String,
        count: usize,
        keys: String,
        why: String,
    },
}

/// A private signing key.
pub struct SigningKey(p256::ecdsa::SigningKey);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SigningKey")
            .field(&self.public_key().id())
            .finish()
    }
}

impl SigningKey {
    /// A new random key.
    pub fn generate() -> Self {
        loop {
            let bytes: [u8; 32] = rand::random();
            if let Ok(key) = p256::ecdsa::SigningKey::from_bytes(&bytes.into()) {
                return Self(key);
            }
        }
    }

    /// Reads a PEM private key: PKCS#8 (`PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`), P-256.
    /// `what` names it in errors (a file name).
    pub fn from_pem(what: &str, pem: &str) -> Result<Self, SignatureError> {
        let refused = |message: String| SignatureError::Key {
            what: what.to_owned(),
            message,
        };
        if pem.contains("ENCRYPTED SIGSTORE PRIVATE KEY") || pem.contains("ENCRYPTED COSIGN") {
            return Err(refused(
                "it is a password-encrypted cosign key; give an unencrypted PKCS#8 P-256 key \
                 (for example from `neocloud-node policy keygen` or `openssl genpkey -algorithm \
                 EC -pkeyopt ec_paramgen_curve:P-256`)"
                    .into(),
            ));
        }
        if let Ok(key) = p256::ecdsa::SigningKey::from_pkcs8_pem(pem) {
            return Ok(Self(key));
        }
        p256::SecretKey::from_sec1_pem(pem)
            .map(|secret| Self(secret.into()))
            .map_err(|_| refused("expected a PEM ECDSA P-256 private key (PKCS#8 or SEC1)".into()))
    }

    /// The key as PKCS#8 PEM.
    pub fn to_pem(&self) -> String {
        self.0
            .to_pkcs8_pem(LineEnding::LF)
            .map(|pem| pem.to_string())
            .unwrap_or_default()
    }

    /// Its public half.
    pub fn public_key(&self) -> PublicKey {
        PublicKey::new(*self.0.verifying_key())
    }

    /// The base64 DER signature of `payload`.
    pub fn sign(&self, payload: &[u8]) -> String {
        let signature: Signature = self.0.sign(payload);
        let der: DerSignature = signature.to_der();
        STANDARD.encode(der.as_bytes())
    }
}

/// A public key signatures are checked against.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: p256::ecdsa::VerifyingKey,
    id: String,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

impl PublicKey {
    fn new(key: p256::ecdsa::VerifyingKey) -> Self {
        let der = key
            .to_public_key_der()
            .map(|d| d.as_bytes().to_vec())
            .unwrap_or_default();
        let digest = crate::sha256_digest(&der);
        let id = format!("key {}", &digest["sha256:".len().."sha256:".len() + 16]);
        Self { key, id }
    }

    /// Reads a PEM SPKI public key (`PUBLIC KEY`), P-256; `what` names it in errors.
    pub fn from_pem(what: &str, pem: &str) -> Result<Self, SignatureError> {
        p256::ecdsa::VerifyingKey::from_public_key_pem(pem.trim())
            .map(Self::new)
            .map_err(|_| SignatureError::Key {
                what: what.to_owned(),
                message: "expected a PEM ECDSA P-256 public key (`-----BEGIN PUBLIC KEY-----`)"
                    .into(),
            })
    }

    /// The key as SPKI PEM.
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .unwrap_or_default()
    }

    /// `key <16 hex digits>`: the start of the sha256 of the key's DER, to name it in messages.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether `signature` (base64 DER) is this key's signature of `payload`.
    pub fn verifies(&self, payload: &[u8], signature: &str) -> bool {
        let Ok(der) = STANDARD.decode(signature.trim()) else {
            return false;
        };
        let Ok(signature) = Signature::from_der(&der) else {
            return false;
        };
        self.key.verify(payload, &signature).is_ok()
    }
}

/// The simple-signing payload, as cosign writes it.
#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    critical: Critical,
    optional: Option<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The payload that signs `digest` in `repository` (`<registry>/<repository>`).
pub fn payload(repository: &str, digest: &str) -> Vec<u8> {
    let payload = Payload {
        critical: Critical {
            identity: Identity {
                docker_reference: repository.to_owned(),
            },
            image: Image {
                docker_manifest_digest: digest.to_owned(),
            },
            kind: PAYLOAD_TYPE.to_owned(),
        },
        optional: None,
    };
    serde_json::to_vec(&payload).unwrap_or_default()
}

/// One signature stored beside an artifact: the payload's bytes and the base64 signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSignature {
    pub payload: Vec<u8>,
    pub signature: String,
}

/// Which key a verified artifact was signed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The signing key's id ([`PublicKey::id`]).
    pub key_id: String,
}

/// Checks that one of `signatures` is a valid signature of `digest` by one of `keys`.
pub fn verify(
    digest: &str,
    signatures: &[StoredSignature],
    keys: &[PublicKey],
    signature_tag: &str,
) -> Result<Verified, SignatureError> {
    if signatures.is_empty() {
        return Err(SignatureError::Unsigned {
            digest: digest.to_owned(),
            tag: signature_tag.to_owned(),
        });
    }
    let mut other_digest = None;
    let mut unreadable = 0usize;
    for stored in signatures {
        let Ok(payload) = serde_json::from_slice::<Payload>(&stored.payload) else {
            unreadable += 1;
            continue;
        };
        let signed = &payload.critical.image.docker_manifest_digest;
        if signed != digest || payload.critical.kind != PAYLOAD_TYPE {
            other_digest = Some(signed.clone());
            continue;
        }
        if let Some(key) = keys
            .iter()
            .find(|k| k.verifies(&stored.payload, &stored.signature))
        {
            return Ok(Verified {
                key_id: key.id().to_owned(),
            });
        }
    }
    let why = match (other_digest, unreadable) {
        (Some(other), _) => format!(
            "a signature names {other}, not this artifact (tampered), and no other is valid"
        ),
        (None, n) if n == signatures.len() => "no signature payload can be read".to_owned(),
        _ => "each signature is by another key or does not match its payload".to_owned(),
    };
    let keys = keys
        .iter()
        .map(PublicKey::id)
        .collect::<Vec<_>>()
        .join(", ");
    Err(SignatureError::NotTrusted {
        digest: digest.to_owned(),
        count: signatures.len(),
        keys,
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const OTHER: &str = "sha256:1123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn signed(key: &SigningKey, digest: &str) -> StoredSignature {
        let payload = payload("registry.example.com/team/p", digest);
        StoredSignature {
            signature: key.sign(&payload),
            payload,
        }
    }

    #[test]
    fn keys_round_trip_through_pem_and_sign_what_verifies() {
        let key = SigningKey::generate();
        let again = SigningKey::from_pem("key.pem", &key.to_pem()).unwrap();
        let public = PublicKey::from_pem("key.pub", &key.public_key().to_pem()).unwrap();
        assert_eq!(again.public_key(), public);
        assert!(public.id().starts_with("key ") && public.id().len() == 20);
        let s = signed(&again, DIGEST);
        assert!(public.verifies(&s.payload, &s.signature));
        assert!(!public.verifies(b"other bytes", &s.signature));
        assert!(!public.verifies(&s.payload, "not base64!"));
    }

    #[test]
    fn the_payload_is_cosigns_simple_signing_format() {
        let value: serde_json::Value =
            serde_json::from_slice(&payload("r.example/p", DIGEST)).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "critical": {
                    "identity": {"docker-reference": "r.example/p"},
                    "image": {"docker-manifest-digest": DIGEST},
                    "type": "cosign container image signature"
                },
                "optional": null
            })
        );
    }

    #[test]
    fn verification_needs_a_listed_key_and_this_digest() {
        let (trusted, stranger) = (SigningKey::generate(), SigningKey::generate());
        let keys = [trusted.public_key()];
        let tag = "sha256-x.sig";
        let ok = verify(
            DIGEST,
            &[signed(&stranger, DIGEST), signed(&trusted, DIGEST)],
            &keys,
            tag,
        );
        assert_eq!(ok.unwrap().key_id, trusted.public_key().id());

        let unsigned = verify(DIGEST, &[], &keys, tag).unwrap_err().to_string();
        assert!(
            unsigned.contains("has no signature") && unsigned.contains(tag),
            "{unsigned}"
        );

        let unlisted = verify(DIGEST, &[signed(&stranger, DIGEST)], &keys, tag).unwrap_err();
        let unlisted = unlisted.to_string();
        assert!(
            unlisted.contains("none is valid from a listed key"),
            "{unlisted}"
        );
        assert!(unlisted.contains(trusted.public_key().id()), "{unlisted}");

        let moved = verify(DIGEST, &[signed(&trusted, OTHER)], &keys, tag).unwrap_err();
        assert!(
            moved.to_string().contains(&format!("names {OTHER}")),
            "{moved}"
        );

        let mut forged = signed(&trusted, DIGEST);
        forged.payload = payload("registry.example.com/team/p ", DIGEST);
        assert!(verify(DIGEST, &[forged], &keys, tag).is_err());
    }

    #[test]
    fn unusable_keys_are_refused_by_name() {
        let e = SigningKey::from_pem(
            "cosign.key",
            "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("cosign.key is not a usable key") && e.contains("password-encrypted"),
            "{e}"
        );
        let e = PublicKey::from_pem("team.pub", "garbage")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("team.pub") && e.contains("BEGIN PUBLIC KEY"),
            "{e}"
        );
        let private = SigningKey::generate().to_pem();
        assert!(PublicKey::from_pem("swapped", &private).is_err());
    }
}
