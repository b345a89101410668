//! Token buckets keyed by client IP or binding, so a runner (or anyone who can reach the port)
//! cannot hammer the token exchange or the node's state.
//!
//! Not fairness or queueing: a request over the limit is refused with 429 at once.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A bucket's size and refill rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests allowed in a burst.
    pub burst: u32,
    /// Requests added back per second.
    pub per_second: f64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Buckets per key; keys idle long enough to be full again are forgotten.
#[derive(Debug)]
pub struct Limiter<K> {
    limit: RateLimit,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Eq + Hash + Clone> Limiter<K> {
    /// Buckets of `limit`.
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `key`; false when its bucket is empty.
    pub fn allow(&self, key: &K) -> bool {
        self.allow_at(key, Instant::now())
    }

    fn allow_at(&self, key: &K, now: Instant) -> bool {
        let burst = f64::from(self.limit.burst);
        let mut buckets = self.buckets.lock();
        if buckets.len() > 10_000 {
            self.forget_full(&mut buckets, now);
        }
        let bucket = buckets.entry(key.clone()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.limit.per_second).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn forget_full(&self, buckets: &mut HashMap<K, Bucket>, now: Instant) {
        let refill = if self.limit.per_second > 0.0 {
            Duration::from_secs_f64(f64::from(self.limit.burst) / self.limit.per_second)
        } else {
            Duration::MAX
        };
        buckets.retain(|_, b| now.saturating_duration_since(b.at) < refill);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refuses_beyond_the_burst_and_refills() {
        let limiter = Limiter::new(RateLimit {
            burst: 2,
            per_second: 1.0,
        });
        let now = Instant::now();
        assert!(limiter.allow_at(&"a", now));
        assert!(limiter.allow_at(&"a", now));
        assert!(!limiter.allow_at(&"a", now));
        assert!(limiter.allow_at(&"b", now), "keys are independent");
        assert!(limiter.allow_at(&"a", now + Duration::from_millis(1_001)));
        assert!(!limiter.allow_at(&"a", now + Duration::from_millis(1_002)));
    }
}
