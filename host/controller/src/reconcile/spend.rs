//! Who each binding's cost is charged to, for `neocloud_spend_usd_total`: its namespace, the
//! team label of its Pod (from the cache), its provider and GPU. Fed every few seconds from the
//! cost ledger and once more, with the final figure, when the binding's instances are gone.
//!
//! Not the ledger itself (`neocloud_broker::CostLedger`) nor the counter (`neocloud_telemetry::metrics`).

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use neocloud_broker::BindingCost;

use super::Reconciler;
use neocloud_api::CloudPodBinding;
use neocloud_telemetry::metrics::BindingSpend;

impl Reconciler {
    /// Counts what each binding of `costs` accrued since the last call. A binding not in the
    /// cache yet is counted at the next call.
    pub fn observe_spend(&self, costs: &[BindingCost]) {
        let Some(caches) = self.caches() else {
            return;
        };
        for cost in costs {
            let Some((namespace, name)) = cost.binding.split_once('/') else {
                continue;
            };
            let Some(b) = caches
                .bindings
                .get(&ObjectRef::<CloudPodBinding>::new(name).within(namespace))
            else {
                continue;
            };
            let pod = caches
                .pods
                .get(&ObjectRef::new(&b.spec.pod_name).within(namespace));
            let team = pod.as_ref().and_then(|p| self.team_of(p.labels()));
            self.charge(&b, cost.accrued_usd, team, false);
        }
    }

    /// Counts a binding's final cost; its instances are gone.
    pub(super) fn finish_spend(&self, b: &CloudPodBinding, accrued_usd: f64) {
        self.charge(b, accrued_usd, None, true);
    }

    fn team_of<'a>(
        &self,
        labels: &'a std::collections::BTreeMap<String, String>,
    ) -> Option<&'a str> {
        labels
            .get(self.cfg.team_label.as_deref()?)
            .map(String::as_str)
    }

    fn charge(&self, b: &CloudPodBinding, accrued_usd: f64, team: Option<&str>, last: bool) {
        let key = super::release::binding_key(b);
        let status = b.status.as_ref();
        let spend = BindingSpend {
            binding: &key,
            accrued_usd,
            namespace: b.metadata.namespace.as_deref().unwrap_or_default(),
            team,
            provider: status
                .and_then(|s| s.provider.as_deref())
                .unwrap_or_default(),
            gpu: status.and_then(|s| s.gpu.as_deref()).unwrap_or_default(),
        };
        if last {
            self.metrics.finish_spend(&spend);
        } else {
            self.metrics.observe_spend(&spend);
        }
    }
}
