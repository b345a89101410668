//! Attempts between the broker's form ([`Attempt`]) and the binding's ([`AttemptRecord`]): the
//! binding is where attempts survive a restart, and the broker reads them back as history. The
//! binding keeps the latest [`MAX_LISTED_ATTEMPTS`]; older finished ones are folded into per
//! provider, outcome and class tallies, so a Pod that waits for days keeps a small binding that
//! still says what was refused, how often and when.

use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use neocloud_core::{Attempt, AttemptOutcome, FailureClass, ProviderId};

use neocloud_api::{
    AttemptOutcome as RecordOutcome, AttemptRecord, AttemptTally, CloudPodBindingStatus,
};

/// How many attempts a binding lists; older ones are tallied.
pub const MAX_LISTED_ATTEMPTS: usize = 20;

/// The code the broker gives a refusal by the cluster budget guard.
pub const BUDGET_EXCEEDED_CODE: &str = "budget-exceeded";

/// The binding's record of a broker attempt. `finished_at` is set once the outcome is known.
pub fn to_record(a: &Attempt, now: DateTime<Utc>) -> AttemptRecord {
    let (outcome, failure_class, message, finished_at) = match &a.outcome {
        AttemptOutcome::InFlight => (RecordOutcome::InFlight, None, None, None),
        AttemptOutcome::Rented { .. } => (RecordOutcome::Created, None, None, Some(rfc3339(now))),
        AttemptOutcome::Failed {
            class,
            code,
            message,
        } => {
            let message = match code {
                Some(code) => format!("{message} [{code}]"),
                None => message.clone(),
            };
            (
                RecordOutcome::Failed,
                Some(class.label().to_owned()),
                Some(message),
                Some(rfc3339(now)),
            )
        }
    };
    AttemptRecord {
        number: a.number,
        provider: a.provider.as_str().to_owned(),
        offer_id: a.offer_id.clone(),
        price_per_hour: a.price_per_hour,
        started_at: rfc3339(a.started_at),
        finished_at,
        outcome,
        failure_class,
        message,
        action: None,
        decided_by: None,
        decision: None,
        retried: None,
    }
}

/// Adds or updates (same number) an attempt, keeping what was decided after it and the requests
/// retried within it, then folds the
/// oldest finished attempts beyond [`MAX_LISTED_ATTEMPTS`] into the tallies.
pub fn upsert(status: &mut CloudPodBindingStatus, record: AttemptRecord) {
    match status
        .attempts
        .iter_mut()
        .find(|a| a.number == record.number)
    {
        Some(existing) => {
            let decided = (
                existing.action.take(),
                existing.decided_by.take(),
                existing.decision.take(),
            );
            let retried = existing.retried.take();
            *existing = record;
            (existing.action, existing.decided_by, existing.decision) = decided;
            existing.retried = existing.retried.take().or(retried);
        }
        None => status.attempts.push(record),
    }
    fold(status);
}

/// Folds the oldest finished attempts into the tallies until at most [`MAX_LISTED_ATTEMPTS`]
/// are listed (an attempt still in flight is never folded).
pub fn fold(status: &mut CloudPodBindingStatus) {
    while status.attempts.len() > MAX_LISTED_ATTEMPTS {
        let Some(i) = status
            .attempts
            .iter()
            .position(|a| a.outcome != RecordOutcome::InFlight)
        else {
            return;
        };
        let old = status.attempts.remove(i);
        tally(&mut status.attempt_tally, &old);
    }
}

fn tally(tallies: &mut Vec<AttemptTally>, a: &AttemptRecord) {
    let same = |t: &&mut AttemptTally| {
        t.provider == a.provider && t.outcome == a.outcome && t.failure_class == a.failure_class
    };
    match tallies.iter_mut().find(same) {
        Some(t) => {
            t.count += 1;
            if a.started_at < t.first_at {
                t.first_at = a.started_at.clone();
            }
            if a.started_at >= t.last_at {
                t.last_at = a.started_at.clone();
                t.last_message = a.message.clone();
            }
        }
        None => tallies.push(AttemptTally {
            provider: a.provider.clone(),
            outcome: a.outcome,
            failure_class: a.failure_class.clone(),
            count: 1,
            first_at: a.started_at.clone(),
            last_at: a.started_at.clone(),
            last_message: a.message.clone(),
        }),
    }
}

/// How many attempts (listed or tallied) failed with one of `classes`.
pub fn count_failed(status: &CloudPodBindingStatus, classes: &[&str]) -> usize {
    let is = |c: &Option<String>| c.as_deref().is_some_and(|c| classes.contains(&c));
    let listed = status
        .attempts
        .iter()
        .filter(|a| is(&a.failure_class))
        .count();
    let tallied: u32 = status
        .attempt_tally
        .iter()
        .filter(|t| is(&t.failure_class))
        .map(|t| t.count)
        .sum();
    listed + tallied as usize
}

/// The broker's view of a recorded attempt, for history. Records the node cannot read back
/// (an unknown provider or class, a bad time) are skipped: history informs policies, it does not
/// drive recovery (recovery looks instances up by name on every provider attempted).
pub fn from_record(r: &AttemptRecord, instance_id: Option<&str>) -> Option<Attempt> {
    let provider = ProviderId::from_str(&r.provider).ok()?;
    let started_at = DateTime::parse_from_rfc3339(&r.started_at)
        .ok()?
        .with_timezone(&Utc);
    let outcome = match r.outcome {
        RecordOutcome::InFlight => AttemptOutcome::InFlight,
        RecordOutcome::Created => AttemptOutcome::Rented {
            instance_id: instance_id.unwrap_or_default().to_owned(),
        },
        RecordOutcome::Failed => AttemptOutcome::Failed {
            class: r
                .failure_class
                .as_deref()
                .and_then(|c| FailureClass::from_str(c).ok())
                .unwrap_or(FailureClass::Transient),
            code: None,
            message: r.message.clone().unwrap_or_default(),
        },
    };
    Some(Attempt {
        number: r.number,
        provider,
        offer_id: r.offer_id.clone(),
        price_per_hour: r.price_per_hour,
        started_at,
        outcome,
    })
}

/// Every provider an attempt was ever made on (listed or tallied), tallied ones first: where an
/// instance of unknown fate may live.
pub fn attempted_providers(status: &CloudPodBindingStatus) -> Vec<ProviderId> {
    let tallied = status.attempt_tally.iter().map(|t| t.provider.as_str());
    let listed = status.attempts.iter().map(|r| r.provider.as_str());
    let mut out = Vec::new();
    for name in tallied.chain(listed) {
        if let Ok(p) = ProviderId::from_str(name)
            && !out.contains(&p)
        {
            out.push(p);
        }
    }
    out
}

/// Whether the last attempt was refused by the cluster budget guard.
pub fn ended_over_budget(attempts: &[Attempt]) -> bool {
    matches!(
        attempts.last().map(|a| &a.outcome),
        Some(AttemptOutcome::Failed { code: Some(code), .. }) if code == BUDGET_EXCEEDED_CODE
    )
}

/// The CamelCase reason for a failure class, as Pods and bindings show it (`Capacity`,
/// `RateLimited`...).
pub fn class_reason(class: FailureClass) -> String {
    class
        .label()
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// RFC 3339 with seconds, UTC.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(outcome: AttemptOutcome) -> Attempt {
        Attempt {
            number: 2,
            provider: ProviderId::Vast,
            offer_id: "o-7".into(),
            price_per_hour: 0.4,
            started_at: DateTime::parse_from_rfc3339("2026-12-03T07:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
            outcome,
        }
    }

    #[test]
    fn a_failed_attempt_round_trips_with_its_class_and_message() {
        let a = attempt(AttemptOutcome::Failed {
            class: FailureClass::Capacity,
            code: Some("3907".into()),
            message: "no capacity".into(),
        });
        let r = to_record(&a, Utc::now());
        assert_eq!(r.failure_class.as_deref(), Some("capacity"));
        assert_eq!(r.message.as_deref(), Some("no capacity [3907]"));
        assert!(r.finished_at.is_some());
        let back = from_record(&r, None).unwrap();
        assert_eq!(back.failure(), Some(FailureClass::Capacity));
        assert_eq!(back.started_at, a.started_at);
        assert_eq!((back.number, back.provider), (2, ProviderId::Vast));
    }

    #[test]
    fn an_in_flight_attempt_has_no_finish_time() {
        let r = to_record(&attempt(AttemptOutcome::InFlight), Utc::now());
        assert_eq!(r.outcome, RecordOutcome::InFlight);
        assert_eq!(r.finished_at, None);
    }

    #[test]
    fn attempted_providers_are_listed_once_in_order() {
        let mut a = to_record(&attempt(AttemptOutcome::InFlight), Utc::now());
        let mut b = a.clone();
        b.provider = "runpod".into();
        let c = a.clone();
        a.provider = "vast".into();
        let status = CloudPodBindingStatus {
            attempts: vec![a, b, c],
            ..CloudPodBindingStatus::default()
        };
        assert_eq!(
            attempted_providers(&status),
            vec![ProviderId::Vast, ProviderId::Runpod]
        );
    }

    fn failed(number: u32, provider: &str, class: &str, at: &str) -> AttemptRecord {
        AttemptRecord {
            number,
            provider: provider.into(),
            offer_id: format!("o{number}"),
            price_per_hour: 0.4,
            started_at: at.into(),
            finished_at: Some(at.into()),
            outcome: RecordOutcome::Failed,
            failure_class: Some(class.into()),
            message: Some(format!("refusal {number}")),
            action: None,
            decided_by: None,
            decision: None,
            retried: None,
        }
    }

    #[test]
    fn a_thousand_refusals_keep_the_latest_twenty_and_tally_the_rest() {
        let mut status = CloudPodBindingStatus::default();
        for n in 1..=1000u32 {
            let provider = if n % 2 == 0 { "vast" } else { "runpod" };
            let at = format!(
                "2026-12-03T{:02}:{:02}:{:02}Z",
                n / 3600,
                (n / 60) % 60,
                n % 60
            );
            upsert(&mut status, failed(n, provider, "price-exceeded", &at));
        }
        assert_eq!(status.attempts.len(), MAX_LISTED_ATTEMPTS);
        assert_eq!(status.attempts[0].number, 981);
        assert_eq!(status.attempt_tally.len(), 2, "{:?}", status.attempt_tally);
        let total: u32 = status.attempt_tally.iter().map(|t| t.count).sum();
        assert_eq!(total, 980);
        let runpod = &status.attempt_tally[0];
        assert_eq!(runpod.provider, "runpod");
        assert_eq!(runpod.first_at, "2026-12-03T00:00:01Z");
        assert_eq!(runpod.last_message.as_deref(), Some("refusal 979"));
        assert_eq!(count_failed(&status, &["price-exceeded"]), 1000);
        assert_eq!(
            attempted_providers(&status),
            vec![ProviderId::Runpod, ProviderId::Vast]
        );
        let size = serde_json::to_vec(&status).unwrap().len();
        assert!(size < 16 * 1024, "{size} bytes");
    }

    #[test]
    fn an_attempt_in_flight_is_never_folded_and_updates_keep_the_decision() {
        let mut status = CloudPodBindingStatus::default();
        let mut first = to_record(&attempt(AttemptOutcome::InFlight), Utc::now());
        first.number = 1;
        upsert(&mut status, first.clone());
        status.attempts[0].action = Some("next-offer".into());
        for n in 2..=30 {
            upsert(
                &mut status,
                failed(n, "vast", "capacity", "2026-12-03T07:00:00Z"),
            );
        }
        assert_eq!(status.attempts[0].number, 1, "in flight stays listed");
        assert_eq!(status.attempts.len(), MAX_LISTED_ATTEMPTS);
        first.outcome = RecordOutcome::Created;
        upsert(&mut status, first);
        assert_eq!(status.attempts[0].outcome, RecordOutcome::Created);
        assert_eq!(status.attempts[0].action.as_deref(), Some("next-offer"));
    }

    #[test]
    fn budget_refusals_are_recognised_by_their_code() {
        let over = attempt(AttemptOutcome::Failed {
            class: FailureClass::PriceExceeded,
            code: Some(BUDGET_EXCEEDED_CODE.into()),
            message: "over budget".into(),
        });
        assert!(ended_over_budget(&[over]));
        let price = attempt(AttemptOutcome::Failed {
            class: FailureClass::PriceExceeded,
            code: None,
            message: "price rose".into(),
        });
        assert!(!ended_over_budget(&[price]));
    }

    #[test]
    fn reasons_are_camel_case_class_labels() {
        assert_eq!(class_reason(FailureClass::Capacity), "Capacity");
        assert_eq!(class_reason(FailureClass::RateLimited), "RateLimited");
        assert_eq!(class_reason(FailureClass::PriceExceeded), "PriceExceeded");
    }
}
