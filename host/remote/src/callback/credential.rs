//! The keys every replica of a node shares to keep runners' identities across restarts and
//! leader changes, and the re-authentication credentials made from them.
//!
//! One 32-byte master key (kept in a Secret, see [`super::identity`]) yields, by HMAC-SHA256
//! with a fixed label each, the key that signs session tokens and the key that makes
//! re-authentication credentials; its key id is a short hash of it. A credential is
//! `ncr2:<key id>:<binding uid>:<rental>:<kind>:<not after>:<base64url HMAC>` over the version,
//! key id, trust domain and every other field: any replica holding the master key can check it
//! without state, it names exactly one binding and one rental of it (the binding's runner
//! generation, kept in its status), it expires (`not after`, seconds since the Unix epoch), and
//! a rotated master key (a new key id) voids every earlier credential. Its kind is `b` for the
//! boot credential a VM's `user_data` carries (it lives as long as the bootstrap token) and `r`
//! for the renewal credential handed to a runner with each session (it lives in the runner's
//! memory only). The earlier `ncr1`, which named no rental and never expired, is refused.
//!
//! Not where the keys are stored, nor whether the rental is still current or a boot credential
//! already spent: the caller checks that.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use ring::hmac;
use sha2::{Digest, Sha256};

use super::tokens::{CLOCK_SKEW, Secret, TokenError, check_name};

/// Which credential: the one in `user_data`, or one handed out with a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    /// In the VM's `user_data`: for a runner that cannot use its bootstrap token (the node
    /// restarted before it was exchanged); spent once the rental's runner has called in.
    Boot,
    /// Handed to the runner with each session: how it gets back in after the node was away
    /// longer than its session lived.
    Renewal,
}

impl CredentialKind {
    fn tag(self) -> &'static str {
        match self {
            Self::Boot => "b",
            Self::Renewal => "r",
        }
    }
}

/// What a valid credential says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The binding.
    pub uid: String,
    /// Its rental (runner generation).
    pub rental: u64,
    /// Which credential.
    pub kind: CredentialKind,
}

/// The credential format's version prefix.
const VERSION: &str = "ncr2";
/// The retired format, refused with its own reason.
const RETIRED: &str = "ncr1";
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

    fn message(&self, trust_domain: &str, fields: [&str; 4]) -> Vec<u8> {
        let [uid, rental, kind, not_after] = fields;
        [
            VERSION,
            &self.key_id,
            trust_domain,
            uid,
            rental,
            kind,
            not_after,
        ]
        .join("\0")
        .into_bytes()
    }

    /// The re-authentication credential of rental `rental` of binding `uid` in
    /// `trust_domain`, valid until `not_after` (seconds since the Unix epoch).
    pub fn credential(
        &self,
        trust_domain: &str,
        uid: &str,
        rental: u64,
        kind: CredentialKind,
        not_after: i64,
    ) -> Result<Secret, TokenError> {
        check_name("binding uid", uid)?;
        let (rental, kind, not_after) = (rental.to_string(), kind.tag(), not_after.to_string());
        let message = self.message(trust_domain, [uid, &rental, kind, &not_after]);
        let mac = URL_SAFE_NO_PAD.encode(hmac::sign(&self.reauth, &message).as_ref());
        Ok(Secret::new(format!(
            "{VERSION}:{}:{uid}:{rental}:{kind}:{not_after}:{mac}",
            self.key_id
        )))
    }

    /// Checks a credential at `now` (seconds since the Unix epoch) and returns what it names.
    pub fn verify(
        &self,
        trust_domain: &str,
        credential: &str,
        now: i64,
    ) -> Result<Verified, TokenError> {
        let parts: Vec<&str> = credential.trim().split(':').collect();
        if parts.first() == Some(&RETIRED) {
            return Err(TokenError::RetiredCredential);
        }
        let [VERSION, kid, uid, rental, kind, not_after, mac] = parts[..] else {
            return Err(TokenError::MalformedCredential);
        };
        check_name("binding uid", uid).map_err(|_| TokenError::MalformedCredential)?;
        let parsed_kind = match kind {
            "b" => CredentialKind::Boot,
            "r" => CredentialKind::Renewal,
            _ => return Err(TokenError::MalformedCredential),
        };
        let (Ok(rental_number), Ok(until)) = (rental.parse::<u64>(), not_after.parse::<i64>())
        else {
            return Err(TokenError::MalformedCredential);
        };
        if kid != self.key_id {
            return Err(TokenError::StaleCredential);
        }
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| TokenError::MalformedCredential)?;
        let message = self.message(trust_domain, [uid, rental, kind, not_after]);
        hmac::verify(&self.reauth, &message, &mac).map_err(|_| TokenError::BadCredential)?;
        if until + (CLOCK_SKEW.as_secs() as i64) < now {
            return Err(TokenError::ExpiredCredential);
        }
        Ok(Verified {
            uid: uid.to_string(),
            rental: rental_number,
            kind: parsed_kind,
        })
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
    const NOW: i64 = 1_800_000_000;

    fn boot(keys: &RunnerKeys, uid: &str, rental: u64) -> Secret {
        keys.credential(DOMAIN, uid, rental, CredentialKind::Boot, NOW + 600)
            .unwrap()
    }

    #[test]
    fn a_credential_names_its_binding_and_rental_to_any_holder_of_the_same_master_key() {
        let master = random_master();
        let issuer = RunnerKeys::from_master(&master);
        let other_replica = RunnerKeys::from_master(&master);
        let credential = boot(&issuer, UID, 3);
        assert!(credential.expose().starts_with("ncr2:"));
        let verified = other_replica
            .verify(DOMAIN, credential.expose(), NOW)
            .unwrap();
        assert_eq!(
            verified,
            Verified {
                uid: UID.to_string(),
                rental: 3,
                kind: CredentialKind::Boot
            }
        );
    }

    #[test]
    fn a_credential_past_its_lifetime_is_refused_as_expired() {
        let keys = RunnerKeys::random();
        let credential = boot(&keys, UID, 1);
        let skew = CLOCK_SKEW.as_secs() as i64;
        assert!(
            keys.verify(DOMAIN, credential.expose(), NOW + 600 + skew)
                .is_ok()
        );
        assert_eq!(
            keys.verify(DOMAIN, credential.expose(), NOW + 601 + skew),
            Err(TokenError::ExpiredCredential)
        );
    }

    #[test]
    fn an_ncr1_credential_that_names_no_rental_and_never_expires_is_refused() {
        let keys = RunnerKeys::random();
        let old = format!("ncr1:{}:{UID}:bWFj", keys.key_id());
        assert_eq!(
            keys.verify(DOMAIN, &old, NOW),
            Err(TokenError::RetiredCredential)
        );
    }

    #[test]
    fn a_credential_made_with_another_key_of_the_same_id_is_refused_as_forged() {
        let keys = RunnerKeys::random();
        let forged = boot(&RunnerKeys::random(), UID, 1);
        // Same shape and key id as a real one, but the MAC is the forger's.
        let mac = forged.expose().rsplit(':').next().unwrap();
        let text = format!("ncr2:{}:{UID}:1:b:{}:{mac}", keys.key_id(), NOW + 600);
        assert_eq!(
            keys.verify(DOMAIN, &text, NOW),
            Err(TokenError::BadCredential)
        );
    }

    #[test]
    fn a_credential_edited_to_another_binding_rental_kind_or_expiry_is_refused() {
        let keys = RunnerKeys::random();
        let mine = boot(&keys, "uid-a", 1);
        let later = (NOW + 600).to_string();
        for edited in [
            mine.expose().replace(":uid-a:", ":uid-b:"),
            mine.expose().replace(":1:b:", ":2:b:"),
            mine.expose().replace(":1:b:", ":1:r:"),
            mine.expose().replace(&later, &(NOW + 9_999).to_string()),
        ] {
            assert_eq!(
                keys.verify(DOMAIN, &edited, NOW),
                Err(TokenError::BadCredential),
                "{edited}"
            );
        }
    }

    #[test]
    fn a_credential_of_another_trust_domain_is_refused() {
        let keys = RunnerKeys::random();
        let foreign = keys
            .credential("other.domain", UID, 1, CredentialKind::Renewal, NOW + 60)
            .unwrap();
        assert_eq!(
            keys.verify(DOMAIN, foreign.expose(), NOW),
            Err(TokenError::BadCredential)
        );
    }

    #[test]
    fn a_credential_from_a_rotated_away_key_is_refused_as_stale() {
        let old = RunnerKeys::random();
        let rotated = RunnerKeys::random();
        let credential = boot(&old, UID, 1);
        assert_eq!(
            rotated.verify(DOMAIN, credential.expose(), NOW),
            Err(TokenError::StaleCredential)
        );
    }

    #[test]
    fn malformed_credentials_are_refused_without_echoing_them() {
        let keys = RunnerKeys::random();
        for text in [
            "",
            "ncr2",
            "ncr3:abc:uid:1:b:2:mac",
            "ncr2:kid:uid:1:b:2",
            "ncr2:kid:uid:x:b:2:mac",
            "ncr2:kid:uid:1:z:2:mac",
            "ncr2:kid:u/id:1:b:2:mac",
            "ncr2:kid:uid:1:b:2:mac:extra",
        ] {
            let err = keys.verify(DOMAIN, text, NOW).unwrap_err();
            assert_eq!(err, TokenError::MalformedCredential, "{text:?}");
        }
        let real = boot(&keys, UID, 1);
        let broken = format!("{}!", real.expose());
        let err = keys.verify(DOMAIN, &broken, NOW).unwrap_err();
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
