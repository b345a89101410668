//! Token buckets keyed by client IP or binding, so a runner (or anyone who can reach the port)
//! cannot hammer the token exchange or the node's state. The buckets are governor's keyed GCRA
//! limiters; this file only turns a [`RateLimit`] into a quota and bounds the number of keys.
//!
//! Not fairness or queueing: a request over the limit is refused with 429 at once.

use std::hash::Hash;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

/// Beyond this many keys, those whose bucket is full again are forgotten.
const MAX_KEYS: usize = 10_000;

/// The longest refill period of one request: a rate slower than one a year is one a year.
const MAX_PERIOD: Duration = Duration::from_secs(365 * 24 * 3600);

/// A bucket's size and refill rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests allowed in a burst.
    pub burst: u32,
    /// Requests added back per second.
    pub per_second: f64,
}

impl RateLimit {
    /// The governor quota; `None` when no request is ever allowed (a zero burst).
    fn quota(&self) -> Option<Quota> {
        let burst = NonZeroU32::new(self.burst)?;
        let period = if self.per_second.is_finite() && self.per_second > 0.0 {
            Duration::try_from_secs_f64(1.0 / self.per_second).unwrap_or(MAX_PERIOD)
        } else {
            MAX_PERIOD
        };
        let period = period.clamp(Duration::from_nanos(1), MAX_PERIOD);
        Quota::with_period(period).map(|q| q.allow_burst(burst))
    }
}

type Keyed<K, C> = RateLimiter<K, DashMapStateStore<K>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// Buckets per key; keys idle long enough to be full again are forgotten once there are many.
pub struct Limiter<K: Hash + Eq + Clone, C: Clock = DefaultClock> {
    /// `None` for a zero burst: everything is refused.
    buckets: Option<Keyed<K, C>>,
}

impl<K: Hash + Eq + Clone, C: Clock> std::fmt::Debug for Limiter<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("keys", &self.buckets.as_ref().map_or(0, RateLimiter::len))
            .finish()
    }
}

impl<K: Hash + Eq + Clone> Limiter<K> {
    /// Buckets of `limit`.
    pub fn new(limit: RateLimit) -> Self {
        Self::with_clock(limit, DefaultClock::default())
    }
}

impl<K: Hash + Eq + Clone, C: Clock> Limiter<K, C> {
    fn with_clock(limit: RateLimit, clock: C) -> Self {
        Self {
            buckets: limit
                .quota()
                .map(|quota| RateLimiter::dashmap_with_clock(quota, clock)),
        }
    }

    /// Takes one token for `key`; false when its bucket is empty.
    pub fn allow(&self, key: &K) -> bool {
        let Some(buckets) = &self.buckets else {
            return false;
        };
        if buckets.len() > MAX_KEYS {
            buckets.retain_recent();
        }
        buckets.check_key(key).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn limiter(
        burst: u32,
        per_second: f64,
    ) -> (Limiter<String, FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        let limit = RateLimit { burst, per_second };
        (Limiter::with_clock(limit, clock.clone()), clock)
    }

    #[test]
    fn bucket_refuses_beyond_the_burst_and_refills() {
        let (limiter, clock) = limiter(2, 1.0);
        let (a, b) = ("a".to_owned(), "b".to_owned());
        assert!(limiter.allow(&a));
        assert!(limiter.allow(&a));
        assert!(!limiter.allow(&a));
        assert!(limiter.allow(&b), "keys are independent");
        clock.advance(Duration::from_millis(1_001));
        assert!(limiter.allow(&a));
        clock.advance(Duration::from_millis(1));
        assert!(!limiter.allow(&a));
    }

    #[test]
    fn a_zero_burst_refuses_everything_and_a_zero_rate_never_refills() {
        let (none, _) = limiter(0, 10.0);
        assert!(!none.allow(&"a".to_owned()));
        let (once, clock) = limiter(1, 0.0);
        assert!(once.allow(&"a".to_owned()));
        clock.advance(Duration::from_secs(24 * 3600));
        assert!(!once.allow(&"a".to_owned()));
    }

    #[test]
    fn many_keys_are_forgotten_once_their_buckets_are_full_again() {
        let (limiter, clock) = limiter(1, 1.0);
        for i in 0..=MAX_KEYS {
            assert!(limiter.allow(&i.to_string()));
        }
        clock.advance(Duration::from_secs(2));
        assert!(limiter.allow(&"late".to_owned()));
        let keys = limiter.buckets.as_ref().unwrap().len();
        assert!(keys <= 2, "{keys} keys kept");
    }
}
