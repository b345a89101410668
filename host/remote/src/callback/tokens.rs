//! The runner's credentials: one-time bootstrap tokens (carried in a VM's `user_data`) and the
//! short-lived session tokens a runner gets in exchange for one.
//!
//! A bootstrap token is 32 random bytes, base64url without padding, bound to one rental of one
//! binding. Only its SHA-256 is kept; it expires after a few minutes (the boot timeout and the
//! time renting may take) and is removed when consumed. The other secret of `user_data`, the
//! boot credential ([`super::credential`]), expires with it and is spent once the rental's runner
//! has called in, so reading `user_data` later (a console, a snapshot, the metadata service, a
//! workload on the machine) yields nothing usable, and a rental that was replaced is refused
//! whatever it holds. A session token is a compact HS256 JWT (made and checked by
//! `jsonwebtoken`, which refuses any other algorithm, `none` included) whose subject is the
//! binding's SPIFFE ID (`spiffe://<trust-domain>/neocloud/binding/<uid>`) and whose `rental`
//! claim names the rental (the binding's runner generation; 0 in sessions from before rentals
//! were named), signed with a key derived from the node's runner identity
//! ([`super::credential::RunnerKeys`]), which every replica shares: a session outlives a restart
//! or a leader change, until the key is rotated, and is accepted only while its rental is the
//! binding's current one.
//!
//! Not HTTP and not authorization of routes: the server maps tokens to bindings with these types.

use std::fmt;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use parking_lot::Mutex;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use neocloud_protocol::{BootstrapToken, Secret, SessionToken, unix_now};

/// How long a bootstrap token is valid unless configured otherwise.
pub const DEFAULT_BOOTSTRAP_TTL: Duration = Duration::from_secs(10 * 60);
/// How long a session token is valid unless configured otherwise.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(15 * 60);
/// How long a renewal credential is valid unless configured otherwise.
pub const DEFAULT_RENEWAL_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Clock skew tolerated when checking a session's `iat` and `exp`.
pub const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Why a token was refused. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No live bootstrap token has this value.
    #[error("bootstrap token is not valid")]
    UnknownBootstrap,
    /// The bootstrap token existed but its lifetime is over.
    #[error("bootstrap token has expired")]
    ExpiredBootstrap,
    /// The bootstrap token was already exchanged once.
    #[error("bootstrap token was already used (replayed)")]
    ReplayedBootstrap,
    /// The session token is not three base64url parts of the expected JSON.
    #[error("session token is malformed")]
    MalformedSession,
    /// The session token's signature does not match (tampered, or from another process).
    #[error("session token signature is not valid")]
    BadSignature,
    /// The session token's `exp` is in the past.
    #[error("session token has expired")]
    SessionExpired,
    /// The session token was issued in the future (beyond the tolerated skew).
    #[error("session token is not valid yet")]
    SessionNotYetValid,
    /// The subject is not a binding of this node's trust domain.
    #[error("session token subject is not a binding of trust domain {expected}")]
    ForeignTrustDomain {
        /// This node's trust domain.
        expected: String,
    },
    /// The re-authentication credential is not
    /// `ncr2:<key id>:<uid>:<rental>:<kind>:<not after>:<mac>`.
    #[error("re-authentication credential is malformed")]
    MalformedCredential,
    /// The credential's MAC does not match its binding (forged, or another binding's).
    #[error("re-authentication credential is not valid")]
    BadCredential,
    /// The credential was made with a key that is no longer the node's (rotated away).
    #[error("re-authentication credential was made with a rotated-away key")]
    StaleCredential,
    /// The credential's lifetime is over.
    #[error("re-authentication credential has expired")]
    ExpiredCredential,
    /// An `ncr1` credential: it named no rental and never expired, so it is no longer accepted.
    #[error(
        "re-authentication credential is of the retired format ncr1 (it names no rental and \
         never expires): no longer accepted"
    )]
    RetiredCredential,
    /// A binding uid or trust domain that cannot be part of a SPIFFE ID.
    #[error("invalid {what} {value:?}: only ASCII letters, digits, '.', '-' and '_' are allowed")]
    InvalidName {
        /// "binding uid" or "trust domain".
        what: &'static str,
        /// The offending (non-secret) value.
        value: String,
    },
}

/// `a == b` in time that depends only on the lengths (subtle's `ConstantTimeEq`).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// Checks that `value` can be a SPIFFE path segment or trust domain.
pub fn check_name(what: &'static str, value: &str) -> Result<(), TokenError> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if value.is_empty() || value.len() > 253 || !value.chars().all(ok) {
        return Err(TokenError::InvalidName {
            what,
            value: value.to_string(),
        });
    }
    Ok(())
}

#[derive(Debug)]
struct Pending {
    uid: String,
    rental: u64,
    hash: [u8; 32],
    expires: Instant,
}

#[derive(Debug, Default)]
struct BootstrapInner {
    pending: Vec<Pending>,
    /// Hashes of consumed tokens, kept until their original expiry to name replays.
    consumed: Vec<([u8; 32], Instant)>,
}

/// The live bootstrap tokens: at most one per binding, each usable once.
#[derive(Debug)]
pub struct BootstrapTokens {
    ttl: Duration,
    inner: Mutex<BootstrapInner>,
}

impl BootstrapTokens {
    /// A store whose tokens live for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            inner: Mutex::new(BootstrapInner::default()),
        }
    }

    /// Issues a fresh token for rental `rental` of `uid`, replacing any unused one. Calling it
    /// twice leaves only the second token valid.
    pub fn issue(&self, uid: &str, rental: u64) -> Result<BootstrapToken, TokenError> {
        self.issue_at(uid, rental, Instant::now())
    }

    fn issue_at(&self, uid: &str, rental: u64, now: Instant) -> Result<BootstrapToken, TokenError> {
        check_name("binding uid", uid)?;
        let mut raw = [0u8; 32];
        rand::rng().fill_bytes(&mut raw);
        let token = URL_SAFE_NO_PAD.encode(raw);
        let mut inner = self.inner.lock();
        inner.pending.retain(|p| p.uid != uid);
        inner.pending.push(Pending {
            uid: uid.to_string(),
            rental,
            hash: sha256(&token),
            expires: now + self.ttl,
        });
        Ok(Secret::new(token))
    }

    /// Removes `uid`'s unused token, if any. Idempotent.
    pub fn revoke(&self, uid: &str) {
        self.inner.lock().pending.retain(|p| p.uid != uid);
    }

    /// Exchanges a token for the uid and rental it is bound to; the token is gone afterwards.
    pub fn consume(&self, token: &str) -> Result<(String, u64), TokenError> {
        self.consume_at(token, Instant::now())
    }

    fn consume_at(&self, token: &str, now: Instant) -> Result<(String, u64), TokenError> {
        let hash = sha256(token);
        let mut inner = self.inner.lock();
        inner.consumed.retain(|(_, until)| *until > now);
        // Compare against every entry so the time taken does not depend on which one matches.
        let mut found = None;
        for (i, pending) in inner.pending.iter().enumerate() {
            if constant_time_eq(&pending.hash, &hash) {
                found = Some(i);
            }
        }
        if let Some(i) = found {
            let pending = inner.pending.swap_remove(i);
            if pending.expires <= now {
                return Err(TokenError::ExpiredBootstrap);
            }
            inner.consumed.push((hash, pending.expires));
            return Ok((pending.uid, pending.rental));
        }
        let replayed = inner
            .consumed
            .iter()
            .fold(false, |seen, (h, _)| seen | constant_time_eq(h, &hash));
        Err(if replayed {
            TokenError::ReplayedBootstrap
        } else {
            TokenError::UnknownBootstrap
        })
    }
}

fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The hex SHA-256 of a token: safe to log to correlate requests without revealing it.
pub fn fingerprint(token: &str) -> String {
    hex::encode(&sha256(token)[..6])
}

/// A session token's claims.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    /// The rental; absent (0) in sessions issued before rentals were named.
    #[serde(default)]
    rental: u64,
    iat: i64,
    exp: i64,
    jti: String,
}

/// A session issued to a runner.
#[derive(Debug, Clone)]
pub struct IssuedSession {
    /// The compact token.
    pub token: SessionToken,
    /// Expiry, in seconds since the Unix epoch.
    pub expires_at: i64,
    /// The subject: the binding's SPIFFE ID.
    pub spiffe_id: String,
    /// The rental it is for.
    pub rental: u64,
}

/// Issues and verifies session tokens (HS256 JWTs, by `jsonwebtoken`) with an HMAC key.
pub struct SessionSigner {
    encoding: EncodingKey,
    decoding: DecodingKey,
    trust_domain: String,
    ttl: Duration,
}

impl fmt::Debug for SessionSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionSigner")
            .field("trust_domain", &self.trust_domain)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl SessionSigner {
    /// A signer with a fresh random key for `trust_domain` whose sessions live for `ttl`.
    pub fn new(trust_domain: &str, ttl: Duration) -> Result<Self, TokenError> {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        Self::with_key(&key, trust_domain, ttl)
    }

    /// A signer with `key` (shared by the node's replicas) for `trust_domain`.
    pub fn with_key(key: &[u8], trust_domain: &str, ttl: Duration) -> Result<Self, TokenError> {
        check_name("trust domain", trust_domain)?;
        Ok(Self {
            encoding: EncodingKey::from_secret(key),
            decoding: DecodingKey::from_secret(key),
            trust_domain: trust_domain.to_string(),
            ttl,
        })
    }

    /// The SPIFFE ID of a binding in this trust domain.
    pub fn spiffe_id(&self, uid: &str) -> String {
        format!("spiffe://{}/neocloud/binding/{uid}", self.trust_domain)
    }

    /// A new session for rental `rental` of `uid` (checked by [`check_name`] when its bootstrap
    /// token was issued).
    pub fn issue(&self, uid: &str, rental: u64) -> IssuedSession {
        self.issue_at(uid, rental, unix_now())
    }

    fn issue_at(&self, uid: &str, rental: u64, now: i64) -> IssuedSession {
        let mut jti = [0u8; 16];
        rand::rng().fill_bytes(&mut jti);
        let claims = Claims {
            sub: self.spiffe_id(uid),
            rental,
            iat: now,
            exp: now + self.ttl.as_secs() as i64,
            jti: hex::encode(jti),
        };
        // HS256 over plain string and integer claims cannot fail.
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .unwrap_or_default();
        IssuedSession {
            token: Secret::new(token),
            expires_at: claims.exp,
            spiffe_id: claims.sub,
            rental,
        }
    }

    /// Checks a session token and returns the binding uid and the rental it names.
    pub fn verify(&self, token: &str) -> Result<(String, u64), TokenError> {
        self.verify_at(token, unix_now())
    }

    fn verify_at(&self, token: &str, now: i64) -> Result<(String, u64), TokenError> {
        // `jsonwebtoken` checks `exp` against the system clock; `now` (for tests) is checked
        // here, as is `iat`, which it does not check.
        let mut validation = Validation::new(Algorithm::HS256);
        validation.validate_exp = false;
        validation.set_required_spec_claims(&["exp", "sub"]);
        let claims = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map_err(|e| refusal(e.kind()))?
            .claims;
        let skew = CLOCK_SKEW.as_secs() as i64;
        if claims.exp + skew < now {
            return Err(TokenError::SessionExpired);
        }
        if claims.iat > now + skew {
            return Err(TokenError::SessionNotYetValid);
        }
        Ok((self.binding_of(&claims.sub)?, claims.rental))
    }

    fn binding_of(&self, sub: &str) -> Result<String, TokenError> {
        let prefix = format!("spiffe://{}/neocloud/binding/", self.trust_domain);
        let uid = sub
            .strip_prefix(&prefix)
            .ok_or_else(|| TokenError::ForeignTrustDomain {
                expected: self.trust_domain.clone(),
            })?;
        check_name("binding uid", uid).map_err(|_| TokenError::MalformedSession)?;
        Ok(uid.to_string())
    }
}

/// Why `jsonwebtoken` refused a token, as a [`TokenError`]: a wrong signature is
/// [`BadSignature`](TokenError::BadSignature), anything else unreadable or of another algorithm
/// (`none` included) [`MalformedSession`](TokenError::MalformedSession).
fn refusal(kind: &ErrorKind) -> TokenError {
    match kind {
        ErrorKind::InvalidSignature => TokenError::BadSignature,
        ErrorKind::ExpiredSignature => TokenError::SessionExpired,
        ErrorKind::ImmatureSignature => TokenError::SessionNotYetValid,
        _ => TokenError::MalformedSession,
    }
}

#[cfg(test)]
#[path = "tokens_tests.rs"]
mod tests;
