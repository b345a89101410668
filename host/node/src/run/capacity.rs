//! How many GPUs the node advertises (`nvidia.com/gpu`): none when no provider offers any,
//! otherwise the GPUs of the Pods already bound to it (the scheduler subtracts those from what
//! the node advertises, and the budget already pays for the ones that run) plus as many as the
//! rest of the cluster budget buys at the cheapest price per GPU on offer. Budget held for a
//! ProvisioningRequest counts as buyable here: it is held for the request's own Pods, which the
//! scheduler must still be able to place. Budget held for a gang does not: its members are
//! bound already, so it counts as spent from the moment it is held, and the advertised GPUs
//! drop with it. The node's configured ceiling is applied on top (in the Node status).

use k8s_openapi::api::core::v1::Pod;
use neocloud_broker::BudgetGuard;
use neocloud_core::Offer;
use neocloud_kube_target::capacity::pod_gpus;

/// What the node advertises: `bound` GPUs of its Pods, plus what `remaining_usd_per_hour` and
/// `held_usd_per_hour` buy (see the module doc); 0 without offers.
pub fn advertised_gpus(
    offers: &[Offer],
    bound: u32,
    remaining_usd_per_hour: Option<f64>,
    held_usd_per_hour: f64,
) -> u32 {
    let buyable = gpus_within_budget(
        offers,
        remaining_usd_per_hour.map(|r| r + held_usd_per_hour),
    );
    if buyable == 0 && offers.iter().all(|o| o.gpu_count == 0) {
        return 0;
    }
    buyable.saturating_add(bound)
}

/// What is left of the cluster budget, USD per hour: the cap less what runs and what is in
/// flight (rentals under way and every hold, a gang's and a ProvisioningRequest's); `None`
/// without a cap.
pub fn remaining_usd_per_hour(budget: &BudgetGuard) -> Option<f64> {
    budget
        .cap_usd_per_hour()
        .map(|cap| cap - budget.running_usd_per_hour() - budget.in_flight_usd_per_hour())
}

/// The GPUs the scheduler counts against the node for `pods` (bound to it): those of the Pods
/// that have not ended, counted as the scheduler counts them (`pod_gpus`, which a remote
/// cluster's capacity uses too).
pub fn bound_gpus<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> u32 {
    pods.into_iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .map(pod_gpus)
        .fold(0u32, u32::saturating_add)
}

/// GPUs rentable now: 0 without offers; without a budget, `u32::MAX` (the ceiling decides);
/// with one, what `remaining_usd_per_hour` buys at the cheapest USD per GPU-hour.
pub fn gpus_within_budget(offers: &[Offer], remaining_usd_per_hour: Option<f64>) -> u32 {
    let cheapest = offers
        .iter()
        .filter(|o| o.gpu_count > 0)
        .map(|o| o.rent_price_per_hour() / f64::from(o.gpu_count))
        .filter(|p| p.is_finite() && *p >= 0.0)
        .min_by(f64::total_cmp);
    match (cheapest, remaining_usd_per_hour) {
        (None, _) => 0,
        (Some(_), None) => u32::MAX,
        (Some(_), Some(left)) if left <= 0.0 => 0,
        (Some(0.0), Some(_)) => u32::MAX,
        (Some(p), Some(left)) => {
            // A hair over, so that a budget of exactly n GPUs buys n: $1.20 / $0.40 is
            // 2.9999999999999996 in floating point.
            let n = (left / p + 1e-9).floor();
            if n >= f64::from(u32::MAX) {
                u32::MAX
            } else {
                n as u32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use neocloud_core::{GpuModel, OfferCapacity, ProviderId};

    use super::*;

    fn offer(gpus: u32, price: f64) -> Offer {
        Offer {
            provider: ProviderId::Fake,
            id: format!("o-{gpus}-{price}"),
            gpu: GpuModel::from_provider("A40", None),
            gpu_count: gpus,
            price_per_hour: price,
            capacity: OfferCapacity::OnDemand,
            region: "r".into(),
            reliability: None,
            verified: true,
            disk_gib: None,
            machine_id: None,
            runpod_cloud: None,
            expires_at: None,
        }
    }

    #[test]
    fn no_offers_means_no_gpus_whatever_the_budget() {
        assert_eq!(gpus_within_budget(&[], None), 0);
        assert_eq!(gpus_within_budget(&[], Some(100.0)), 0);
    }

    #[test]
    fn the_budget_buys_gpus_at_the_cheapest_price_per_gpu() {
        // 8x at $4/h is $0.50 per GPU, cheaper than 1x at $0.80.
        let offers = [offer(1, 0.8), offer(8, 4.0)];
        assert_eq!(gpus_within_budget(&offers, Some(10.0)), 20);
        assert_eq!(gpus_within_budget(&offers, Some(0.49)), 0);
        assert_eq!(gpus_within_budget(&offers, Some(-1.0)), 0);
        assert_eq!(gpus_within_budget(&offers, None), u32::MAX);
    }

    fn pod(gpus: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "main",
                "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn the_gpus_of_bound_pods_are_advertised_beside_what_the_rest_of_the_budget_buys() {
        // $1.60/h buys four A40s; two run ($0.80 spent) and stay counted, as the scheduler
        // subtracts them: four in all, two free. Counting only what the rest buys (2) would
        // leave the scheduler none.
        let offers = [offer(1, 0.4)];
        let pods = [
            pod("1", "Running"),
            pod("1", "Pending"),
            pod("2", "Succeeded"),
        ];
        let bound = bound_gpus(&pods);
        assert_eq!(bound, 2, "an ended Pod's GPUs are free");
        assert_eq!(advertised_gpus(&offers, bound, Some(1.6 - 0.8), 0.0), 4);
        // Two held for a ProvisioningRequest's Pods stay advertised for them.
        assert_eq!(advertised_gpus(&offers, 0, Some(1.6 - 0.8), 0.8), 4);
        // No offers: nothing, whatever is bound.
        assert_eq!(advertised_gpus(&[], 2, Some(10.0), 0.0), 0);
        // Without a budget: the ceiling decides.
        assert_eq!(advertised_gpus(&offers, 2, None, 0.0), u32::MAX);
        // Spent past the cap (an adopted instance): the bound GPUs only.
        assert_eq!(advertised_gpus(&offers, 3, Some(-0.4), 0.0), 3);
    }

    #[test]
    fn a_gang_s_held_budget_counts_as_spent_and_the_advertised_gpus_drop_with_it() {
        use std::time::{Duration, Instant};

        use neocloud_controller::holds::HeldPlace;
        use neocloud_controller::holds::gangs::Gangs;
        use neocloud_controller::holds::regions::{Pick, Place};

        let offers = [offer(1, 0.4)];
        let budget = BudgetGuard::new(Some(2.0));
        let gangs = Gangs::new();
        assert_eq!(
            advertised_gpus(&offers, 0, remaining_usd_per_hour(&budget), 0.0),
            5
        );
        let pick = Pick {
            set: 0,
            offer_id: "o".into(),
            gpu: "A40".into(),
            usd_per_hour: 0.4,
        };
        let place = Place {
            provider: ProviderId::Fake,
            region: "r".into(),
            picks: vec![pick; 4],
        };
        let held = HeldPlace {
            provider: ProviderId::Fake,
            region: "r".into(),
        };
        let reservations = place.reserve(&budget).unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        let key = "gang:team-a/train";
        gangs
            .holds()
            .hold(key, "team-a/train", held, reservations, until);
        // The node adds back only what is held for ProvisioningRequests, never a gang's hold.
        let remaining = remaining_usd_per_hour(&budget);
        assert_eq!(advertised_gpus(&offers, 0, remaining, 0.0), 1);
        assert!((gangs.usd_per_hour() - 1.6).abs() < 1e-9);
        // A member that takes its share reserves its own in its place: still one.
        gangs.holds().take(key, "w-0");
        let own = budget.reserve(0.4).unwrap();
        assert_eq!(
            advertised_gpus(&offers, 0, remaining_usd_per_hour(&budget), 0.0),
            1
        );
        // The gang released: the budget buys five again.
        gangs.holds().release(key);
        drop(own);
        assert_eq!(
            advertised_gpus(&offers, 0, remaining_usd_per_hour(&budget), 0.0),
            5
        );
    }

    #[test]
    fn a_budget_of_exactly_three_gpus_buys_three() {
        let offers = [offer(1, 0.4)];
        assert_eq!(gpus_within_budget(&offers, Some(1.2)), 3);
        assert_eq!(gpus_within_budget(&offers, Some(1.2 - 0.8)), 1);
    }
}
