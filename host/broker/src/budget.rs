//! The cluster budget guard: caps the total burn rate (USD per hour) of every rented instance,
//! reserving budget for rentals in flight so that concurrent rentals cannot overrun it together.
//!
//! Amounts are kept in integer micro-dollars so the cap is checked exactly. Not for accrued cost
//! (see `cost`).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// Micro-dollars per dollar.
const MICROS: f64 = 1_000_000.0;

fn to_micros(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * MICROS).ceil() as u64
    } else {
        0
    }
}

fn to_usd(micros: u64) -> f64 {
    micros as f64 / MICROS
}

/// A reservation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "cluster budget of ${cap:.4}/h would be exceeded: ${running:.4}/h running, ${in_flight:.4}/h in flight, ${requested:.4}/h requested"
)]
pub struct BudgetExceeded {
    /// The cap.
    pub cap: f64,
    /// The burn rate of committed rentals.
    pub running: f64,
    /// Reserved for rentals in flight.
    pub in_flight: f64,
    /// What was asked for.
    pub requested: f64,
}

#[derive(Debug, Default)]
struct BudgetState {
    committed: HashMap<String, u64>,
    committed_total: u64,
    in_flight: u64,
}

/// The guard. Share it behind an `Arc`; every method is safe to call concurrently.
#[derive(Debug)]
pub struct BudgetGuard {
    cap: Option<u64>,
    state: Mutex<BudgetState>,
}

/// Budget held for one rental in flight. Commit it when the instance exists; dropping it
/// uncommitted releases the budget.
#[derive(Debug)]
#[must_use = "dropping a reservation releases it"]
pub struct Reservation {
    guard: Arc<BudgetGuard>,
    micros: u64,
    settled: bool,
}

impl BudgetGuard {
    /// A guard capping the burn rate at `cap_usd_per_hour`; `None` tracks without capping.
    pub fn new(cap_usd_per_hour: Option<f64>) -> Arc<BudgetGuard> {
        let cap = cap_usd_per_hour.map(to_micros);
        Arc::new(BudgetGuard {
            cap,
            state: Mutex::new(BudgetState::default()),
        })
    }

    /// Reserves `usd_per_hour` for a rental in flight, or refuses if running plus in-flight plus
    /// this would pass the cap.
    pub fn reserve(self: &Arc<Self>, usd_per_hour: f64) -> Result<Reservation, BudgetExceeded> {
        let micros = to_micros(usd_per_hour);
        let mut state = self.state.lock();
        if let Some(cap) = self.cap {
            let total = state.committed_total + state.in_flight + micros;
            if total > cap {
                return Err(BudgetExceeded {
                    cap: to_usd(cap),
                    running: to_usd(state.committed_total),
                    in_flight: to_usd(state.in_flight),
                    requested: usd_per_hour,
                });
            }
        }
        state.in_flight += micros;
        Ok(Reservation {
            guard: Arc::clone(self),
            micros,
            settled: false,
        })
    }

    /// Records an instance that already exists (found again by name after a restart or a lost
    /// answer). It is counted even past the cap, because the money is already being spent.
    pub fn record_existing(&self, binding: &str, usd_per_hour: f64) {
        let mut state = self.state.lock();
        state.set_committed(binding, to_micros(usd_per_hour));
    }

    /// Forgets a binding's instance (deleted or terminated).
    pub fn release(&self, binding: &str) {
        let mut state = self.state.lock();
        if let Some(old) = state.committed.remove(binding) {
            state.committed_total -= old;
        }
    }

    /// The burn rate of committed rentals, USD per hour.
    pub fn running_usd_per_hour(&self) -> f64 {
        to_usd(self.state.lock().committed_total)
    }

    /// Reserved for rentals in flight, USD per hour.
    pub fn in_flight_usd_per_hour(&self) -> f64 {
        to_usd(self.state.lock().in_flight)
    }

    /// The cap, if any.
    pub fn cap_usd_per_hour(&self) -> Option<f64> {
        self.cap.map(to_usd)
    }

    /// Running plus in flight, in micro-dollars; for tests of the invariant.
    pub fn committed_and_in_flight_micros(&self) -> u64 {
        let state = self.state.lock();
        state.committed_total + state.in_flight
    }
}

impl BudgetState {
    fn set_committed(&mut self, binding: &str, micros: u64) {
        if let Some(old) = self.committed.insert(binding.to_owned(), micros) {
            self.committed_total -= old;
        }
        self.committed_total += micros;
    }
}

impl Reservation {
    /// The reserved amount, USD per hour.
    pub fn usd_per_hour(&self) -> f64 {
        to_usd(self.micros)
    }

    /// Turns the reservation into the binding's running cost. The committed amount is the lower
    /// of the actual price and the reservation, so a commit never grows the total; the renter's
    /// price guard makes sure the actual price is within it.
    pub fn commit(mut self, binding: &str, actual_usd_per_hour: f64) {
        let micros = to_micros(actual_usd_per_hour).min(self.micros);
        let mut state = self.guard.state.lock();
        state.in_flight -= self.micros;
        state.set_committed(binding, micros);
        self.settled = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            self.guard.state.lock().in_flight -= self.micros;
        }
    }
}
