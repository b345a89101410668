//! Cost accounting: the burn rate now and the cost accrued per binding, for metrics and the
//! binding status. Time is passed in, so the ledger is deterministic.
//!
//! Not for limiting spend (see `budget`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;

/// The cost of one binding at a point in time.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingCost {
    /// The binding (namespace/name).
    pub binding: String,
    /// The current price per hour (0 when stopped).
    pub usd_per_hour: f64,
    /// Total accrued so far, USD.
    pub accrued_usd: f64,
}

#[derive(Debug, Clone)]
struct Entry {
    usd_per_hour: f64,
    running_since: Option<DateTime<Utc>>,
    accrued_usd: f64,
}

impl Entry {
    fn accrued_until(&self, now: DateTime<Utc>) -> f64 {
        let running = self.running_since.map_or(0.0, |since| {
            let ms = (now - since).num_milliseconds().max(0) as f64;
            self.usd_per_hour * ms / 3_600_000.0
        });
        self.accrued_usd + running
    }
}

/// The ledger. Safe to share and call concurrently.
#[derive(Debug, Default)]
pub struct CostLedger {
    entries: Mutex<BTreeMap<String, Entry>>,
}

impl CostLedger {
    /// An empty ledger.
    pub fn new() -> CostLedger {
        CostLedger::default()
    }

    /// A binding's instance starts (or changes price) at `at`. Cost before `at` is kept.
    pub fn start(&self, binding: &str, usd_per_hour: f64, at: DateTime<Utc>) {
        let mut entries = self.entries.lock();
        let entry = entries.entry(binding.to_owned()).or_insert(Entry {
            usd_per_hour,
            running_since: None,
            accrued_usd: 0.0,
        });
        entry.accrued_usd = entry.accrued_until(at);
        entry.usd_per_hour = usd_per_hour;
        entry.running_since = Some(at);
    }

    /// A binding's instance stops being billed at `at` (deleted, terminated, lost).
    pub fn stop(&self, binding: &str, at: DateTime<Utc>) {
        if let Some(entry) = self.entries.lock().get_mut(binding) {
            entry.accrued_usd = entry.accrued_until(at);
            entry.running_since = None;
        }
    }

    /// Removes a binding (finalized); its cost is no longer reported.
    pub fn forget(&self, binding: &str) {
        self.entries.lock().remove(binding);
    }

    /// The sum of prices of running instances, USD per hour.
    pub fn burn_rate_usd_per_hour(&self) -> f64 {
        let entries = self.entries.lock();
        entries
            .values()
            .filter(|e| e.running_since.is_some())
            .map(|e| e.usd_per_hour)
            // Not `sum()`: an empty float sum is -0.0, which dashboards print as "-0".
            .fold(0.0, |total, rate| total + rate)
    }

    /// A binding's accrued cost at `now`, if the ledger knows it.
    pub fn accrued_usd(&self, binding: &str, now: DateTime<Utc>) -> Option<f64> {
        self.entries
            .lock()
            .get(binding)
            .map(|e| e.accrued_until(now))
    }

    /// Every binding's cost at `now`, ordered by binding, for metrics.
    pub fn snapshot(&self, now: DateTime<Utc>) -> Vec<BindingCost> {
        let entries = self.entries.lock();
        entries
            .iter()
            .map(|(binding, e)| BindingCost {
                binding: binding.clone(),
                usd_per_hour: if e.running_since.is_some() {
                    e.usd_per_hour
                } else {
                    0.0
                },
                accrued_usd: e.accrued_until(now),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_ledger_burns_positive_zero() {
        let burn = CostLedger::new().burn_rate_usd_per_hour();
        assert!(burn == 0.0 && burn.is_sign_positive(), "{burn:?}");
    }
}
