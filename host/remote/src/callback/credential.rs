//! The keys every replica of a node shares to keep runners' identities across restarts and
//! leader changes, and the per-binding re-authentication credential made from them.
//!
//! One 32-byte master key (kept in a Secret, see [`super::identity`]) yields, by HMAC-SHA256
//! with a fixed label each, the key that signs session tokens and the key that makes
//! re-authentication credentials; its key id is a short hash of it. A credential is
//! `ncr1:<key id>:<binding uid>:<base64url HMAC>` over the version, key id, trust domain and
//! uid: any replica holding the master key can check it without state, it names exactly one
//! binding, and a rotated master key (a new key id) voids every earlier credential.
//!
//! Not where the keys are stored, nor whether the binding is still live: the caller checks that.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use ring::hmac;
use sha2::{Digest, Sha256};

use super::tokens::{Secret, TokenError, check_name};

/// The credential format's version prefix.
const VERSION: &str = "ncr1";
/// Length of the master key, bytes.
pub const MASTER_KEY_LEN: usize = 32;

/// The keys derived from one master key. `Debug` shows the key id only.
#[derive(Clone)]
pub struct RunnerKeys {
    key_id: String,
    session: Vec<u8>,
    reauth: hmac::Key,
}

impl fmt::Debug for RunnerKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerKeys")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

fn derive(master: &[u8], label: &str) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, master);
    hmac::sign(&key, label.as_bytes()).as_ref().to_vec()
}

/// The key id of a master key: 16 hex digits of its labelled SHA-256 (reveals nothing of it).
pub fn key_id(master: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(b"neocloud/runner/key-id/v1\0");
    hash.update(master);
    hex::encode(&hash.finalize()[..8])
}

impl RunnerKeys {
    /// The keys of `master`, which must be [`MASTER_KEY_LEN`] bytes (checked by the caller that
    /// parsed it; a shorter key still works, just weaker).
    pub fn from_master(master: &[u8]) -> Self {
        Self {
            key_id: key_id(master),
            session: derive(master, "neocloud/runner/session/v1"),
            reauth: hmac::Key::new(
                hmac::HMAC_SHA256,
                &derive(master, "neocloud/runner/reauth/v1"),
            ),
        }
    }

    /// Keys from a fresh random master key that nothing else knows (tests, one-off servers).
    pub fn random() -> Self {
        Self::from_master(&random_master())
    }

    /// The key id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The key that signs session tokens.
    pub(crate) fn session_key(&self) -> &[u8] {
        &self.session
    }

    fn message(&self, trust_domain: &str, uid: &str) -> Vec<u8> {
        [VERSION, &self.key_id, trust_domain, uid]
            .join("\0")
            .into_bytes()
    }

    /// The re-authentication credential of binding `uid` in `trust_domain`.
    pub fn credential(&self, trust_domain: &str, uid: &str) -> Result<Secret, TokenError> {
        check_name("binding uid", uid)?;
        let tag = hmac::sign(&self.reauth, &self.message(trust_domain, uid));
        let mac = URL_SAFE_NO_PAD.encode(tag.as_ref());
        Ok(Secret::new(format!(
            "{VERSION}:{}:{uid}:{mac}",
            self.key_id
        )))
    }

    /// Checks a credential and returns the binding uid it names.
    pub fn verify(&self, trust_domain: &str, credential: &str) -> Result<String, TokenError> {
        let mut parts = credential.trim().split(':');
        let (Some(VERSION), Some(kid), Some(uid), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::MalformedCredential);
        };
        check_name("binding uid", uid).map_err(|_| TokenError::MalformedCredential)?;
        if kid != self.key_id {
            return Err(TokenError::StaleCredential);
        }
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| TokenError::MalformedCredential)?;
        hmac::verify(&self.reauth, &self.message(trust_domain, uid), &mac)
            .map_err(|_| TokenError::BadCredential)?;
        Ok(uid.to_string())
    }
}

/// A fresh random master key.
pub fn random_master() -> Vec<u8> {
    let mut key = vec![0u8; MASTER_KEY_LEN];
    rand::rng().fill_bytes(&mut key);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: &str = "neocloud.local";
    const UID: &str = "0b0e3c1a-7f7e-4d57-9a53-4f7a0c9d2b11";

    #[test]
    fn a_credential_names_its_binding_to_any_holder_of_the_same_master_key() {
        let master = random_master();
        let issuer = RunnerKeys::from_master(&master);
        let other_replica = RunnerKeys::from_master(&master);
        let credential = issuer.credential(DOMAIN, UID).unwrap();
        assert!(credential.expose().starts_with("ncr1:"));
        assert_eq!(
            other_replica.verify(DOMAIN, credential.expose()),
            Ok(UID.to_string())
        );
    }

    #[test]
    fn a_credential_made_with_another_key_of_the_same_id_is_refused_as_forged() {
        let keys = RunnerKeys::random();
        let forger = RunnerKeys::random();
        let forged = forger.credential(DOMAIN, UID).unwrap();
        // Same shape and key id as a real one, but the MAC is the forger's.
        let mac = forged.expose().rsplit(':').next().unwrap();
        let text = format!("ncr1:{}:{UID}:{mac}", keys.key_id());
        assert_eq!(keys.verify(DOMAIN, &text), Err(TokenError::BadCredential));
    }

    #[test]
    fn a_credential_of_one_binding_does_not_open_another() {
        let keys = RunnerKeys::random();
        let mine = keys.credential(DOMAIN, "uid-a").unwrap();
        let swapped = mine.expose().replace(":uid-a:", ":uid-b:");
        assert_eq!(
            keys.verify(DOMAIN, &swapped),
            Err(TokenError::BadCredential)
        );
    }

    #[test]
    fn a_credential_of_another_trust_domain_is_refused() {
        let keys = RunnerKeys::random();
        let foreign = keys.credential("other.domain", UID).unwrap();
        assert_eq!(
            keys.verify(DOMAIN, foreign.expose()),
            Err(TokenError::BadCredential)
        );
    }

    #[test]
    fn a_credential_from_a_rotated_away_key_is_refused_as_stale() {
        let old = RunnerKeys::random();
        let rotated = RunnerKeys::random();
        let credential = old.credential(DOMAIN, UID).unwrap();
        assert_eq!(
            rotated.verify(DOMAIN, credential.expose()),
            Err(TokenError::StaleCredential)
        );
    }

    #[test]
    fn malformed_credentials_are_refused_without_echoing_them() {
        let keys = RunnerKeys::random();
        for text in [
            "",
            "ncr1",
            "ncr2:abc:uid:mac",
            "ncr1:kid:uid",
            "ncr1:kid:u/id:mac:extra",
        ] {
            let err = keys.verify(DOMAIN, text).unwrap_err();
            assert_eq!(err, TokenError::MalformedCredential, "{text:?}");
        }
        let real = keys.credential(DOMAIN, UID).unwrap();
        let broken = format!("{}!", real.expose());
        let err = keys.verify(DOMAIN, &broken).unwrap_err();
        assert!(!err.to_string().contains(real.expose()));
    }

    #[test]
    fn keys_debug_shows_only_the_key_id() {
        let master = random_master();
        let keys = RunnerKeys::from_master(&master);
        let shown = format!("{keys:?}");
        assert!(shown.contains(keys.key_id()));
        assert!(!shown.contains(&hex::encode(&master)));
        assert!(!shown.contains(&URL_SAFE_NO_PAD.encode(&master)));
    }
}
