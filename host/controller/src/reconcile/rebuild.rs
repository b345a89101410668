//! Rebuilding the cluster budget and the cost ledger from the bindings when a process starts to
//! lead, before it rents anything: every binding with a live instance counts at its recorded
//! price from the time it was rented, and every binding whose last attempt was still in flight
//! counts at that attempt's price (the instance may exist) until placing it again finds out. A
//! new leader can then never spend the cluster cap a second time.
//!
//! Not for finding instances (placing looks them up by name) nor for releasing anything.

use chrono::{DateTime, Utc};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use neocloud_broker::Renter;

use super::NODE_LABEL;
use super::release::binding_key;
use neocloud_api::{
    AttemptOutcome, AttemptRecord, BindingPhase, CloudPodBinding, CloudPodBindingStatus,
};

/// What a rebuild counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rebuilt {
    /// Bindings with a live instance.
    pub running: usize,
    /// Bindings whose last attempt was in flight.
    pub in_flight: usize,
    /// Their total, USD per hour.
    pub usd_per_hour: f64,
}

/// How a binding counts against the budget.
#[derive(Debug, Clone, PartialEq)]
enum Counted {
    /// A live instance at this price, billed since this time.
    Running(f64, DateTime<Utc>),
    /// A rental in flight at this price.
    InFlight(f64),
}

/// Lists node `node`'s bindings and counts them into `renter`'s budget and ledger.
pub async fn rebuild_budget(
    client: &Client,
    node: &str,
    renter: &Renter,
) -> Result<Rebuilt, kube::Error> {
    let api: Api<CloudPodBinding> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
        .await?;
    let mut rebuilt = Rebuilt::default();
    for b in &list.items {
        let Some(counted) = b.status.as_ref().and_then(count) else {
            continue;
        };
        let key = binding_key(b);
        match counted {
            Counted::Running(price, since) => {
                renter.budget.record_existing(&key, price);
                renter.ledger.start(&key, price, since);
                rebuilt.running += 1;
                rebuilt.usd_per_hour += price;
            }
            Counted::InFlight(price) => {
                renter.budget.record_existing(&key, price);
                rebuilt.in_flight += 1;
                rebuilt.usd_per_hour += price;
            }
        }
        tracing::debug!(binding = %key, pod_uid = %b.spec.pod_uid, name = %b.name_any(), ?counted, "counted into the budget");
    }
    Ok(rebuilt)
}

/// How one binding's status counts, if it does.
fn count(s: &CloudPodBindingStatus) -> Option<Counted> {
    // A binding reaches these phases only once its instances are confirmed gone.
    if matches!(
        s.phase,
        BindingPhase::Released | BindingPhase::Failed | BindingPhase::Succeeded
    ) {
        return None;
    }
    let created = s
        .attempts
        .iter()
        .rev()
        .find(|a| a.outcome == AttemptOutcome::Created);
    if s.instance_id.is_some() {
        let price = s
            .price_per_hour
            .or(created.map(|a| a.price_per_hour))
            .unwrap_or(0.0);
        let since = created
            .and_then(|a| a.finished_at.as_deref())
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map_or_else(Utc::now, |t| t.with_timezone(&Utc));
        return Some(Counted::Running(price, since));
    }
    rental_in_flight(s).map(|a| Counted::InFlight(a.price_per_hour))
}

/// The binding's last attempt when it may have rented something the binding does not name yet:
/// in flight, or created before the instance was written down (a crash between the two).
pub(super) fn rental_in_flight(s: &CloudPodBindingStatus) -> Option<&AttemptRecord> {
    s.attempts.iter().max_by_key(|a| a.number).filter(|a| {
        matches!(
            a.outcome,
            AttemptOutcome::InFlight | AttemptOutcome::Created
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use neocloud_api::AttemptRecord;

    fn attempt(number: u32, outcome: AttemptOutcome, price: f64) -> AttemptRecord {
        AttemptRecord {
            number,
            provider: "vast".into(),
            offer_id: "1".into(),
            price_per_hour: price,
            started_at: "2026-12-03T07:00:00Z".into(),
            finished_at: (outcome != AttemptOutcome::InFlight)
                .then(|| "2026-12-03T07:00:05Z".into()),
            outcome,
            failure_class: None,
            message: None,
            action: None,
            decided_by: None,
            decision: None,
            retried: None,
        }
    }

    #[test]
    fn a_live_instance_counts_at_its_recorded_price_since_it_was_rented() {
        let s = CloudPodBindingStatus {
            phase: BindingPhase::Running,
            instance_id: Some("v-1".into()),
            price_per_hour: Some(0.44),
            attempts: vec![attempt(1, AttemptOutcome::Created, 0.4)],
            ..Default::default()
        };
        let since = DateTime::parse_from_rfc3339("2026-12-03T07:00:05Z").unwrap();
        assert_eq!(
            count(&s),
            Some(Counted::Running(0.44, since.with_timezone(&Utc)))
        );
    }

    #[test]
    fn a_rental_in_flight_counts_at_its_attempt_price() {
        let s = CloudPodBindingStatus {
            phase: BindingPhase::Provisioning,
            attempts: vec![
                attempt(1, AttemptOutcome::Failed, 0.3),
                attempt(2, AttemptOutcome::InFlight, 0.5),
            ],
            ..Default::default()
        };
        assert_eq!(count(&s), Some(Counted::InFlight(0.5)));
    }

    #[test]
    fn ended_or_refused_bindings_do_not_count() {
        let released = CloudPodBindingStatus {
            phase: BindingPhase::Released,
            instance_id: Some("v-1".into()),
            attempts: vec![attempt(1, AttemptOutcome::Created, 0.4)],
            ..Default::default()
        };
        assert_eq!(count(&released), None);
        let refused = CloudPodBindingStatus {
            phase: BindingPhase::Pending,
            attempts: vec![attempt(1, AttemptOutcome::Failed, 0.4)],
            ..Default::default()
        };
        assert_eq!(count(&refused), None);
    }
}
