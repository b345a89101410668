//! The renter: walks a plan's candidates through the fallback ladder, checking each one's price
//! against fresh data and reserving cluster budget before asking the provider to create the
//! instance under the workload's external name. Every attempt is recorded before the provider
//! is called; an instance whose create outcome is unknown is looked up by name before any
//! further attempt, so a workload never gets two instances.
//!
//! Not for planning (see `planner`) or for the instance's life after renting (the node).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use neocloud_core::{
    Attempt, AttemptOutcome, FailureClass, InstanceState, Offer, OfferQuery, ProviderId,
    WorkloadSpec,
};
use neocloud_providers::{CreateRequest, Provider, ProviderError};
use tokio::time::Instant;

use crate::budget::{BudgetGuard, Reservation};
use crate::catalog::Catalog;
use crate::cost::CostLedger;
use crate::error::BrokerError;
use crate::fallback::{Failure, FallbackContext, FallbackPolicy};
use crate::ladder::{Ladder, LadderLimits, Step};
use crate::planner::{Candidate, Plan};
use crate::price_guard::{self, ConfirmedPrice};

/// Writes attempts durably (the node writes them to the binding status).
#[async_trait]
pub trait AttemptRecorder: Send + Sync {
    /// Records a new or updated attempt (same `number` means update). An error stops renting.
    async fn record(&self, attempt: &Attempt) -> Result<(), String>;
}

/// One workload to rent.
#[derive(Debug, Clone)]
pub struct RentRequest<'a> {
    /// The binding key (namespace/name) for budget and cost.
    pub binding: &'a str,
    /// The deterministic external name.
    pub external_name: &'a str,
    /// The workload.
    pub workload: &'a WorkloadSpec,
    /// The resolved environment.
    pub env: &'a [(String, String)],
    /// The plan to walk.
    pub plan: &'a Plan,
    /// Attempts from earlier rounds (numbering continues after them).
    pub history: &'a [Attempt],
    /// Boot data for VM providers (see `CreateRequest::boot`).
    pub boot: Option<&'a str>,
}

/// A successful rental.
#[derive(Debug, Clone)]
pub struct Rental {
    /// The instance.
    pub instance: InstanceState,
    /// Every attempt, history included.
    pub attempts: Vec<Attempt>,
    /// Whether the instance was found by name rather than created by the last attempt.
    pub adopted: bool,
}

/// The renter and what it guards with.
#[derive(Debug, Clone)]
pub struct Renter {
    /// Providers and fresh offer data.
    pub catalog: Catalog,
    /// The fallback policy.
    pub fallback: Arc<dyn FallbackPolicy>,
    /// Limits no policy can lift.
    pub limits: LadderLimits,
    /// The cluster budget.
    pub budget: Arc<BudgetGuard>,
    /// Cost accounting.
    pub ledger: Arc<CostLedger>,
}

impl Renter {
    /// Rents one of the plan's candidates, or explains why none could be rented.
    pub async fn rent(
        &self,
        req: &RentRequest<'_>,
        recorder: &dyn AttemptRecorder,
    ) -> Result<Rental, BrokerError> {
        let started = Instant::now();
        let providers = req
            .plan
            .candidates
            .iter()
            .map(|c| c.offer.provider)
            .collect();
        let mut ladder = Ladder::new(self.limits, providers);
        let mut attempts = req.history.to_vec();
        let mut unknown = BTreeSet::new();
        let mut step = ladder.start();
        loop {
            let (index, after) = match step {
                Step::Try { index, after } => (index, after),
                Step::GiveUp { reason } => return Err(self.gave_up(req, reason, attempts)),
            };
            tokio::time::sleep(after).await;
            if let Some(instance) = self.recover(&unknown, req).await? {
                return Ok(Rental {
                    instance,
                    attempts,
                    adopted: true,
                });
            }
            ladder.attempted();
            let candidate = &req.plan.candidates[index];
            let failure = match self
                .attempt(req, candidate, &mut attempts, recorder)
                .await?
            {
                Ok(instance) => {
                    return Ok(Rental {
                        instance,
                        attempts,
                        adopted: false,
                    });
                }
                Err(f) => f,
            };
            if failure.class.outcome_unknown() {
                unknown.insert(failure.provider);
            }
            step = self.next_step(req, &mut ladder, &attempts, failure, started);
        }
    }

    /// Asks the fallback policy what to do and lets the ladder bound the answer.
    fn next_step(
        &self,
        req: &RentRequest<'_>,
        ladder: &mut Ladder,
        attempts: &[Attempt],
        failure: Failure,
        started: Instant,
    ) -> Step {
        let retries_of_offer = ladder.retries_of_current();
        let cx = FallbackContext {
            workload: req.workload,
            attempts,
            failure,
            retries_of_offer,
        };
        match self.fallback.next_action(&cx) {
            Ok(action) => ladder.after_failure(&action, started.elapsed()),
            Err(e) => Step::GiveUp {
                reason: format!("fallback {e}"),
            },
        }
    }

    fn gave_up(
        &self,
        req: &RentRequest<'_>,
        reason: String,
        attempts: Vec<Attempt>,
    ) -> BrokerError {
        BrokerError::GaveUp {
            external_name: req.external_name.to_owned(),
            reason,
            attempts,
        }
    }

    /// Looks the external name up on every provider whose create outcome is unknown.
    async fn recover(
        &self,
        unknown: &BTreeSet<ProviderId>,
        req: &RentRequest<'_>,
    ) -> Result<Option<InstanceState>, BrokerError> {
        for id in unknown {
            let Some(provider) = self.catalog.provider(*id) else {
                continue;
            };
            let found = provider.find_by_name(req.external_name).await?;
            if let Some(found) = found.filter(|f| !f.phase.is_terminal()) {
                self.budget
                    .record_existing(req.binding, found.price_per_hour);
                self.ledger
                    .start(req.binding, found.price_per_hour, Utc::now());
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// One attempt: fresh price, budget, record, create. The outer error stops renting; the inner
    /// one is a failure for the ladder.
    async fn attempt(
        &self,
        req: &RentRequest<'_>,
        candidate: &Candidate,
        attempts: &mut Vec<Attempt>,
        recorder: &dyn AttemptRecorder,
    ) -> Result<Result<InstanceState, Failure>, BrokerError> {
        let offer = &candidate.offer;
        let mut attempt = Attempt {
            number: attempts.len() as u32 + 1,
            provider: offer.provider,
            offer_id: offer.id.clone(),
            price_per_hour: offer.rent_price_per_hour(),
            started_at: Utc::now(),
            outcome: AttemptOutcome::InFlight,
        };
        let ready = match self.prepare(req, candidate).await {
            Ok(ready) => ready,
            Err(r) => {
                let failure = Failure {
                    class: r.class,
                    provider: offer.provider,
                    retry_after: r.retry_after,
                };
                attempt.outcome = AttemptOutcome::Failed {
                    class: r.class,
                    code: r.code,
                    message: r.message,
                };
                return self
                    .finish(req, attempts, attempt, recorder, Err(failure))
                    .await;
            }
        };
        attempt.price_per_hour = ready.price.usd_per_hour;
        self.record(req, &attempt, recorder).await?;
        let result = self.create(req, ready).await;
        attempt.outcome = match &result {
            Ok(instance) => AttemptOutcome::Rented {
                instance_id: instance.id.clone(),
            },
            Err(e) => AttemptOutcome::Failed {
                class: e.class,
                code: e.code.clone(),
                message: e.to_string(),
            },
        };
        let result = result.map_err(|e| Failure {
            class: e.class,
            provider: e.provider,
            retry_after: e.retry_after,
        });
        self.finish(req, attempts, attempt, recorder, result).await
    }

    /// The provider, the fresh offer, the confirmed price and the budget for one candidate.
    async fn prepare(
        &self,
        req: &RentRequest<'_>,
        candidate: &Candidate,
    ) -> Result<Ready, Refused> {
        let offer = &candidate.offer;
        let query = OfferQuery::for_workload(req.workload);
        let fresh = self
            .catalog
            .fresh(offer.provider, &query)
            .await
            .map_err(|e| Refused {
                class: e.class,
                code: e.code.clone(),
                message: e.to_string(),
                retry_after: e.retry_after,
            })?;
        let provider = self
            .catalog
            .provider(offer.provider)
            .ok_or_else(|| Refused {
                class: FailureClass::InvalidRequest,
                code: None,
                message: format!("provider {} is not enabled on this node", offer.provider),
                retry_after: None,
            })?;
        let fresh_offer = fresh.iter().find(|o| o.id == offer.id);
        let price = price_guard::confirm(candidate, fresh_offer).map_err(|r| Refused {
            class: r.class,
            code: None,
            message: r.message,
            retry_after: None,
        })?;
        let reservation = self
            .budget
            .reserve(price.usd_per_hour)
            .map_err(|b| Refused {
                class: FailureClass::PriceExceeded,
                code: Some("budget-exceeded".to_owned()),
                message: b.to_string(),
                retry_after: None,
            })?;
        let offer = fresh_offer.cloned().unwrap_or_else(|| offer.clone());
        Ok(Ready {
            provider,
            offer,
            price,
            reservation,
        })
    }

    /// Creates the instance; the reservation is committed on success and released on failure.
    async fn create(
        &self,
        req: &RentRequest<'_>,
        ready: Ready,
    ) -> Result<InstanceState, ProviderError> {
        let request = CreateRequest {
            external_name: req.external_name.to_owned(),
            offer: ready.offer,
            workload: req.workload.clone(),
            env: req.env.to_vec(),
            bid_per_hour: ready.price.bid_per_hour,
            boot: req.boot.map(str::to_owned),
        };
        let instance = ready.provider.create(&request).await?;
        ready
            .reservation
            .commit(req.binding, instance.price_per_hour);
        self.ledger
            .start(req.binding, instance.price_per_hour, Utc::now());
        Ok(instance)
    }

    async fn record(
        &self,
        req: &RentRequest<'_>,
        attempt: &Attempt,
        recorder: &dyn AttemptRecorder,
    ) -> Result<(), BrokerError> {
        recorder
            .record(attempt)
            .await
            .map_err(|message| BrokerError::Record {
                external_name: req.external_name.to_owned(),
                number: attempt.number,
                message,
            })
    }

    async fn finish<T>(
        &self,
        req: &RentRequest<'_>,
        attempts: &mut Vec<Attempt>,
        attempt: Attempt,
        recorder: &dyn AttemptRecorder,
        result: Result<T, Failure>,
    ) -> Result<Result<T, Failure>, BrokerError> {
        self.record(req, &attempt, recorder).await?;
        attempts.push(attempt);
        Ok(result)
    }
}

/// A candidate ready to rent.
struct Ready {
    provider: Arc<dyn Provider>,
    offer: Offer,
    price: ConfirmedPrice,
    reservation: Reservation,
}

/// Why a candidate was refused before the provider was asked to create anything.
struct Refused {
    class: FailureClass,
    code: Option<String>,
    message: String,
    retry_after: Option<Duration>,
}
