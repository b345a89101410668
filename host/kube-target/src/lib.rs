//! The `kube` provider: other Kubernetes clusters as a burst target (an NVKE workload cluster, a
//! partner's cluster, a second region of one's own), behind the same `Provider` trait as the
//! clouds, so one fallback ladder and one policy can choose between clusters and clouds.
//!
//! - [`config`]: how a remote cluster is described (kubeconfig, namespace, chargeback prices);
//! - [`kubeconfig`]: what a remote cluster's kubeconfig may contain (inline material only);
//! - [`capacity`]: free GPUs per node from the remote Nodes and Pods;
//! - [`offers`]: those GPUs as priced offers;
//! - [`pod`]: the remote Pod and Secret of a rental, and how a remote Pod reads as an instance;
//! - [`target`]: the provider itself, with the watches that keep its offers current;
//! - `session`: `kubectl exec` and `port-forward` of a remote Pod, relayed as runner frames;
//! - [`nvke`]: discovery of the workload clusters an NVKE management plane provisions.
//!
//! Not for the node's own cluster.

pub mod capacity;
pub mod config;
pub mod kubeconfig;
pub mod nvke;
pub mod offers;
pub mod pod;
mod session;
pub mod target;

pub use config::{ConfigError, KubeconfigSource, RemoteCluster};
pub use nvke::{NvkeDiscovery, discover};
pub use target::{KubeTarget, client_from_kubeconfig};
