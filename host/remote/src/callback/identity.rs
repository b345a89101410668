//! The node's runner identity as it is kept in a Kubernetes Secret: the master key of
//! [`RunnerKeys`] and, when the callback's certificate is self-signed, that certificate and its
//! key, which runners pin. Every replica reads the same Secret, so a new leader signs and checks
//! what the old one did and presents the certificate its runners trust.
//!
//! [`plan`] decides from what the Secret holds (or that there is none) whether to use it,
//! create it, or replace it (rotation asked with [`ROTATE_ANNOTATION`], or a certificate for
//! another host), and [`load_or_create`] carries that out against an [`IdentityStore`], safely
//! when two replicas do it at once: a create that finds the Secret already there, or a replace
//! that finds it changed, reads it again and uses what won. The store itself (the Kubernetes
//! Secret's reads and writes) is the node's (`run::vm::secret`), since this crate does not talk
//! to Kubernetes. Nothing here logs, or puts in an error, the Secret's data.

use std::collections::BTreeMap;
use std::fmt;

use super::credential::{MASTER_KEY_LEN, RunnerKeys, random_master};
use crate::tls::{TlsError, TlsMaterial};

/// Data key of the master key (32 raw bytes).
pub const KEY: &str = "runner-key";
/// Data key of the self-signed callback certificate (PEM).
pub const TLS_CERT: &str = "tls.crt";
/// Data key of that certificate's private key (PEM).
pub const TLS_KEY: &str = "tls.key";
/// Data key of the host the certificate was made for.
pub const TLS_HOST: &str = "tls-host";
/// Annotation on the Secret that asks the next leader to rotate the identity (any value).
pub const ROTATE_ANNOTATION: &str = "cloud.aibrix.ai/rotate-runner-identity";

/// Why the Secret's content is unusable. Messages name the data key, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// A data key is missing or malformed.
    #[error("data key {key:?} {problem}")]
    Invalid {
        /// The data key.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A self-signed certificate could not be made.
    #[error("{0}")]
    Tls(String),
    /// The store could not be read or written.
    #[error("failed to {action} it: {error}")]
    Store {
        /// `read` or `write`.
        action: &'static str,
        /// The store's error.
        error: String,
    },
    /// Other replicas kept changing it.
    #[error("still changing after {0} tries")]
    StillChanging(usize),
}

impl From<TlsError> for IdentityError {
    fn from(e: TlsError) -> Self {
        Self::Tls(e.to_string())
    }
}

/// A runner identity. `Debug` shows the key id and the certificate's host only.
#[derive(Clone)]
pub struct RunnerIdentity {
    master: Vec<u8>,
    tls: Option<(String, TlsMaterial)>,
}

impl fmt::Debug for RunnerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerIdentity")
            .field("key_id", &super::credential::key_id(&self.master))
            .field("tls_host", &self.tls.as_ref().map(|(host, _)| host))
            .finish()
    }
}

impl RunnerIdentity {
    /// A fresh identity, with a self-signed certificate for `tls_host` if given.
    pub fn generate(tls_host: Option<&str>) -> Result<Self, IdentityError> {
        let mut identity = Self {
            master: random_master(),
            tls: None,
        };
        if let Some(host) = tls_host {
            identity.tls = Some(self_signed(host)?);
        }
        Ok(identity)
    }

    /// The keys derived from the master key.
    pub fn keys(&self) -> RunnerKeys {
        RunnerKeys::from_master(&self.master)
    }

    /// The self-signed certificate and key, if this identity has them.
    pub fn tls(&self) -> Option<&TlsMaterial> {
        self.tls.as_ref().map(|(_, tls)| tls)
    }

    /// Reads an identity from a Secret's data.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Self, IdentityError> {
        let master = data.get(KEY).ok_or_else(|| missing(KEY))?;
        if master.len() != MASTER_KEY_LEN {
            return Err(IdentityError::Invalid {
                key: KEY,
                problem: format!("must be {MASTER_KEY_LEN} bytes, not {}", master.len()),
            });
        }
        let text = |key: &'static str| -> Result<Option<String>, IdentityError> {
            data.get(key)
                .map(|v| String::from_utf8(v.clone()))
                .transpose()
                .map_err(|_| IdentityError::Invalid {
                    key,
                    problem: "is not UTF-8".into(),
                })
        };
        let tls = match (text(TLS_HOST)?, text(TLS_CERT)?, text(TLS_KEY)?) {
            (Some(host), Some(cert), Some(key)) => {
                let tls = TlsMaterial::from_pem(cert, key);
                tls.check().map_err(|e| IdentityError::Invalid {
                    key: TLS_CERT,
                    problem: e.to_string(),
                })?;
                Some((host, tls))
            }
            (None, None, None) => None,
            _ => {
                let problem = format!("needs {TLS_HOST:?} and {TLS_KEY:?} with it (all or none)");
                return Err(IdentityError::Invalid {
                    key: TLS_CERT,
                    problem,
                });
            }
        };
        Ok(Self {
            master: master.clone(),
            tls,
        })
    }

    /// The Secret data that holds this identity.
    pub fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        let mut data = BTreeMap::from([(KEY.to_string(), self.master.clone())]);
        if let Some((host, tls)) = &self.tls {
            data.insert(TLS_HOST.into(), host.as_bytes().to_vec());
            data.insert(TLS_CERT.into(), tls.cert_pem().as_bytes().to_vec());
            data.insert(TLS_KEY.into(), tls.key_pem().as_bytes().to_vec());
        }
        data
    }
}

fn missing(key: &'static str) -> IdentityError {
    IdentityError::Invalid {
        key,
        problem: "is missing".into(),
    }
}

fn self_signed(host: &str) -> Result<(String, TlsMaterial), IdentityError> {
    Ok((
        host.to_string(),
        TlsMaterial::self_signed(&[host.to_string()])?,
    ))
}

/// What the Secret holds, as [`plan`] reads it.
#[derive(Debug, Clone, Copy)]
pub struct Stored<'a> {
    /// Its data.
    pub data: &'a BTreeMap<String, Vec<u8>>,
    /// Whether it carries [`ROTATE_ANNOTATION`].
    pub rotate: bool,
}

/// What to do with the Secret.
#[derive(Debug)]
pub enum Plan {
    /// Use what it holds.
    Use(RunnerIdentity),
    /// There is none: create it with this identity, then read it back (another replica may
    /// have created it first; theirs wins).
    Create(RunnerIdentity),
    /// Replace its data with this identity (and drop the rotation annotation), if it has not
    /// changed since it was read.
    Replace {
        /// The new identity.
        identity: RunnerIdentity,
        /// Why, for the log.
        why: &'static str,
    },
}

/// Decides what to do with the Secret given what it holds (`None`: it does not exist) and the
/// host of a self-signed callback certificate (`None`: the certificate comes from files).
pub fn plan(stored: Option<Stored<'_>>, tls_host: Option<&str>) -> Result<Plan, IdentityError> {
    let Some(stored) = stored else {
        return Ok(Plan::Create(RunnerIdentity::generate(tls_host)?));
    };
    if stored.rotate {
        return Ok(Plan::Replace {
            identity: RunnerIdentity::generate(tls_host)?,
            why: "rotation was asked",
        });
    }
    let mut identity = RunnerIdentity::from_data(stored.data)?;
    let stored_host = identity.tls.as_ref().map(|(host, _)| host.as_str());
    match tls_host {
        Some(host) if stored_host != Some(host) => {
            identity.tls = Some(self_signed(host)?);
            Ok(Plan::Replace {
                identity,
                why: "the callback certificate is for another host",
            })
        }
        _ => Ok(Plan::Use(identity)),
    }
}

/// Where the identity is kept: the node's Secret (see the module doc).
#[allow(async_fn_in_trait)] // used generically, never as a trait object
pub trait IdentityStore {
    /// What a replace must name to succeed: what was read, unchanged since.
    type Version;

    /// What is stored, `None` when there is nothing.
    async fn read(&self) -> Result<Option<Found<Self::Version>>, StoreError>;

    /// Stores `data` where there is nothing; [`StoreError::Conflict`] if there is now.
    async fn create(&self, data: BTreeMap<String, Vec<u8>>) -> Result<(), StoreError>;

    /// Replaces what was read as `version` with `data`, dropping [`ROTATE_ANNOTATION`];
    /// [`StoreError::Conflict`] if it changed since.
    async fn replace(
        &self,
        version: Self::Version,
        data: BTreeMap<String, Vec<u8>>,
    ) -> Result<(), StoreError>;
}

/// What [`IdentityStore::read`] found.
#[derive(Debug, Clone)]
pub struct Found<V> {
    /// Its data.
    pub data: BTreeMap<String, Vec<u8>>,
    /// Whether it carries [`ROTATE_ANNOTATION`].
    pub rotate: bool,
    /// What a replace names.
    pub version: V,
}

/// Why a store's read or write failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Another writer was first.
    #[error("another replica wrote it first")]
    Conflict,
    /// Anything else, in the store's words.
    #[error("{0}")]
    Failed(String),
}

/// How many read-decide-write rounds [`load_or_create`] tries (each lost race costs one).
pub const ROUNDS: usize = 4;

/// The identity kept in `store` (see the module doc). `tls_host` asks for a self-signed
/// callback certificate for that host in it.
pub async fn load_or_create(
    store: &impl IdentityStore,
    tls_host: Option<&str>,
) -> Result<RunnerIdentity, IdentityError> {
    let failed = |action| {
        move |e: StoreError| IdentityError::Store {
            action,
            error: e.to_string(),
        }
    };
    for _ in 0..ROUNDS {
        let found = store.read().await.map_err(failed("read"))?;
        let stored = found.as_ref().map(|f| Stored {
            data: &f.data,
            rotate: f.rotate,
        });
        let written = match plan(stored, tls_host)? {
            Plan::Use(identity) => {
                tracing::info!(key_id = identity.keys().key_id(), "runner identity loaded");
                return Ok(identity);
            }
            Plan::Create(identity) => store.create(identity.to_data()).await,
            Plan::Replace { identity, why } => {
                tracing::warn!(
                    why,
                    "replacing the runner identity: runners of earlier keys will be refused"
                );
                let version = found.map(|f| f.version);
                match version {
                    Some(version) => store.replace(version, identity.to_data()).await,
                    None => store.create(identity.to_data()).await,
                }
            }
        };
        match written {
            // Read back: what is stored is what every replica uses.
            Ok(()) => {}
            Err(StoreError::Conflict) => {
                tracing::info!("runner identity written by another replica; reading it");
            }
            Err(e) => return Err(failed("write")(e)),
        }
    }
    Err(IdentityError::StillChanging(ROUNDS))
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
