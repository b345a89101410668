//! The binding controller's reconcile: a binding whose Pod is gone (force-deleted, or replaced
//! by another Pod of the same name) or that is itself being deleted has its instance released,
//! and is then removed. Bindings of live Pods are the Pod controller's.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};

use super::release::{Release, binding_key};
use super::{Error, FINALIZER, Reconciler};
use neocloud_api::CloudPodBinding;

/// Reconciles one of this node's bindings.
pub(super) async fn reconcile(
    b: Arc<CloudPodBinding>,
    r: Arc<Reconciler>,
) -> Result<Action, Error> {
    if !b.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    // A machine rented ahead of its Pod has no Pod: its request decides (see `held`).
    if b.labels().contains_key(crate::holds::HELD_LABEL) {
        return Box::pin(r.reconcile_held(&b)).await;
    }
    // The Pod cache answers for the common case (the Pod lives, and every write to its binding
    // comes here), without waiting for a turn; a release is decided only on what the API
    // server says.
    let ns = b.namespace().unwrap_or_default();
    let being_deleted = b.metadata.deletion_timestamp.is_some();
    if !being_deleted && r.pod_lives(&ns, &b.spec.pod_name, &b.spec.pod_uid).await? {
        return Ok(Action::await_change());
    }
    let _turn = r.turns.wait().await;
    Box::pin(release_if_orphaned(b, r)).await
}

/// Releases the binding's instances and removes it if its Pod is gone or it is being deleted.
async fn release_if_orphaned(b: Arc<CloudPodBinding>, r: Arc<Reconciler>) -> Result<Action, Error> {
    let ns = b.namespace().unwrap_or_default();
    let being_deleted = b.metadata.deletion_timestamp.is_some();
    let pods: Api<Pod> = Api::namespaced(r.client.clone(), &ns);
    let pod = pods.get_opt(&b.spec.pod_name).await?;
    let pod_lives = pod.is_some_and(|p| p.uid().as_deref() == Some(b.spec.pod_uid.as_str()));
    if pod_lives && !being_deleted {
        return Ok(Action::await_change());
    }
    match r.release_for_removal(&b).await? {
        Release::Waiting(why) => {
            tracing::debug!(binding = %binding_key(&b), %why, "release not confirmed yet");
            Ok(Action::requeue(r.cfg.release_poll))
        }
        Release::Done => {
            r.translations.forget(&b.spec.pod_uid);
            if let Some(runners) = &r.cfg.runners {
                runners.forget(&b.spec.pod_uid);
            }
            if b.metadata.deletion_timestamp.is_none() {
                let api: Api<CloudPodBinding> = Api::namespaced(r.client.clone(), &ns);
                match api.delete(&b.name_any(), &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(Action::await_change())
        }
    }
}
