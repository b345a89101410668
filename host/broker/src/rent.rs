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

use chrono::{DateTime, Utc};
use neocloud_core::{
    Attempt, AttemptOutcome, FailureClass, FallbackAction, InstanceState, Offer, OfferQuery,
    ProviderId, WorkloadSpec,
};
use neocloud_providers::{CreateRequest, Provider, ProviderError, retries};
use tokio::time::Instant;

use crate::budget::{BudgetGuard, Reservation};
use crate::catalog::Catalog;
use crate::cost::CostLedger;
use crate::error::BrokerError;
use crate::fallback::{Failure, FallbackContext, FallbackPolicy};
use crate::ladder::{Ladder, LadderLimits, Step};
use crate::planner::{Candidate, Plan};
use crate::price_guard::{self, ConfirmedPrice};
use crate::record::{AttemptRecorder, Decision, NextStep, Wait, WaitDecider};

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
    /// How the node's runner starts on the instance (see `CreateRequest::boot`).
    pub boot: Option<&'a neocloud_providers::Boot>,
    /// The login for the image's registry (see `CreateRequest::registry_login`).
    pub registry_login: Option<&'a neocloud_core::RegistryCredential>,
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
    /// The index in the plan of the candidate rented (`None` when found by name).
    pub candidate: Option<usize>,
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
    /// Cost figures at `now`: the burn rate, what is in flight, the cap, and each binding's.
    pub fn costs(&self, now: DateTime<Utc>) -> crate::CostSnapshot {
        crate::CostSnapshot {
            burn_usd_per_hour: self.ledger.burn_rate_usd_per_hour(),
            in_flight_usd_per_hour: self.budget.in_flight_usd_per_hour(),
            cap_usd_per_hour: self.budget.cap_usd_per_hour(),
            bindings: self.ledger.snapshot(now),
        }
    }

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
            if let Some(instance) = self.recover(&unknown, req, &attempts).await? {
                return Ok(Rental {
                    instance,
                    attempts,
                    adopted: true,
                    candidate: None,
                });
            }
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
                        candidate: Some(index),
                    });
                }
                Err(f) => f,
            };
            if failure.class.outcome_unknown() {
                unknown.insert(failure.provider);
            }
            let taken = failure.class == FailureClass::OfferTaken;
            let turn = Turn {
                ladder: &mut ladder,
                index,
                failure,
                started,
            };
            step = self.next_step(req, turn, &attempts, recorder).await?;
            if taken && let Step::GiveUp { .. } = step {
                return Err(BrokerError::OffersTaken {
                    external_name: req.external_name.to_owned(),
                    attempts,
                });
            }
        }
    }

    /// Decides what follows a failure and reports it. An offer taken by another renter moves on
    /// to the next offer without asking the policy or counting against the attempt limit; any
    /// other failure counts and is the fallback policy's to answer (with the offer-taken
    /// attempts left out of what it sees), bounded by the ladder.
    async fn next_step(
        &self,
        req: &RentRequest<'_>,
        turn: Turn<'_>,
        attempts: &[Attempt],
        recorder: &dyn AttemptRecorder,
    ) -> Result<Step, BrokerError> {
        let Turn {
            ladder,
            index,
            failure,
            started,
        } = turn;
        let class = failure.class;
        let retry_after = failure.retry_after;
        let (action, by_policy) = if class == FailureClass::OfferTaken {
            (FallbackAction::NextOffer, false)
        } else {
            ladder.attempted();
            let counted: Vec<Attempt> = attempts
                .iter()
                .filter(|a| a.failure() != Some(FailureClass::OfferTaken))
                .cloned()
                .collect();
            let cx = FallbackContext {
                workload: req.workload,
                attempts: &counted,
                failure,
                retries_of_offer: ladder.retries_of_current(),
            };
            let action =
                self.fallback
                    .next_action(&cx)
                    .unwrap_or_else(|e| FallbackAction::GiveUp {
                        reason: format!("fallback {e}"),
                    });
            (action, true)
        };
        let step = ladder.after_failure(&action, started.elapsed());
        let next = match &step {
            Step::Try { index: next, after } => NextStep::Try {
                offer: req.plan.candidates[*next].offer.clone(),
                after: *after,
                same_offer: *next == index,
            },
            Step::GiveUp { reason } => NextStep::Stop {
                reason: reason.clone(),
            },
        };
        let decision = Decision {
            attempt: attempts.last().map_or(0, |a| a.number),
            class,
            action,
            by_policy,
            retry_after,
            next,
        };
        recorder
            .decided(&decision)
            .await
            .map_err(|message| BrokerError::Record {
                external_name: req.external_name.to_owned(),
                number: decision.attempt,
                message,
            })?;
        Ok(step)
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

    /// Looks the external name up on every provider whose create outcome is unknown. A found
    /// instance whose provider reports no price yet is counted at the price of the last attempt
    /// on that provider.
    async fn recover(
        &self,
        unknown: &BTreeSet<ProviderId>,
        req: &RentRequest<'_>,
        attempts: &[Attempt],
    ) -> Result<Option<InstanceState>, BrokerError> {
        for id in unknown {
            let Some(provider) = self.catalog.provider(*id) else {
                continue;
            };
            let found = provider.find_by_name(req.external_name).await?;
            if let Some(mut found) = found.filter(|f| !f.phase.is_terminal()) {
                if let Some(last) = attempts.iter().rev().find(|a| a.provider == *id) {
                    fill_unreported(&mut found, last.price_per_hour, None);
                }
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
            // After the highest number, not the count: the binding keeps a bounded history.
            number: attempts.last().map_or(0, |a| a.number) + 1,
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
        let provider = ready.provider.clone();
        self.announce_wait(provider.as_ref(), recorder).await;
        let (mut result, retries) = retries::recording(self.create(req, ready)).await;
        if !retries.is_empty() {
            recorder.retried(&attempt, &retries).await;
        }
        match &result {
            Ok(_) => self.catalog.backoff().succeeded(offer.provider),
            Err(e) => {
                self.catalog
                    .backoff()
                    .failed(offer.provider, e.class, e.retry_after);
            }
        }
        if let Err(e) = &mut result
            && e.class == FailureClass::Capacity
            && self.offer_gone(req, offer).await
        {
            e.class = FailureClass::OfferTaken;
        }
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
        if let Some((left, why)) = self.catalog.backoff().remaining(offer.provider) {
            return Err(Refused {
                class: FailureClass::RateLimited,
                code: Some("provider-backoff".to_owned()),
                message: format!(
                    "{} is not called for {:.1}s more: {why}",
                    offer.provider,
                    left.as_secs_f64()
                ),
                retry_after: Some(left),
            });
        }
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
        let fresh_offer = fresh.iter().find(|o| o.same_listing(offer));
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
            boot: req.boot.cloned(),
            registry_login: req.registry_login.cloned(),
        };
        let mut instance = ready.provider.create(&request).await?;
        fill_unreported(
            &mut instance,
            ready.price.usd_per_hour,
            Some(request.offer.gpu_count),
        );
        ready
            .reservation
            .commit(req.binding, instance.price_per_hour);
        self.ledger
            .start(req.binding, instance.price_per_hour, Utc::now());
        Ok(instance)
    }

    /// Reports a wait the provider's own spacing of creates is about to impose.
    async fn announce_wait(&self, provider: &dyn Provider, recorder: &dyn AttemptRecorder) {
        if let Some((duration, reason)) = provider.create_wait()
            && duration >= Duration::from_millis(500)
        {
            let until = Utc::now() + chrono::Duration::from_std(duration).unwrap_or_default();
            let wait = Wait {
                duration,
                until,
                reason,
                decided_by: WaitDecider::LaunchSpacing,
            };
            recorder.waiting(&wait).await;
        }
    }

    /// Whether `offer` is gone from fresh offer data (taken by another renter since planning).
    /// A provider that cannot answer says nothing: the failure stays what the provider said.
    async fn offer_gone(&self, req: &RentRequest<'_>, offer: &Offer) -> bool {
        let query = OfferQuery::for_workload(req.workload);
        match self.catalog.fresh(offer.provider, &query).await {
            Ok(fresh) => !fresh.iter().any(|o| o.same_listing(offer)),
            Err(_) => false,
        }
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

/// One failure's turn at the ladder.
struct Turn<'a> {
    ladder: &'a mut Ladder,
    index: usize,
    failure: Failure,
    started: Instant,
}

/// Fills what a provider's answer leaves out from what we rented: a price of 0 (RunPod reports
/// `cost: 0` while a pod provisions) becomes the price confirmed before renting, and a GPU count
/// of 0 (a Lambda type without `specs`) the offer's. The node replaces the price once the
/// provider reports a non-zero one for the running instance.
pub fn fill_unreported(instance: &mut InstanceState, price: f64, gpu_count: Option<u32>) {
    if !(instance.price_per_hour.is_finite() && instance.price_per_hour > 0.0) {
        instance.price_per_hour = price;
    }
    if instance.gpu_count == 0
        && let Some(count) = gpu_count
    {
        instance.gpu_count = count;
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
