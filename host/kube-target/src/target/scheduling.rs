//! The scheduling wait of a create: a Pod just created on a remote cluster is watched for a few
//! seconds until the remote scheduler binds it or refuses it, so that a cluster whose free GPUs
//! turned out not to be free fails the rental for capacity at once (and the ladder moves on)
//! instead of leaving a Pod pending there.
//!
//! Not the create itself (the `Provider` impl) and not how a Pod's state is read
//! (`crate::pod::instance_state`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use neocloud_core::{FailureClass, InstanceState};
use neocloud_providers::{Operation, ProviderError};

use super::watch::Cluster;
use super::{KubeTarget, error};
use crate::pod::{instance_state, secret_name};

/// How long a create waits for the remote scheduler to bind or refuse the new Pod.
const SCHEDULING_WAIT: Duration = Duration::from_secs(5);

impl KubeTarget {
    /// Waits up to [`SCHEDULING_WAIT`] for the remote scheduler's decision on a Pod just
    /// created. Bound, or no decision yet: the instance as it is. Unschedulable (the nodes the
    /// watches showed free were not, or refuse it for another reason): the Pod and its Secret
    /// are deleted and the rental fails for capacity, so the ladder moves on.
    pub(super) async fn scheduled(
        &self,
        cluster: &Cluster,
        mut pod: Pod,
        subject: &str,
    ) -> Result<InstanceState, ProviderError> {
        let op = Operation::Create;
        let name = cluster.config.name.as_str();
        let started = tokio::time::Instant::now();
        loop {
            let state = instance_state(name, &pod);
            if state.refused_capacity() {
                let pods = cluster.pods();
                let _ = pods
                    .delete(subject, &DeleteParams::default().grace_period(0))
                    .await;
                let _ = cluster
                    .secrets()
                    .delete(&secret_name(subject), &DeleteParams::default())
                    .await;
                return Err(error(
                    op,
                    FailureClass::Capacity,
                    format!(
                        "remote cluster {name} cannot schedule the Pod: {}",
                        state.message.as_deref().unwrap_or("unschedulable")
                    ),
                )
                .with_subject(subject));
            }
            let bound = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some();
            if bound || started.elapsed() >= SCHEDULING_WAIT {
                return Ok(state);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            pod = match cluster.pods().get_opt(subject).await {
                Ok(Some(p)) => p,
                // Gone or unreadable: what was last seen is the answer; `get` tells the rest.
                Ok(None) | Err(_) => return Ok(state),
            };
        }
    }
}
