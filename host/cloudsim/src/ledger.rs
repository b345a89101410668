//! The billing ledger: one entry per instance ever created, with when it was created and
//! terminated, its price, and the cost it accrued. Billing stops on termination, preemption and
//! stop, so tests can assert "no leaked or duplicate instance, nothing billed after termination".
//!
//! Not an invoice: prices are the market's, with no storage or network charges.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::{Duration, Instant};

use crate::clock::SimClock;

/// One instance as the ledger sees it at a point in time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LedgerEntry {
    /// `runpod`, `lambda` or `vast`.
    pub provider: String,
    /// The provider's instance id.
    pub instance_id: String,
    /// The name or label the instance was created with.
    pub name: String,
    /// The market offer it was rented from.
    pub offer_id: u64,
    /// Rented as spot (interruptible).
    pub spot: bool,
    /// USD per hour while billed.
    pub price_per_hour: f64,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was terminated; `None` while it exists (it is live).
    pub terminated_at: Option<DateTime<Utc>>,
    /// Seconds billed so far.
    pub billed_seconds: f64,
    /// USD accrued so far.
    pub cost_usd: f64,
}

impl LedgerEntry {
    /// Not yet terminated.
    pub fn is_live(&self) -> bool {
        self.terminated_at.is_none()
    }
}

/// A snapshot of the whole ledger.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LedgerReport {
    /// Every instance ever created, in creation order.
    pub entries: Vec<LedgerEntry>,
}

impl LedgerReport {
    /// Instances that are not terminated.
    pub fn live(&self) -> Vec<&LedgerEntry> {
        self.entries
            .iter()
            .filter(|entry| entry.is_live())
            .collect()
    }

    /// Names held by more than one live instance.
    pub fn duplicate_live_names(&self) -> Vec<String> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for entry in self.live() {
            *counts.entry(entry.name.as_str()).or_default() += 1;
        }
        counts
            .into_iter()
            .filter(|(_, count)| *count > 1)
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// Entries created under this name.
    pub fn named(&self, name: &str) -> Vec<&LedgerEntry> {
        self.entries.iter().filter(|e| e.name == name).collect()
    }

    /// Total USD accrued.
    pub fn total_cost_usd(&self) -> f64 {
        self.entries.iter().map(|entry| entry.cost_usd).sum()
    }
}

#[derive(Debug)]
struct Record {
    entry: LedgerEntry,
    billed: Duration,
    billing_since: Option<Instant>,
}

/// The ledger of one simulator.
#[derive(Debug)]
pub struct Ledger {
    provider: &'static str,
    clock: SimClock,
    records: Vec<Record>,
}

impl Ledger {
    /// An empty ledger for one provider.
    pub fn new(provider: &'static str, clock: SimClock) -> Self {
        Self {
            provider,
            clock,
            records: Vec::new(),
        }
    }

    /// Records a new instance; `billing` says whether it is billed from now.
    pub fn open(
        &mut self,
        id: &str,
        name: &str,
        offer_id: u64,
        price: f64,
        spot: bool,
        billing: bool,
    ) {
        let now = self.clock.now();
        let entry = LedgerEntry {
            provider: self.provider.to_string(),
            instance_id: id.to_string(),
            name: name.to_string(),
            offer_id,
            spot,
            price_per_hour: price,
            created_at: self.clock.utc(now),
            terminated_at: None,
            billed_seconds: 0.0,
            cost_usd: 0.0,
        };
        let billing_since = billing.then_some(now);
        self.records.push(Record {
            entry,
            billed: Duration::ZERO,
            billing_since,
        });
    }

    /// Stops billing at `at` (preemption, stop); idempotent.
    pub fn pause(&mut self, id: &str, at: Instant) {
        if let Some(record) = self.record(id)
            && let Some(since) = record.billing_since.take()
        {
            record.billed += at.saturating_duration_since(since);
        }
    }

    /// Resumes billing now (start after stop); no-op for terminated instances.
    pub fn resume(&mut self, id: &str) {
        let now = self.clock.now();
        let record = self.record(id);
        if let Some(record) = record.filter(|r| r.entry.terminated_at.is_none()) {
            record.billing_since.get_or_insert(now);
        }
    }

    /// Marks an instance terminated now and stops its billing; idempotent.
    pub fn close(&mut self, id: &str) {
        let now = self.clock.now();
        self.pause(id, now);
        let utc = self.clock.utc(now);
        if let Some(record) = self.record(id) {
            record.entry.terminated_at.get_or_insert(utc);
        }
    }

    /// The ledger as of now.
    pub fn report(&self) -> LedgerReport {
        let now = self.clock.now();
        let entries = self
            .records
            .iter()
            .map(|r| Self::entry_at(r, now))
            .collect();
        LedgerReport { entries }
    }

    fn entry_at(record: &Record, now: Instant) -> LedgerEntry {
        let running = record
            .billing_since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        let seconds = (record.billed + running).as_secs_f64();
        let mut entry = record.entry.clone();
        entry.billed_seconds = seconds;
        entry.cost_usd = entry.price_per_hour * seconds / 3600.0;
        entry
    }

    fn record(&mut self, id: &str) -> Option<&mut Record> {
        self.records.iter_mut().find(|r| r.entry.instance_id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_closed_instance_accrues_no_more_cost() {
        let mut ledger = Ledger::new("vast", SimClock::new());
        ledger.open("1", "a", 5, 3.6, false, true);
        tokio::time::advance(Duration::from_secs(10)).await;
        ledger.close("1");
        let closed = ledger.report().entries[0].cost_usd;
        tokio::time::advance(Duration::from_secs(100)).await;
        let later = ledger.report();
        assert!((closed - 0.01).abs() < 1e-9, "cost was {closed}");
        assert_eq!(later.entries[0].cost_usd, closed);
        assert!(later.live().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn two_live_instances_with_one_name_are_reported_as_duplicates() {
        let mut ledger = Ledger::new("lambda", SimClock::new());
        ledger.open("1", "same", 1, 1.0, false, true);
        ledger.open("2", "same", 1, 1.0, false, true);
        ledger.open("3", "other", 1, 1.0, false, true);
        assert_eq!(
            ledger.report().duplicate_live_names(),
            vec!["same".to_string()]
        );
        ledger.close("2");
        assert!(ledger.report().duplicate_live_names().is_empty());
    }
}
