//! The ladder: walks a plan's candidates as a fallback policy directs, and enforces the limits on
//! attempts and total time that no policy can lift. A pure state machine; the renter (`rent`)
//! does the waiting and the provider calls.
//!
//! Not for classifying failures (adapters do) or choosing actions (fallback policies do).

use std::collections::BTreeSet;
use std::time::Duration;

use neocloud_core::{FallbackAction, ProviderId};

/// Limits on one rental's ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LadderLimits {
    /// Attempts (provider create calls) at most.
    pub max_attempts: u32,
    /// Wall time from the first attempt at most, waits included.
    pub max_total: Duration,
}

impl Default for LadderLimits {
    fn default() -> Self {
        LadderLimits {
            max_attempts: 10,
            max_total: Duration::from_secs(600),
        }
    }
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Wait `after`, then try candidate `index`.
    Try {
        /// The candidate's index in the plan.
        index: usize,
        /// How long to wait first.
        after: Duration,
    },
    /// Stop.
    GiveUp {
        /// Why, for events.
        reason: String,
    },
}

/// The ladder over one plan.
#[derive(Debug, Clone)]
pub struct Ladder {
    limits: LadderLimits,
    providers: Vec<ProviderId>,
    current: usize,
    attempts: u32,
    retries_of_current: u32,
    skipped: BTreeSet<ProviderId>,
}

impl Ladder {
    /// A ladder over candidates from these providers, in plan order.
    pub fn new(limits: LadderLimits, providers: Vec<ProviderId>) -> Ladder {
        Ladder {
            limits,
            providers,
            current: 0,
            attempts: 0,
            retries_of_current: 0,
            skipped: BTreeSet::new(),
        }
    }

    /// The first step.
    pub fn start(&mut self) -> Step {
        self.try_from(0, Duration::ZERO, Duration::ZERO)
    }

    /// Records that the step just taken made one attempt. Call once per provider create.
    pub fn attempted(&mut self) {
        self.attempts += 1;
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How many times the current candidate has been retried.
    pub fn retries_of_current(&self) -> u32 {
        self.retries_of_current
    }

    /// Providers skipped so far.
    pub fn skipped(&self) -> impl Iterator<Item = ProviderId> + '_ {
        self.skipped.iter().copied()
    }

    /// The next step after a failure, given the policy's action and the time spent so far.
    pub fn after_failure(&mut self, action: &FallbackAction, elapsed: Duration) -> Step {
        match action {
            FallbackAction::RetrySameOffer { after } => self.retry(*after, elapsed),
            FallbackAction::Wait { duration } => self.retry(*duration, elapsed),
            FallbackAction::NextOffer => self.try_from(self.current + 1, Duration::ZERO, elapsed),
            FallbackAction::SkipProvider { provider } => {
                self.skipped.insert(*provider);
                self.try_from(self.current + 1, Duration::ZERO, elapsed)
            }
            FallbackAction::GiveUp { reason } => Step::GiveUp {
                reason: reason.clone(),
            },
        }
    }

    fn retry(&mut self, after: Duration, elapsed: Duration) -> Step {
        let Some(step) = self.limit(after, elapsed) else {
            self.retries_of_current += 1;
            return Step::Try {
                index: self.current,
                after,
            };
        };
        step
    }

    fn try_from(&mut self, from: usize, after: Duration, elapsed: Duration) -> Step {
        if let Some(step) = self.limit(after, elapsed) {
            return step;
        }
        let next =
            (from..self.providers.len()).find(|i| !self.skipped.contains(&self.providers[*i]));
        match next {
            Some(index) => {
                self.current = index;
                self.retries_of_current = 0;
                Step::Try { index, after }
            }
            None => Step::GiveUp {
                reason: format!("no candidates left after {} attempts", self.attempts),
            },
        }
    }

    fn limit(&self, after: Duration, elapsed: Duration) -> Option<Step> {
        if self.attempts >= self.limits.max_attempts {
            let reason = format!("reached the limit of {} attempts", self.limits.max_attempts);
            return Some(Step::GiveUp { reason });
        }
        if elapsed.saturating_add(after) > self.limits.max_total {
            let reason = format!(
                "waiting {:?} more would pass the limit of {:?} (spent {:?})",
                after, self.limits.max_total, elapsed
            );
            return Some(Step::GiveUp { reason });
        }
        None
    }
}
