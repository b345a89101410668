//! Burst Pods on the cluster network: a relay Pod per burst Pod runs on a real node of the
//! cluster, listens on the burst Pod's TCP `containerPort`s at its own Pod IP (which the node
//! reports as the burst Pod's `podIP`), and carries each accepted connection to the node's
//! kubelet API (`GET /relay/{uid}/{port}`, upgraded), which opens a port-forward session to the
//! workload's runner (or remote cluster) and splices the two.
//!
//! - [`RelayTable`]: what the node grants each relay (the burst Pod and its ports) and the
//!   digest of its token; a relay reaches only its own Pod's declared ports.
//! - [`client`]: the relay process (`neocloud-node relay`): listeners, the TLS dial to the node
//!   with the node's certificate pinned, the upgrade, the copy.
//!
//! - `route`: the kubelet API's route that takes a relay's connections.
//!
//! Not the relay Pod's manifest or its lifecycle: the node's reconciler owns those.

pub mod client;
pub(crate) mod route;

use std::collections::{BTreeSet, HashMap};

use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::PodRef;

/// The `Upgrade` token of a relay connection.
pub const RELAY_UPGRADE: &str = "neocloud-relay/1";

/// The path prefix of the relay route: `/relay/{uid}/{port}`.
pub const RELAY_PATH: &str = "/relay/";

/// Most ports one relay may carry (a Pod rarely declares more than a handful).
pub const MAX_PORTS: usize = 64;

/// What a relay may reach: one burst Pod's declared TCP ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayGrant {
    /// The burst Pod.
    pub pod: PodRef,
    /// Its TCP `containerPort`s.
    pub ports: BTreeSet<u16>,
}

/// Why a relay connection is refused. Messages never contain a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayRefusal {
    /// No relay is registered for the uid, or its token is another.
    #[error("the relay token is not valid for pod uid {uid}")]
    Unauthorized {
        /// The burst Pod's uid the relay named.
        uid: String,
    },
    /// The port is not one the Pod declares.
    #[error("port {port} is not a TCP containerPort of pod {pod} (its ports: {ports})")]
    PortNotDeclared {
        /// The port asked for.
        port: u16,
        /// The burst Pod.
        pod: PodRef,
        /// Its declared ports, comma-separated.
        ports: String,
    },
}

impl RelayRefusal {
    /// The HTTP status the refusal is answered with.
    pub fn status(&self) -> axum::http::StatusCode {
        match self {
            Self::Unauthorized { .. } => axum::http::StatusCode::UNAUTHORIZED,
            Self::PortNotDeclared { .. } => axum::http::StatusCode::FORBIDDEN,
        }
    }
}

struct Entry {
    digest: [u8; 32],
    grant: RelayGrant,
}

/// The relays the node serves, by their burst Pod's uid. Shared by the reconciler (which
/// registers each relay it makes or finds) and the kubelet API (which admits connections).
#[derive(Default)]
pub struct RelayTable(RwLock<HashMap<String, Entry>>);

impl std::fmt::Debug for RelayTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayTable")
            .field("relays", &self.0.read().len())
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl RelayTable {
    /// Registers (or replaces) the relay of `uid`, which authenticates with `token` and may
    /// reach `grant`.
    pub fn set(&self, uid: &str, token: &str, grant: RelayGrant) {
        let entry = Entry {
            digest: digest(token),
            grant,
        };
        self.0.write().insert(uid.to_owned(), entry);
    }

    /// Whether `uid` has a relay registered with exactly `grant`.
    pub fn has(&self, uid: &str, grant: &RelayGrant) -> bool {
        self.0.read().get(uid).is_some_and(|e| &e.grant == grant)
    }

    /// Forgets the relay of `uid`: its connections are refused from now on.
    pub fn remove(&self, uid: &str) {
        self.0.write().remove(uid);
    }

    /// How many relays are registered.
    pub fn len(&self) -> usize {
        self.0.read().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The Pod a relay presenting `token` for `uid` may reach at `port`, or why not. The token
    /// is compared in constant time (as its digest).
    pub fn admit(&self, uid: &str, token: &str, port: u16) -> Result<PodRef, RelayRefusal> {
        let relays = self.0.read();
        let unauthorized = || RelayRefusal::Unauthorized {
            uid: uid.to_owned(),
        };
        let entry = relays.get(uid).ok_or_else(unauthorized)?;
        if !bool::from(entry.digest.ct_eq(&digest(token))) {
            return Err(unauthorized());
        }
        if !entry.grant.ports.contains(&port) {
            let ports = (entry.grant.ports.iter())
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            return Err(RelayRefusal::PortNotDeclared {
                port,
                pod: entry.grant.pod.clone(),
                ports,
            });
        }
        Ok(entry.grant.pod.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> RelayGrant {
        RelayGrant {
            pod: PodRef {
                namespace: "ml".into(),
                name: "vllm-0".into(),
            },
            ports: [8000, 9090].into_iter().collect(),
        }
    }

    #[test]
    fn a_relay_reaches_only_its_own_pods_declared_ports_with_its_own_token() {
        let table = RelayTable::default();
        table.set("uid-a", "token-a", grant());
        assert_eq!(
            table.admit("uid-a", "token-a", 8000).unwrap().name,
            "vllm-0"
        );
        let err = table.admit("uid-a", "token-a", 22).unwrap_err();
        assert_eq!(
            err.to_string(),
            "port 22 is not a TCP containerPort of pod ml/vllm-0 (its ports: 8000, 9090)"
        );
        assert_eq!(err.status(), axum::http::StatusCode::FORBIDDEN);
        // Another relay's token, an unknown uid, and an empty token are all just not valid.
        table.set("uid-b", "token-b", grant());
        for (uid, token) in [("uid-a", "token-b"), ("uid-c", "token-a"), ("uid-a", "")] {
            let err = table.admit(uid, token, 8000).unwrap_err();
            assert_eq!(err, RelayRefusal::Unauthorized { uid: uid.into() });
            assert!(!err.to_string().contains("token-"), "{err}");
        }
        table.remove("uid-a");
        assert!(table.admit("uid-a", "token-a", 8000).is_err());
        assert!(table.has("uid-b", &grant()) && !table.has("uid-a", &grant()));
        assert_eq!(table.len(), 1);
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod relay_tests;
