//! The simulators' clock: tokio time for elapsed durations (so tests may use
//! `tokio::time::pause`) anchored to one wall-clock instant for the timestamps shown on the wire.
//!
//! Not a scheduler: state changes are derived from elapsed time when a request reads them.

use chrono::{DateTime, Utc};
use tokio::time::{Duration, Instant};

/// A clock shared by one simulator's state, ledger and market.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    origin: Instant,
    origin_utc: DateTime<Utc>,
}

impl Default for SimClock {
    fn default() -> Self {
        Self::new()
    }
}

impl SimClock {
    /// Starts a clock at the current tokio instant and wall-clock time.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            origin_utc: Utc::now(),
        }
    }

    /// The current tokio instant.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// The wall-clock time of a tokio instant, as the simulator reports it.
    pub fn utc(&self, at: Instant) -> DateTime<Utc> {
        let elapsed = at.saturating_duration_since(self.origin);
        self.origin_utc + chrono::Duration::from_std(elapsed).unwrap_or_default()
    }

    /// Seconds between two instants, zero if `to` is earlier.
    pub fn seconds(from: Instant, to: Instant) -> f64 {
        to.saturating_duration_since(from).as_secs_f64()
    }

    /// A duration of `ms` milliseconds.
    pub fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }
}
