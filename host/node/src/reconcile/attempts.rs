//! Attempts between the broker's form ([`Attempt`]) and the binding's ([`AttemptRecord`]): the
//! binding is where attempts survive a restart, and the broker reads them back as history.

use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use neocloud_core::{Attempt, AttemptOutcome, FailureClass, ProviderId};

use crate::crd::{AttemptOutcome as RecordOutcome, AttemptRecord};

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
    }
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

/// Every provider an attempt was made on, in first-attempt order: where an instance of unknown
/// fate may live.
pub fn attempted_providers(records: &[AttemptRecord]) -> Vec<ProviderId> {
    let mut out = Vec::new();
    for r in records {
        if let Ok(p) = ProviderId::from_str(&r.provider)
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
        assert_eq!(
            attempted_providers(&[a, b, c]),
            vec![ProviderId::Vast, ProviderId::Runpod]
        );
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
