//! Per-provider back-off: a provider that answered 429 is left alone for its Retry-After (or a
//! default), and one that keeps failing transiently (5xx, timeouts) for a capped exponential
//! delay with jitter, by every Pod at once: while a provider backs off, no create is sent to it
//! and the node's reconciles wait instead of polling it. A success ends the back-off.
//!
//! Not for deciding what a Pod does next (the fallback policy does, seeing a `rate-limited`
//! refusal with the time left); this only remembers what each provider said.

use std::collections::HashMap;
use std::time::Duration;

use neocloud_core::{FailureClass, ProviderId};
use parking_lot::Mutex;
use rand::Rng;
// The runtime's clock, so paused-time tests and the ladder's waits agree with it.
use tokio::time::Instant;

/// The wait after a 429 without a Retry-After.
pub const DEFAULT_RATE_LIMIT_WAIT: Duration = Duration::from_secs(5);
/// No back-off is longer, whatever a Retry-After says.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The longest back-off after transient failures.
const TRANSIENT_CAP: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default)]
struct Entry {
    until: Option<Instant>,
    transient_streak: u32,
    why: String,
}

/// What each provider asked for. Share it behind an `Arc` (the catalog does).
#[derive(Debug, Default)]
pub struct ProviderBackoff {
    state: Mutex<HashMap<ProviderId, Entry>>,
}

impl ProviderBackoff {
    /// How long `provider` still backs off at `now`, and why; `None` when it may be called.
    pub fn remaining_at(&self, provider: ProviderId, now: Instant) -> Option<(Duration, String)> {
        let state = self.state.lock();
        let entry = state.get(&provider)?;
        let left = entry.until?.saturating_duration_since(now);
        (!left.is_zero()).then(|| (left, entry.why.clone()))
    }

    /// [`ProviderBackoff::remaining_at`] now.
    pub fn remaining(&self, provider: ProviderId) -> Option<(Duration, String)> {
        self.remaining_at(provider, Instant::now())
    }

    /// Records a failed call at `now`: a 429 backs off for its Retry-After (or
    /// [`DEFAULT_RATE_LIMIT_WAIT`]); a second transient failure in a row or more for 1 s, 2 s,
    /// 4 s... up to 60 s, with 20% jitter. Returns the back-off now in force.
    pub fn failed_at(
        &self,
        provider: ProviderId,
        class: FailureClass,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> Option<Duration> {
        let mut state = self.state.lock();
        let entry = state.entry(provider).or_default();
        let (wait, why) = match class {
            FailureClass::RateLimited => {
                let wait = retry_after.unwrap_or(DEFAULT_RATE_LIMIT_WAIT);
                let why = match retry_after {
                    Some(d) => format!("{provider} answered 429 with Retry-After {}s", d.as_secs()),
                    None => format!("{provider} answered 429"),
                };
                (wait, why)
            }
            FailureClass::Transient | FailureClass::Timeout => {
                entry.transient_streak += 1;
                let streak = entry.transient_streak;
                if streak < 2 {
                    return None;
                }
                let base = Duration::from_secs(1) * 2u32.pow((streak - 2).min(6));
                let jitter = rand::rng().random_range(0.8..=1.2);
                let wait = base.min(TRANSIENT_CAP).mul_f64(jitter);
                (
                    wait,
                    format!("{streak} transient failures in a row from {provider}"),
                )
            }
            _ => return None,
        };
        let until = now + wait.min(MAX_BACKOFF);
        if entry.until.is_none_or(|u| u < until) {
            entry.until = Some(until);
            entry.why = why;
        }
        entry.until.map(|u| u.saturating_duration_since(now))
    }

    /// [`ProviderBackoff::failed_at`] now.
    pub fn failed(
        &self,
        provider: ProviderId,
        class: FailureClass,
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        self.failed_at(provider, class, retry_after, Instant::now())
    }

    /// A call succeeded: the provider's back-off and its transient streak end.
    pub fn succeeded(&self, provider: ProviderId) {
        if let Some(entry) = self.state.lock().get_mut(&provider) {
            *entry = Entry::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: ProviderId = ProviderId::Runpod;

    #[test]
    fn a_429_backs_the_provider_off_for_its_retry_after_and_no_other() {
        let b = ProviderBackoff::default();
        let t0 = Instant::now();
        let left = b.failed_at(
            R,
            FailureClass::RateLimited,
            Some(Duration::from_secs(30)),
            t0,
        );
        assert_eq!(left, Some(Duration::from_secs(30)));
        let (left, why) = b.remaining_at(R, t0 + Duration::from_secs(10)).unwrap();
        assert_eq!(left, Duration::from_secs(20));
        assert_eq!(why, "runpod answered 429 with Retry-After 30s");
        assert_eq!(b.remaining_at(ProviderId::Vast, t0), None);
        assert_eq!(b.remaining_at(R, t0 + Duration::from_secs(30)), None);
    }

    #[test]
    fn transient_failures_back_off_from_the_second_in_a_row_and_a_success_ends_it() {
        let b = ProviderBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.failed_at(R, FailureClass::Transient, None, t0), None);
        let second = b.failed_at(R, FailureClass::Timeout, None, t0).unwrap();
        assert!(second >= Duration::from_millis(800) && second <= Duration::from_millis(1200));
        let mut last = second;
        for _ in 0..10 {
            last = b.failed_at(R, FailureClass::Transient, None, t0).unwrap();
        }
        assert!(last <= TRANSIENT_CAP.mul_f64(1.2), "{last:?}");
        assert!(last >= Duration::from_secs(48), "{last:?}");
        b.succeeded(R);
        assert_eq!(b.remaining_at(R, t0), None);
        assert_eq!(b.failed_at(R, FailureClass::Transient, None, t0), None);
    }

    #[test]
    fn capacity_or_auth_failures_do_not_back_a_provider_off_and_long_retry_afters_are_capped() {
        let b = ProviderBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.failed_at(R, FailureClass::Capacity, None, t0), None);
        assert_eq!(b.failed_at(R, FailureClass::Auth, None, t0), None);
        let left = b.failed_at(
            R,
            FailureClass::RateLimited,
            Some(Duration::from_secs(3600)),
            t0,
        );
        assert_eq!(left, Some(MAX_BACKOFF));
    }
}
