//! The broker facade the node calls: plan a workload over the catalog, rent through the fallback
//! ladder, and account for instances that stop; plus a cost snapshot for metrics.
//!
//! Not for Kubernetes concerns (bindings, events, finalizers): the node maps those onto this.

use chrono::{DateTime, Utc};
use neocloud_core::{Attempt, OfferQuery, WorkloadSpec};
use tracing::Instrument as _;

use crate::catalog::CatalogView;
use crate::cost::BindingCost;
use crate::error::BrokerError;
use crate::planner::{Plan, PlanInput, Planner};
use crate::record::AttemptRecorder;
use crate::rent::{RentRequest, Rental, Renter};

/// Planner and renter together.
#[derive(Debug, Clone)]
pub struct Broker {
    /// The planner and its policies.
    pub planner: Planner,
    /// The renter, with the catalog, fallback policy, budget and ledger.
    pub renter: Renter,
}

/// One workload to place.
#[derive(Debug, Clone)]
pub struct Placement<'a> {
    /// The binding key (namespace/name).
    pub binding: &'a str,
    /// The deterministic external name.
    pub external_name: &'a str,
    /// The workload.
    pub workload: &'a WorkloadSpec,
    /// The environment with every reference resolved.
    pub env: &'a [(String, String)],
    /// Attempts from earlier rounds.
    pub history: &'a [Attempt],
    /// How the node's runner starts on the instance (see `CreateRequest::boot`).
    pub boot: Option<&'a neocloud_providers::Boot>,
    /// The login for the image's registry (see `CreateRequest::registry_login`).
    pub registry_login: Option<&'a neocloud_core::RegistryCredential>,
}

/// Cost figures for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct CostSnapshot {
    /// Burn rate of running instances, USD per hour.
    pub burn_usd_per_hour: f64,
    /// Budget reserved for rentals in flight, USD per hour.
    pub in_flight_usd_per_hour: f64,
    /// The cluster cap, if any.
    pub cap_usd_per_hour: Option<f64>,
    /// Per binding.
    pub bindings: Vec<BindingCost>,
}

impl Broker {
    /// Offers for a workload and the plan over them (no rental). Catalog errors are returned
    /// with the view so the caller can report them.
    pub async fn plan(&self, p: &Placement<'_>) -> Result<(Plan, CatalogView), BrokerError> {
        let catalog = &self.renter.catalog;
        let view = catalog
            .offers(&OfferQuery::for_workload(p.workload), &p.workload.providers)
            .await;
        let enabled = catalog.provider_ids();
        let input = PlanInput {
            workload: p.workload,
            offers: &view.offers,
            attempts: p.history,
            enabled: &enabled,
            skipped: &[],
            now: Utc::now(),
        };
        let plan = self.planner.plan(&input)?;
        Ok((plan, view))
    }

    /// Plans and rents. An empty plan is [`BrokerError::NoCandidates`] with its explanation.
    pub async fn place(
        &self,
        p: &Placement<'_>,
        recorder: &dyn AttemptRecorder,
    ) -> Result<(Rental, Plan), BrokerError> {
        // Spans of the placement's trace (exported by the node when it exports traces).
        let planning = tracing::info_span!(target: "neocloud::trace", "plan", candidates = tracing::field::Empty);
        let (plan, _) = self.plan(p).instrument(planning.clone()).await?;
        planning.record("candidates", plan.candidates.len());
        if plan.candidates.is_empty() {
            return Err(BrokerError::NoCandidates {
                explanation: plan.explanation,
            });
        }
        let req = RentRequest {
            binding: p.binding,
            external_name: p.external_name,
            workload: p.workload,
            env: p.env,
            plan: &plan,
            history: p.history,
            boot: p.boot,
            registry_login: p.registry_login,
        };
        let renting = tracing::info_span!(target: "neocloud::trace", "rent");
        let rental = self.renter.rent(&req, recorder).instrument(renting).await?;
        Ok((rental, plan))
    }

    /// A binding's instance is gone (deleted, terminated, preempted, lost) at `at`: its budget is
    /// released and its cost stops accruing.
    pub fn instance_stopped(&self, binding: &str, at: DateTime<Utc>) {
        self.renter.budget.release(binding);
        self.renter.ledger.stop(binding, at);
    }

    /// The binding is finalized: its cost is no longer reported.
    pub fn binding_finalized(&self, binding: &str) {
        self.renter.budget.release(binding);
        self.renter.ledger.forget(binding);
    }

    /// Cost figures at `now`.
    pub fn costs(&self, now: DateTime<Utc>) -> CostSnapshot {
        self.renter.costs(now)
    }
}
