//! Receipts: when a binding goes (its Pod deleted, every instance confirmed gone), what the Pod
//! cost is written as a `CloudPodReceipt` in its namespace, and receipts older than the retention
//! are deleted, so that `cost report` covers Pods that are gone. A receipt that cannot be written
//! for lack of permission or of its CRD is logged and skipped: a Pod's deletion never waits on
//! its bill.
//!
//! Not the spend counter (`spend`), nor the report (the binary's `cli::cost`).

use chrono::{DateTime, Utc};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::{Error, Reconciler};
use neocloud_api::{
    CloudPodBinding, CloudPodReceipt, CloudPodReceiptSpec, RECEIPT_CLUSTER_LABEL, receipt_name,
};

impl Reconciler {
    /// Writes `b`'s receipt, costing `usd`, if receipts are kept and the Pod was ever rented for.
    /// Idempotent: a receipt already there is left as it is.
    pub(super) async fn keep_receipt(&self, b: &CloudPodBinding, usd: f64) -> Result<(), Error> {
        if self.cfg.receipt_retention.is_none() {
            return Ok(());
        }
        let status = b.status.clone().unwrap_or_default();
        if status.provider.is_none() && usd <= 0.0 {
            return Ok(());
        }
        let ns = b.namespace().unwrap_or_default();
        let pod_labels = self
            .caches()
            .and_then(|c| c.pods.get(&ObjectRef::new(&b.spec.pod_name).within(&ns)))
            .filter(|p| p.uid().as_deref() == Some(b.spec.pod_uid.as_str()))
            .map(|p| p.labels().clone())
            .unwrap_or_default();
        let bound_at = b
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(|| Utc::now().to_rfc3339(), |t| t.0.to_string());
        let receipt = CloudPodReceipt {
            metadata: ObjectMeta {
                name: Some(receipt_name(&b.spec.pod_name, &b.spec.pod_uid)),
                namespace: Some(ns.clone()),
                labels: Some(
                    [(
                        RECEIPT_CLUSTER_LABEL.to_owned(),
                        self.cfg.cluster.as_str().to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: CloudPodReceiptSpec {
                pod_name: b.spec.pod_name.clone(),
                pod_uid: b.spec.pod_uid.clone(),
                cluster_id: b.spec.cluster_id.clone(),
                pod_labels,
                provider: status.provider.clone(),
                gpu: status.gpu.clone(),
                instance_id: status.instance_id.clone(),
                bound_at,
                ended_at: Utc::now().to_rfc3339(),
                cost_usd: usd,
            },
        };
        let api: Api<CloudPodReceipt> = Api::namespaced(self.client.clone(), &ns);
        match api.create(&PostParams::default(), &receipt).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                tracing::warn!(
                    binding = %super::release::binding_key(b),
                    usd,
                    error = %s.message,
                    "no CloudPodReceipt kept for this Pod (is the CRD installed and may the node \
                     create receipts?); cost report will not cover it"
                );
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes this cluster's receipts that ended more than the retention ago (in the watched
    /// namespaces, or everywhere); returns how many went.
    pub async fn expire_receipts(&self, now: DateTime<Utc>) -> Result<usize, kube::Error> {
        let Some(retention) = self.cfg.receipt_retention else {
            return Ok(0);
        };
        let cutoff = now - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        let selector = format!("{RECEIPT_CLUSTER_LABEL}={}", self.cfg.cluster.as_str());
        let apis: Vec<Api<CloudPodReceipt>> = match &self.cfg.watch_namespaces {
            Some(namespaces) => namespaces
                .iter()
                .map(|ns| Api::namespaced(self.client.clone(), ns))
                .collect(),
            None => vec![Api::all(self.client.clone())],
        };
        let mut expired = 0;
        for api in apis {
            let list = api.list(&ListParams::default().labels(&selector)).await?;
            for r in list.items {
                let ended = DateTime::parse_from_rfc3339(&r.spec.ended_at)
                    .map(|t| t.with_timezone(&Utc))
                    .ok();
                // One that cannot be read is left alone: it is not known to be old.
                if ended.is_none_or(|t| t >= cutoff) {
                    continue;
                }
                let ns = r.namespace().unwrap_or_default();
                let here: Api<CloudPodReceipt> = Api::namespaced(self.client.clone(), &ns);
                match here.delete(&r.name_any(), &DeleteParams::default()).await {
                    Ok(_) => expired += 1,
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(expired)
    }
}
