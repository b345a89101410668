//! How many GPUs the node advertises (`nvidia.com/gpu`): none when no provider offers any,
//! otherwise as many as the remaining cluster budget buys at the cheapest price per GPU on
//! offer. The node's configured ceiling is applied on top (in the Node status).

use neocloud_core::Offer;

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

    #[test]
    fn a_budget_of_exactly_three_gpus_buys_three() {
        let offers = [offer(1, 0.4)];
        assert_eq!(gpus_within_budget(&offers, Some(1.2)), 3);
        assert_eq!(gpus_within_budget(&offers, Some(1.2 - 0.8)), 1);
    }
}
