//! Holding again, on a new leader, what an earlier leader held. A request this node answered
//! `Provisioned` (reason `BudgetHeld`) keeps its hold across a leader change until it ends:
//! the answer's class details carry the place, each Pod's price and the booking's end, and the
//! Pods that consume the request and exist already took theirs.
//!
//! Not the first decision (`decide`), nor expiry and release (`controller`'s sweep, which
//! expires a restored booking past its end as any other).

use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use neocloud_core::ProviderId;

use super::controller::Provisioner;
use super::types::ProvisioningRequest;
use super::{CONSUME_ANNOTATION, HeldPlace};

/// The class detail with the booking's end (RFC 3339, UTC).
pub const BOOKED_UNTIL: &str = "BookedUntil";
/// The class detail with each Pod's price, USD per hour, comma-separated.
pub const POD_USD_PER_HOUR: &str = "PodUsdPerHour";

/// `until` as [`BOOKED_UNTIL`] says it.
pub fn instant(until: &DateTime<Utc>) -> String {
    until.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Prices as [`POD_USD_PER_HOUR`] says them (each as it reads back exactly).
pub fn prices(usd: impl Iterator<Item = f64>) -> String {
    usd.map(|p| p.to_string()).collect::<Vec<_>>().join(",")
}

/// Whether something ended the request after its answer: it failed, its booking expired, or
/// its capacity was revoked.
pub fn ended(req: &ProvisioningRequest) -> bool {
    ["Failed", "BookingExpired", "CapacityRevoked"]
        .iter()
        .any(|t| req.is_true(t))
}

/// A booking a request's status records.
#[derive(Debug, PartialEq)]
pub(super) struct Booked {
    pub place: HeldPlace,
    pub prices: Vec<f64>,
    pub until: DateTime<Utc>,
}

/// The booking `req`'s status records if node `node` holds it and nothing ended it; `Err` says
/// which class detail cannot be read, and its value.
pub(super) fn booked(req: &ProvisioningRequest, node: &str) -> Result<Option<Booked>, String> {
    let Some(status) = req.status.as_ref() else {
        return Ok(None);
    };
    let held = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Provisioned" && c.status == "True" && c.reason == "BudgetHeld");
    let details = &status.provisioning_class_details;
    let detail = |name: &str| details.get(name).map(String::as_str).unwrap_or_default();
    let ours =
        detail("NodeName") == node && req.uid().is_some_and(|uid| detail("RequestKey") == uid);
    if !held || ended(req) || !ours {
        return Ok(None);
    }
    let bad = |name: &str| format!("provisioningClassDetails.{name}: {:?}", detail(name));
    let provider = detail("Provider")
        .parse::<ProviderId>()
        .map_err(|_| bad("Provider"))?;
    let region = detail("Region").to_owned();
    if region.is_empty() {
        return Err(bad("Region"));
    }
    let until = DateTime::parse_from_rfc3339(detail(BOOKED_UNTIL))
        .map_err(|_| bad(BOOKED_UNTIL))?
        .with_timezone(&Utc);
    let prices = detail(POD_USD_PER_HOUR)
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .ok()
                .filter(|p| p.is_finite() && *p >= 0.0)
        })
        .collect::<Option<Vec<f64>>>()
        .ok_or_else(|| bad(POD_USD_PER_HOUR))?;
    Ok(Some(Booked {
        place: HeldPlace { provider, region },
        prices,
        until,
    }))
}

impl Provisioner {
    /// Holds again what `req`'s status says this node held, less what its existing Pods took.
    /// Budget past the cap is not held (and said in the log): those Pods reserve their own when
    /// they come, as Pods of no request do.
    pub(super) async fn restore(&self, req: &ProvisioningRequest) -> kube::Result<()> {
        let key = super::key(req);
        let booked = match booked(req, self.reconciler.node_name()) {
            Ok(Some(booked)) => booked,
            Ok(None) => return Ok(()),
            Err(why) => {
                tracing::warn!(request = %key, %why,
                    "cannot hold a provisioned request again after a leader change; its pods \
                     reserve their own budget when they come");
                return Ok(());
            }
        };
        let pods: Api<Pod> =
            Api::namespaced(self.client.clone(), &req.namespace().unwrap_or_default());
        let name = req.name_any();
        let consumers = |list: Vec<Pod>| -> Vec<String> {
            list.into_iter()
                .filter(|p| p.annotations().get(CONSUME_ANNOTATION) == Some(&name))
                .filter_map(|p| p.uid())
                .collect()
        };
        let took = consumers(pods.list(&ListParams::default()).await?.items);
        let budget = &self.reconciler.renter().budget;
        let mut reservations = Vec::new();
        for usd in booked.prices.iter().skip(took.len()) {
            match budget.reserve(*usd) {
                Ok(r) => reservations.push(r),
                Err(over) => {
                    tracing::warn!(request = %key, %over,
                        "cannot hold all of a provisioned request's budget again after a \
                         leader change; its other pods reserve their own when they come");
                    break;
                }
            }
        }
        let usd_per_hour = reservations
            .iter()
            .fold(0.0, |sum, r| sum + r.usd_per_hour());
        let left = (booked.until - Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO);
        let (uid, took_before) = (req.uid().unwrap_or_default(), took.len());
        self.holds.restore(
            &key,
            &uid,
            booked.place,
            reservations,
            took,
            Instant::now() + left,
        );
        // A Pod that came while this was being listed found no hold to take from: it takes now.
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for pod in consumers(list.items) {
                self.holds.take(&key, &pod);
            }
        }
        tracing::info!(request = %key, usd_per_hour, took_before, untaken = self.holds.untaken(&key),
            until = %instant(&booked.until),
            "budget held again for a provisioned request (held by an earlier leader)");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn req(reason: &str, details: &[(&str, &str)], more: &[(&str, &str)]) -> ProvisioningRequest {
        let mut conditions = vec![json!({"type": "Provisioned", "status": "True",
            "reason": reason, "message": "", "lastTransitionTime": "2026-12-06T10:00:00Z"})];
        for (type_, status) in more {
            conditions.push(json!({"type": type_, "status": status, "reason": "R",
                "message": "", "lastTransitionTime": "2026-12-06T10:00:00Z"}));
        }
        let mut all: BTreeMap<&str, &str> = BTreeMap::from([
            ("NodeName", "vn"),
            ("RequestKey", "u1"),
            ("Provider", "runpod"),
            ("Region", "CA-MTL-1"),
            (BOOKED_UNTIL, "2026-12-06T10:10:00Z"),
            (POD_USD_PER_HOUR, "0.4,0.45"),
        ]);
        all.extend(details.iter().copied());
        serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u1"},
            "spec": {"provisioningClassName": super::super::CLASS, "podSets": []},
            "status": {"conditions": conditions, "provisioningClassDetails": all},
        }))
        .unwrap()
    }

    #[test]
    fn a_booking_reads_back_as_it_was_written() {
        let until = "2026-12-06T10:10:00Z".parse::<DateTime<Utc>>().unwrap();
        let written = prices([0.4, 0.45, 1.0 / 3.0].into_iter());
        let r = req("BudgetHeld", &[(POD_USD_PER_HOUR, &written)], &[]);
        let booked = booked(&r, "vn").unwrap().unwrap();
        assert_eq!(booked.prices, vec![0.4, 0.45, 1.0 / 3.0]);
        assert_eq!(booked.until, until);
        assert_eq!(instant(&until), "2026-12-06T10:10:00Z");
        assert_eq!(booked.place.provider, ProviderId::Runpod);
        assert_eq!(booked.place.region, "CA-MTL-1");
    }

    #[test]
    fn only_a_live_budget_hold_of_this_node_and_this_request_is_taken_up() {
        let live = |r: &ProvisioningRequest| booked(r, "vn").unwrap().is_some();
        assert!(live(&req("BudgetHeld", &[], &[])));
        assert!(
            !live(&req("CapacityAvailable", &[], &[])),
            "a check holds nothing"
        );
        assert!(!live(&req("BudgetHeld", &[("NodeName", "other")], &[])));
        assert!(
            !live(&req("BudgetHeld", &[("RequestKey", "u0")], &[])),
            "made again"
        );
        for ended in ["BookingExpired", "Failed", "CapacityRevoked"] {
            assert!(
                !live(&req("BudgetHeld", &[], &[(ended, "True")])),
                "{ended}"
            );
        }
        assert!(live(&req(
            "BudgetHeld",
            &[],
            &[("BookingExpired", "False")]
        )));
    }

    #[test]
    fn a_detail_that_cannot_be_read_is_named_with_its_value() {
        for (name, value) in [
            ("Provider", "aws"),
            ("Region", ""),
            (BOOKED_UNTIL, "tomorrow"),
            (POD_USD_PER_HOUR, "0.4,-1"),
            (POD_USD_PER_HOUR, "0.4,NaN"),
            (POD_USD_PER_HOUR, ""),
        ] {
            let e = booked(&req("BudgetHeld", &[(name, value)], &[]), "vn").unwrap_err();
            assert_eq!(e, format!("provisioningClassDetails.{name}: {value:?}"));
        }
    }
}
