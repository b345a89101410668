//! Renting again after a container exited on a machine whose runner cannot restart it in place
//! (a Pod the provider runs itself, or an older runner): kubelet's back-off between rentals,
//! 10 s before the first re-rental and doubling to 5 min, counted from when the last instance
//! was retired. A restart in place (the runner's) and a machine that was lost or reclaimed are
//! not this: the first keeps its machine, the second is rented again at once.
//!
//! Pure: the reconciler passes the binding's status and the time.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::endings::replacements;
use neocloud_api::{BindingPhase, CloudPodBindingStatus};

/// The binding's (and the Pod's) reason while it waits to be rented again after an exit.
pub(super) const RERENT_BACKOFF: &str = "BackOff";

/// The first wait between rentals.
const BASE: Duration = Duration::from_secs(10);
/// The longest.
const CAP: Duration = Duration::from_secs(300);

/// The wait before the re-rental that follows `replaced` earlier replacements.
pub(super) fn rerent_backoff(replaced: usize) -> Duration {
    let doublings = u32::try_from(replaced.min(6)).unwrap_or(6);
    BASE.saturating_mul(2u32.pow(doublings)).min(CAP)
}

/// How long a binding waiting to be rented again after an exit ([`RERENT_BACKOFF`]) still
/// waits at `now`; `None` for any other binding, or once the wait is over. The wait counts from
/// the end of the attempt last retired.
pub(super) fn rerent_wait(status: &CloudPodBindingStatus, now: DateTime<Utc>) -> Option<Duration> {
    if status.phase != BindingPhase::Pending || status.reason.as_deref() != Some(RERENT_BACKOFF) {
        return None;
    }
    let retired = status
        .attempts
        .iter()
        .rev()
        .find_map(|a| a.finished_at.as_deref())
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())?
        .with_timezone(&Utc);
    let delay = rerent_backoff(replacements(status).saturating_sub(1));
    let until = retired + chrono::Duration::from_std(delay).ok()?;
    let left = (until - now).to_std().ok()?;
    (!left.is_zero()).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neocloud_api::{AttemptOutcome, AttemptRecord};

    #[test]
    fn the_wait_between_rentals_doubles_from_ten_seconds_to_five_minutes() {
        let waits: Vec<u64> = (0..8).map(|n| rerent_backoff(n).as_secs()).collect();
        assert_eq!(waits, vec![10, 20, 40, 80, 160, 300, 300, 300]);
    }

    fn retired(n: u32, at: &str) -> AttemptRecord {
        AttemptRecord {
            number: n,
            provider: "runpod".into(),
            offer_id: "1".into(),
            price_per_hour: 0.5,
            started_at: at.into(),
            finished_at: Some(at.into()),
            outcome: AttemptOutcome::Failed,
            failure_class: Some("lost".into()),
            message: Some("the container exited with code 1".into()),
            action: None,
            decided_by: None,
            decision: None,
            retried: None,
        }
    }

    #[test]
    fn a_binding_waits_out_the_back_off_of_its_replacements_from_the_last_retirement() {
        let at = |t: &str| DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&Utc);
        let mut status = CloudPodBindingStatus {
            phase: BindingPhase::Pending,
            reason: Some(RERENT_BACKOFF.into()),
            attempts: vec![retired(1, "2026-12-05T10:00:00Z")],
            ..CloudPodBindingStatus::default()
        };
        let now = at("2026-12-05T10:00:04Z");
        assert_eq!(rerent_wait(&status, now), Some(Duration::from_secs(6)));
        assert_eq!(rerent_wait(&status, at("2026-12-05T10:00:10Z")), None);

        // The second replacement waits 20 s from the second retirement.
        status.attempts.push(retired(2, "2026-12-05T10:01:00Z"));
        let now = at("2026-12-05T10:01:05Z");
        assert_eq!(rerent_wait(&status, now), Some(Duration::from_secs(15)));

        // A binding replaced for a lost machine is rented again at once.
        status.reason = Some("Replacing".into());
        assert_eq!(rerent_wait(&status, now), None);
    }
}
