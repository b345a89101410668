//! Releasing a binding's instance: delete the instance the binding knows and anything living
//! under its external name on every provider it attempted (an instance rented just before a
//! crash is found that way), and only once every provider confirms them gone, record the end in
//! the binding and drop its finalizer. Nothing here waits: a release not yet confirmed says so
//! and is checked again.

use std::str::FromStr;

use chrono::Utc;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use neocloud_core::ProviderId;
use serde_json::json;

use super::attempts::attempted_providers;
use super::recorder::write_status;
use super::{Error, FINALIZER, Reconciler};
use neocloud_api::{BindingPhase, CloudPodBinding};

/// How a binding ends once its instance is gone.
#[derive(Debug, Clone)]
pub(super) struct Ending {
    /// `Released`, `Failed` or `Succeeded`.
    pub phase: BindingPhase,
    /// The CamelCase reason.
    pub reason: String,
    /// A sentence.
    pub message: String,
}

/// Where a release stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Release {
    /// Every instance is confirmed gone, the end is recorded and the finalizer removed.
    Done,
    /// Instances are still going away (named in the message).
    Waiting(String),
}

impl Reconciler {
    /// Releases `b`'s instances; see the module documentation. The ending is written first
    /// (phase `Releasing`, its reason and message), so that whatever interrupts the release,
    /// the next reconcile carries on with it.
    pub(super) async fn release(
        &self,
        b: &CloudPodBinding,
        ending: &Ending,
    ) -> Result<Release, Error> {
        let mut status = b.status.clone().unwrap_or_default();
        let mut current = b.clone();
        let decided = status.phase == ending.phase
            || (status.phase == BindingPhase::Releasing && status.ending == Some(ending.phase));
        if !decided {
            status.phase = BindingPhase::Releasing;
            status.ending = Some(ending.phase);
            status.reason = Some(ending.reason.clone());
            status.message = Some(ending.message.clone());
            current = write_status(&self.client, b, &status).await?;
        }
        let waiting = self.delete_instances(&current).await?;
        if !waiting.is_empty() {
            tracing::debug!(binding = %binding_key(b), waiting = %waiting.join("; "), "release not confirmed yet");
            return Ok(Release::Waiting(waiting.join("; ")));
        }
        if let Some(cost) = self.stop_spending(b) {
            status.cost_accrued_usd = cost;
        }
        if status.phase != ending.phase || status.reason.as_deref() != Some(&ending.reason) {
            status.phase = ending.phase;
            status.ending = None;
            status.reason = Some(ending.reason.clone());
            status.message = Some(ending.message.clone());
            current = write_status(&self.client, &current, &status).await?;
        }
        self.drop_finalizer(&current).await?;
        Ok(Release::Done)
    }

    /// Releases the instances of a binding about to be removed (its Pod is being deleted or is
    /// gone): nothing is written to it, since the Pod's deletion (or absence) is what the next
    /// reconcile starts from if this one is interrupted; once every provider confirms the
    /// instances gone, the Pod's receipt is written and the finalizer is dropped.
    pub(super) async fn release_for_removal(&self, b: &CloudPodBinding) -> Result<Release, Error> {
        let waiting = self.delete_instances(b).await?;
        if !waiting.is_empty() {
            return Ok(Release::Waiting(waiting.join("; ")));
        }
        // The ledger's figure, or what the binding says if this leader never counted it (a
        // Pod that finished before it took over): whichever knows more.
        let recorded = b.status.as_ref().map_or(0.0, |s| s.cost_usd_at(Utc::now()));
        let usd = self.stop_spending(b).unwrap_or(0.0).max(recorded);
        self.keep_receipt(b, usd).await?;
        self.drop_finalizer(b).await?;
        Ok(Release::Done)
    }

    /// The binding's instances are gone: its budget is freed and its cost stops accruing and
    /// is no longer reported. Returns what it cost.
    fn stop_spending(&self, b: &CloudPodBinding) -> Option<f64> {
        let key = binding_key(b);
        self.renter.budget.release(&key);
        self.renter.ledger.stop(&key, Utc::now());
        let cost = self.renter.ledger.accrued_usd(&key, Utc::now());
        self.renter.ledger.forget(&key);
        if let Some(cost) = cost {
            self.finish_spend(b, cost);
        }
        cost
    }

    /// Deletes the instance `b` knows and anything live under its external name on every
    /// provider it attempted, and returns what is not confirmed gone yet (empty: all gone).
    pub(super) async fn delete_instances(&self, b: &CloudPodBinding) -> Result<Vec<String>, Error> {
        let status = b.status.clone().unwrap_or_default();
        let name = &b.spec.external_name;
        let mut providers = attempted_providers(&status);
        let known = status
            .provider
            .as_deref()
            .and_then(|p| ProviderId::from_str(p).ok())
            .zip(status.instance_id.clone());
        if let Some((p, _)) = &known
            && !providers.contains(p)
        {
            providers.push(*p);
        }
        let mut waiting = Vec::new();
        for id in providers {
            if let Some((left, why)) = self.renter.catalog.backoff().remaining(id) {
                waiting.push(format!(
                    "{id} is not called for {:.1}s more ({why})",
                    left.as_secs_f64()
                ));
                continue;
            }
            let Some(provider) = self.renter.catalog.provider(id) else {
                waiting.push(format!(
                    "provider {id} is not enabled on this node, so {name} cannot be released there"
                ));
                continue;
            };
            if let Some((_, instance)) = known.as_ref().filter(|(p, _)| *p == id) {
                provider.delete(instance).await?;
                if let Some(i) = provider.get(instance).await?
                    && !i.phase.is_terminal()
                {
                    waiting.push(format!("{id} instance {instance} is {}", i.phase));
                }
            }
            if let Some(found) = provider.find_by_name(name).await?
                && !found.phase.is_terminal()
            {
                provider.delete(&found.id).await?;
                waiting.push(format!("{id} instance {} is {}", found.id, found.phase));
            }
        }
        Ok(waiting)
    }

    /// Removes our finalizer, guarded by the resourceVersion read.
    pub(super) async fn drop_finalizer(&self, b: &CloudPodBinding) -> Result<(), Error> {
        if !b.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let rest: Vec<&String> = b.finalizers().iter().filter(|f| *f != FINALIZER).collect();
        let api: Api<CloudPodBinding> =
            Api::namespaced(self.client.clone(), &b.namespace().unwrap_or_default());
        let patch = json!({"metadata": {"finalizers": rest,
            "resourceVersion": b.resource_version()}});
        match api
            .patch(
                &b.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The broker's key for a binding: `namespace/name`.
pub(super) fn binding_key(b: &CloudPodBinding) -> String {
    format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any())
}
