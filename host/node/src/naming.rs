//! External names: the deterministic name every rental of a Pod carries at the provider
//! (`ncn-<cluster>-<pod uid>`), and the prefix the sweeper owns (`ncn-<cluster>-`).
//!
//! The cluster id may not contain `-`, so one cluster's prefix is never a prefix of another
//! cluster's names: two clusters sharing one cloud account never sweep each other's instances.

use std::fmt;

/// What every external name starts with.
pub const NAME_PREFIX: &str = "ncn-";

/// The longest cluster id (names stay under the providers' 64-character limits).
pub const MAX_CLUSTER_ID_LEN: usize = 16;

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
