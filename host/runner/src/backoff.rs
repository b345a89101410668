//! kubelet's `CrashLoopBackOff` for restarts in place: the wait before each restart starts at a
//! base (10 s), doubles after each restart up to a cap (5 min), and starts over once a run
//! lasted twice the cap (10 min) without failing. A pure state machine: the caller measures how
//! long each run lasted and does the waiting.
//!
//! Not the decision whether to restart (the Pod's restart policy, in the runner's loop).

use std::time::Duration;

/// kubelet's initial back-off.
pub const KUBELET_BACKOFF_BASE: Duration = Duration::from_secs(10);
/// How much longer than the base the back-off may grow (kubelet: 10 s to 5 min).
const CAP_FACTOR: u32 = 30;

/// The back-off of one workload's restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl Default for Backoff {
    /// kubelet's: 10 s doubling to 5 min, reset after 10 min of running.
    fn default() -> Self {
        Self::with_base(KUBELET_BACKOFF_BASE)
    }
}

impl Backoff {
    /// A back-off starting at `base`, capped at 30 times it and reset after a run of twice
    /// the cap (kubelet's proportions; shortened only by the runner's hidden test knob).
    pub fn with_base(base: Duration) -> Self {
        let cap = base.saturating_mul(CAP_FACTOR);
        Self {
            base,
            cap,
            next: base,
        }
    }

    /// The largest wait.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// How long a run must last for the back-off to start over.
    pub fn reset_after(&self) -> Duration {
        self.cap.saturating_mul(2)
    }

    /// The wait before restarting a run that lasted `ran_for`; the wait after the next one
    /// doubles (up to the cap), unless that run lasts long enough to reset it.
    pub fn next_delay(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= self.reset_after() {
            self.next = self.base;
        }
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A fake clock: runs of given lengths, one after the other, from a fixed start.
    struct Clock(Instant);

    impl Clock {
        fn run(&mut self, backoff: &mut Backoff, lasted: Duration) -> Duration {
            let started = self.0;
            self.0 += lasted;
            let delay = backoff.next_delay(self.0 - started);
            self.0 += delay;
            delay
        }
    }

    #[test]
    fn the_wait_doubles_from_ten_seconds_to_five_minutes() {
        let mut clock = Clock(Instant::now());
        let mut backoff = Backoff::default();
        let waits: Vec<u64> = (0..8)
            .map(|_| clock.run(&mut backoff, Duration::from_secs(1)).as_secs())
            .collect();
        assert_eq!(waits, vec![10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn a_run_of_ten_minutes_resets_the_back_off_and_a_shorter_one_does_not() {
        let mut clock = Clock(Instant::now());
        let mut backoff = Backoff::default();
        for _ in 0..4 {
            clock.run(&mut backoff, Duration::from_secs(5));
        }
        let almost = clock.run(&mut backoff, Duration::from_secs(599));
        assert_eq!(almost, Duration::from_secs(160));
        let reset = clock.run(&mut backoff, Duration::from_secs(600));
        assert_eq!(reset, Duration::from_secs(10));
        assert_eq!(
            clock.run(&mut backoff, Duration::ZERO),
            Duration::from_secs(20)
        );
    }

    #[test]
    fn a_shortened_base_keeps_kubelet_s_proportions() {
        let mut backoff = Backoff::with_base(Duration::from_secs(1));
        assert_eq!(backoff.cap(), Duration::from_secs(30));
        assert_eq!(backoff.reset_after(), Duration::from_secs(60));
        let waits: Vec<u64> = (0..7)
            .map(|_| backoff.next_delay(Duration::ZERO).as_secs())
            .collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30]);
    }
}
