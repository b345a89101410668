//! External names: the deterministic name every rental of a Pod carries at the provider
//! (`ncn-<cluster>-<pod uid>`), and the prefix the sweeper owns (`ncn-<cluster>-`).
//!
//! The cluster id may not contain `-`, so one cluster's prefix is never a prefix of another
//! cluster's names: two clusters sharing one cloud account never sweep each other's instances.
//! When the configuration sets none, the id is derived from the UID of the cluster's
//! `kube-system` namespace ([`ClusterId::derived_from_uid`]), so two default installs differ.
//!
//! Not here: reading that UID from the API server (`run`).

use std::fmt;

use sha2::{Digest, Sha256};

/// What every external name starts with.
pub const NAME_PREFIX: &str = "ncn-";

/// The longest cluster id (names stay under the providers' 64-character limits).
pub const MAX_CLUSTER_ID_LEN: usize = 16;

/// The length of a derived cluster id: 12 base32 characters, 60 bits of a SHA-256.
pub const DERIVED_CLUSTER_ID_LEN: usize = 12;

/// RFC 4648 base32, lower-case: letters and the digits 2-7, all valid in a cluster id.
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// A validated cluster identity: 1 to 16 characters of `[a-z0-9]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterId(String);

/// Why a cluster id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("clusterId: {value:?} {reason}")]
pub struct BadClusterId {
    /// The refused value.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl ClusterId {
    /// Validates `value`.
    pub fn new(value: &str) -> Result<ClusterId, BadClusterId> {
        let bad = |reason| BadClusterId {
            value: value.to_owned(),
            reason,
        };
        if value.is_empty() {
            return Err(bad(
                "is empty; give each cluster a short identity such as prod1",
            ));
        }
        if value.len() > MAX_CLUSTER_ID_LEN {
            return Err(bad("is longer than 16 characters"));
        }
        if !value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(bad(
                "may hold only lower-case letters and digits (no '-', so no cluster's prefix is another's)",
            ));
        }
        Ok(ClusterId(value.to_owned()))
    }

    /// The id of the cluster whose `kube-system` namespace has UID `uid`: the first 12
    /// characters of the lower-case RFC 4648 base32 of SHA-256 of the UID (60 bits), as
    /// `printf %s UID | sha256sum | xxd -r -p | base32 | tr A-Z a-z | cut -c1-12` prints. The same
    /// UID always gives the same id; the namespace lives as long as the cluster, so the id does.
    ///
    /// Two clusters get the same id with probability 2^-60 per pair: with 1,000 clusters
    /// sharing one cloud account, about 4e-13 that any two collide.
    pub fn derived_from_uid(uid: &str) -> ClusterId {
        let digest = Sha256::digest(uid.as_bytes());
        let mut bits = [0u8; 8];
        bits.copy_from_slice(&digest[..8]);
        let bits = u64::from_be_bytes(bits);
        let id = (0..DERIVED_CLUSTER_ID_LEN)
            .map(|i| char::from(BASE32[((bits >> (59 - 5 * i)) & 31) as usize]))
            .collect();
        ClusterId(id)
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The prefix of every external name this cluster rents under: `ncn-<cluster>-`.
    pub fn prefix(&self) -> String {
        format!("{NAME_PREFIX}{}-", self.0)
    }

    /// The external name of the Pod with this UID: `ncn-<cluster>-<uid>`.
    pub fn external_name(&self, pod_uid: &str) -> String {
        format!("{}{pod_uid}", self.prefix())
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_prefix_and_the_pod_uid() {
        let c = ClusterId::new("prod1").unwrap();
        assert_eq!(c.prefix(), "ncn-prod1-");
        let name = c.external_name("0b5c2a8e-6f1d-4c55-9a47-6f1d2c3b4a5e");
        assert_eq!(name, "ncn-prod1-0b5c2a8e-6f1d-4c55-9a47-6f1d2c3b4a5e");
        assert!(name.len() <= 64);
    }

    #[test]
    fn no_cluster_prefix_is_a_prefix_of_another_clusters_names() {
        let a = ClusterId::new("a").unwrap();
        let ab = ClusterId::new("ab").unwrap();
        assert!(!ab.external_name("uid").starts_with(&a.prefix()));
        assert!(!a.external_name("uid").starts_with(&ab.prefix()));
    }

    #[test]
    fn a_derived_id_is_stable_valid_and_differs_between_uids() {
        let uid = "6f1d2c3b-0b5c-4c55-9a47-2a8e4a5e6f1d";
        let id = ClusterId::derived_from_uid(uid);
        assert_eq!(id, ClusterId::derived_from_uid(uid));
        assert_eq!(id.as_str().len(), DERIVED_CLUSTER_ID_LEN);
        assert_eq!(ClusterId::new(id.as_str()), Ok(id.clone()));
        assert!(id.external_name(uid).len() <= 64);
        let mut seen = std::collections::HashSet::new();
        for n in 0..10_000 {
            let other = ClusterId::derived_from_uid(&format!("6f1d2c3b-0b5c-4c55-9a47-{n:012}"));
            assert!(ClusterId::new(other.as_str()).is_ok(), "{other}");
            assert!(seen.insert(other), "two uids gave one id");
        }
        assert!(!seen.contains(&id));
    }

    #[test]
    fn a_derived_id_is_pinned_for_a_known_uid() {
        // Changing the derivation renames every instance of every default install, whose
        // sweepers would then no longer see them: this value must never change.
        let id = ClusterId::derived_from_uid("6f1d2c3b-0b5c-4c55-9a47-2a8e4a5e6f1d");
        assert_eq!(id.as_str(), "f234npyxhscc");
    }

    #[test]
    fn bad_cluster_ids_are_refused_by_value() {
        for (value, reason) in [
            ("", "is empty"),
            ("prod-1", "lower-case letters and digits"),
            ("Prod1", "lower-case letters and digits"),
            ("abcdefghijklmnopq", "longer than 16"),
        ] {
            let e = ClusterId::new(value).unwrap_err().to_string();
            assert!(e.starts_with(&format!("clusterId: {value:?}")), "{e}");
            assert!(e.contains(reason), "{e}");
        }
    }
}
