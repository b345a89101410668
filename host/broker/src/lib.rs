//! The resource broker: an offer catalog over every enabled provider, a planner that applies
//! constraints and policies, a fallback ladder for failed rentals, and the price and budget guards
//! that keep spending within what the Pod and the cluster allow.
//!
//! It is provider-neutral and knows nothing of Kubernetes: the virtual node consumes it.

pub mod backoff;
pub mod broker;
pub mod budget;
pub mod catalog;
pub mod cel;
pub mod constraints;
pub mod cost;
pub mod error;
pub mod explain;
pub mod fallback;
pub mod ladder;
pub mod planner;
pub mod policy;
pub mod price_guard;
pub mod record;
pub mod rent;
pub mod wasm;

pub use backoff::ProviderBackoff;
pub use broker::{Broker, CostSnapshot, Placement};
pub use budget::{BudgetExceeded, BudgetGuard, Reservation};
pub use catalog::{Catalog, CatalogConfig, CatalogView};
pub use cel::{CelFilter, CelRanker};
pub use constraints::Rejection;
pub use cost::{BindingCost, CostLedger};
pub use error::BrokerError;
pub use fallback::{Backoff, DefaultFallback, Failure, FallbackContext, FallbackPolicy};
pub use ladder::{Ladder, LadderLimits, Step};
pub use planner::{Candidate, Plan, PlanInput, Planner};
pub use policy::{
    AcceptAll, CheapestFirst, MinimumBid, OfferFilter, OfferRanker, PolicyError, PricingPolicy,
};
pub use record::{AttemptRecorder, Decision, NextStep, Wait, WaitDecider};
pub use rent::{RentRequest, Rental, Renter, fill_unreported};
