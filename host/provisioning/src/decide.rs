//! Deciding one request: its parameters and pod sets checked, each PodTemplate planned as the
//! Pod controller would plan such a Pod (translation, annotations, BurstPolicy, CEL and Wasm
//! constraints, price ceilings) against the current offers, one provider and region found for
//! every Pod, and the budget of those Pods reserved together. Nothing is rented here.

use std::time::Instant;

use chrono::Utc;
use k8s_openapi::api::core::v1::{Pod, PodTemplate};
use kube::api::ObjectMeta;
use kube::{Api, ResourceExt};
use neocloud_broker::{Plan, PlanInput, Planner};
use neocloud_core::{OfferQuery, WorkloadSpec};

use super::ahead::AheadSet;
use super::controller::Provisioner;
use super::params::{self, Parameters};
use super::regions::{Place, PlannedSet, places};
use super::types::ProvisioningRequest;
use neocloud_controller::holds::HeldPlace;

/// What the node says about a request.
#[derive(Debug)]
pub enum Outcome {
    /// The budget of every Pod is held in `place` until `until`, and with `machines` (rented
    /// ahead, see `ahead`) a machine for each Pod is rented and its runner up.
    Held {
        /// Where.
        place: Place,
        /// The booking's end.
        until: chrono::DateTime<Utc>,
        /// How many machines were rented ahead (0: the Pods rent when they come).
        machines: usize,
    },
    /// A capacity check: it would fit in `place`; nothing is held.
    Checked {
        /// Where.
        place: Place,
    },
    /// It cannot be rented now.
    Failed {
        /// CamelCase reason.
        reason: String,
        /// Why, per constraint.
        message: String,
    },
}

fn failed(reason: &str, message: impl Into<String>) -> Outcome {
    Outcome::Failed {
        reason: reason.to_owned(),
        message: message.into(),
    }
}

/// One pod set ready to plan.
struct Ready {
    template: String,
    count: u32,
    pod: Pod,
    workload: WorkloadSpec,
    planner: Planner,
}

impl Provisioner {
    /// Decides `req`, holding its budget when it fits (and it is not a capacity check).
    /// Errors are the API server's, to retry; every answer about the request is an [`Outcome`].
    pub(super) async fn decide(&self, req: &ProvisioningRequest) -> kube::Result<Outcome> {
        let params = match params::parse(&req.spec.parameters) {
            Ok(p) => p,
            Err(e) => return Ok(failed("InvalidParameters", e)),
        };
        let ready = match self.pod_sets(req, &params).await? {
            Ok(ready) => ready,
            Err(outcome) => return Ok(outcome),
        };
        let mut plans = Vec::with_capacity(ready.len());
        for set in &ready {
            match self.plan(set).await {
                Ok(plan) => plans.push(plan),
                Err(e) => {
                    return Ok(failed(
                        "PolicyError",
                        format!("PodTemplate {}: {e}", set.template),
                    ));
                }
            }
        }
        let sets: Vec<PlannedSet<'_>> = ready
            .iter()
            .zip(&plans)
            .map(|(s, p)| PlannedSet {
                noun: "PodTemplate",
                template: &s.template,
                count: s.count,
                candidates: &p.candidates,
                explanation: &p.explanation,
            })
            .collect();
        let found = match places(&sets) {
            Ok(found) => found,
            Err(no) => return Ok(failed(no.reason(), no.message())),
        };
        let ahead: Vec<AheadSet> = (ready.into_iter())
            .map(|s| AheadSet {
                pod: s.pod,
                count: s.count,
                workload: s.workload,
                planner: s.planner,
            })
            .collect();
        let outcome = self.hold_first(req, &params, found);
        let Outcome::Held { place, until, .. } = outcome else {
            return Ok(outcome);
        };
        if !self.rents_ahead(&ahead, &place) {
            return Ok(Outcome::Held {
                place,
                until,
                machines: 0,
            });
        }
        // Boxed: renting every machine is a large future.
        match Box::pin(self.rent_ahead(req, &ahead, &place)).await? {
            Ok(machines) => Ok(Outcome::Held {
                place,
                until,
                machines: machines.len(),
            }),
            Err(failed) => {
                self.holds
                    .release_uid(&super::key(req), &req.uid().unwrap_or_default());
                Ok(failed)
            }
        }
    }

    /// Each pod set's template read and planned as a Pod; a bad request or template is an
    /// outcome.
    async fn pod_sets(
        &self,
        req: &ProvisioningRequest,
        params: &Parameters,
    ) -> kube::Result<Result<Vec<Ready>, Outcome>> {
        let ns = req.namespace().unwrap_or_default();
        if req.spec.pod_sets.is_empty() {
            return Ok(Err(failed("InvalidRequest", "spec.podSets is empty")));
        }
        let templates: Api<PodTemplate> = Api::namespaced(self.client.clone(), &ns);
        let mut ready = Vec::new();
        for (i, set) in req.spec.pod_sets.iter().enumerate() {
            let count = match u32::try_from(set.count) {
                Ok(n) if n > 0 => n,
                _ => {
                    let m = format!("spec.podSets[{i}].count: {} must be at least 1", set.count);
                    return Ok(Err(failed("InvalidRequest", m)));
                }
            };
            let name = &set.pod_template_ref.name;
            let Some(template) = templates.get_opt(name).await? else {
                let m = format!(
                    "spec.podSets[{i}].podTemplateRef: PodTemplate {ns}/{name} does not exist"
                );
                return Ok(Err(failed("PodTemplateNotFound", m)));
            };
            let pod = pod_of(&ns, name, template);
            let (workload, mut planner) = match self.reconciler.plan_pod(&pod) {
                Ok(ok) => ok,
                Err((reason, why)) => {
                    return Ok(Err(failed(&reason, format!("PodTemplate {name}: {why}"))));
                }
            };
            if let Some(max) = params.max_price_per_hour {
                let now = planner.policy_max_price_per_hour.unwrap_or(f64::INFINITY);
                planner.policy_max_price_per_hour = Some(now.min(max));
            }
            // Every eligible offer, not the few a single Pod tries: a region may need many.
            planner.max_candidates = usize::MAX;
            ready.push(Ready {
                template: name.clone(),
                count,
                pod,
                workload,
                planner,
            });
        }
        Ok(Ok(ready))
    }

    /// The plan of one pod set over the current offers.
    async fn plan(&self, set: &Ready) -> Result<Plan, neocloud_broker::PolicyError> {
        let catalog = &self.reconciler.renter().catalog;
        let query = OfferQuery::for_workload(&set.workload);
        let view = catalog.offers(&query, &set.workload.providers).await;
        let enabled = catalog.provider_ids();
        set.planner.plan(&PlanInput {
            workload: &set.workload,
            offers: &view.offers,
            attempts: &[],
            enabled: &enabled,
            skipped: &[],
            now: Utc::now(),
        })
    }

    /// The first place whose Pods the budget pays for, held (or, for a capacity check, only
    /// checked); or why none is.
    fn hold_first(
        &self,
        req: &ProvisioningRequest,
        params: &Parameters,
        found: Vec<Place>,
    ) -> Outcome {
        let mut refused = None;
        for place in found {
            match place.reserve(&self.reconciler.renter().budget) {
                Ok(reservations) if params.check_capacity => {
                    drop(reservations);
                    return Outcome::Checked { place };
                }
                Ok(reservations) => {
                    let life = params
                        .valid_until
                        .map_or(self.cfg.booking, |v| v.min(self.cfg.booking));
                    let held = HeldPlace {
                        provider: place.provider,
                        region: place.region.clone(),
                    };
                    let uid = req.uid().unwrap_or_default();
                    let key = super::key(req);
                    self.holds
                        .hold(&key, &uid, held, reservations, Instant::now() + life);
                    let until = Utc::now() + chrono::Duration::from_std(life).unwrap_or_default();
                    return Outcome::Held {
                        place,
                        until,
                        machines: 0,
                    };
                }
                Err(over) => {
                    refused.get_or_insert((over, place));
                }
            }
        }
        let Some((over, place)) = refused else {
            return failed("NoOffer", "no place was planned");
        };
        let message = format!(
            "over budget: {over}, for {} pods on {}",
            place.picks.len(),
            place.describe()
        );
        failed("OverBudget", message)
    }
}

/// The Pod a template stands for, in the request's namespace, named after the template.
fn pod_of(ns: &str, name: &str, template: PodTemplate) -> Pod {
    let spec = template.template.unwrap_or_default();
    let meta = spec.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.to_owned()),
            labels: meta.labels,
            annotations: meta.annotations,
            ..ObjectMeta::default()
        },
        spec: spec.spec,
        status: None,
    }
}
