//! Egress: the in-cluster destinations a workload named (its Pod's `cloud.aibrix.ai/egress`),
//! which the runner serves on the machine's loopback and carries back through the node.
//!
//! The exchange, per connection the workload opens to `127.0.0.1:{port}`: the runner opens
//! `GET /v1/egress/{index}` (Bearer, `Connection: Upgrade`, `Upgrade:`
//! [`SESSION_UPGRADE`](crate::session::SESSION_UPGRADE)), `index` being the destination's place
//! in [`crate::Workload::egress`]. The node refuses an index its Pod did not name (404) before
//! anything is dialled; otherwise it answers 101, dials the destination from inside the cluster
//! and both ends speak `Data`/`DataEnd` [`Frame`](crate::session::Frame)s; a destination that
//! cannot be reached is one `Error` frame.
//!
//! Opt-in both ways, as probes are: a runner that serves egress asks for it with
//! [`WORKLOAD_EGRESS_QUERY`] (an older runner refuses a field it does not know, and is given
//! none).
//!
//! Not behaviour: the runner's `egress` module listens, the node's callback dials.

use serde::{Deserialize, Serialize};

/// The query a runner that serves egress adds to `GET /v1/workload`, so the node includes
/// [`crate::Workload::egress`].
pub const WORKLOAD_EGRESS_QUERY: &str = "egress=serve";

/// The cluster's DNS domain the runner's hosts entries assume.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// One in-cluster destination: a Service's port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressTarget {
    /// The Service's name.
    pub service: String,
    /// Its namespace.
    pub namespace: String,
    /// The Service's port (`spec.ports[].port`).
    pub port: u16,
}

impl EgressTarget {
    /// The names the workload may use for it, longest first: `svc.ns.svc.cluster.local`,
    /// `svc.ns.svc`, `svc.ns`.
    pub fn host_names(&self) -> [String; 3] {
        let short = format!("{}.{}", self.service, self.namespace);
        [
            format!("{short}.svc.{CLUSTER_DOMAIN}"),
            format!("{short}.svc"),
            short,
        ]
    }

    /// The route the runner opens for the destination at `index`.
    pub fn path(index: usize) -> String {
        format!("v1/egress/{index}")
    }
}

impl std::fmt::Display for EgressTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}:{}", self.service, self.namespace, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_has_the_three_names_cluster_dns_gives_a_service() {
        let t = EgressTarget {
            service: "registry".into(),
            namespace: "ml".into(),
            port: 8080,
        };
        assert_eq!(
            t.host_names(),
            [
                "registry.ml.svc.cluster.local",
                "registry.ml.svc",
                "registry.ml"
            ]
        );
        assert_eq!(t.to_string(), "registry.ml:8080");
        assert_eq!(EgressTarget::path(3), "v1/egress/3");
    }
}
