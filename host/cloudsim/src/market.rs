//! The market behind one simulator: offers with GPU type, region, price, spot minimum bid,
//! reliability and remaining capacity. Renting reserves capacity; terminating releases it.
//!
//! Not the wire shape of any provider's catalog: each provider module renders offers itself.

use serde::Serialize;

use crate::config::OfferConfig;

/// An offer and its remaining capacity.
#[derive(Debug, Clone, Serialize)]
pub struct Offer {
    /// Stable id (the Vast ask id; internal on RunPod and Lambda).
    pub id: u64,
    /// Remaining capacity (RunPod: GPUs; others: instances).
    pub available: u32,
    /// The offer as configured.
    #[serde(flatten)]
    pub config: OfferConfig,
}

impl Offer {
    /// The minimum spot bid, if the offer can be rented as spot.
    pub fn min_bid(&self) -> Option<f64> {
        self.config.spot_price_per_hour
    }
}

/// All offers of one simulator.
#[derive(Debug, Default)]
pub struct Market {
    offers: Vec<Offer>,
}

impl Market {
    /// Builds a market; offers without an id get `first_id`, `first_id + 1`, ...
    pub fn new(configs: Vec<OfferConfig>, first_id: u64) -> Self {
        let offers = configs
            .into_iter()
            .enumerate()
            .map(|(index, config)| Offer {
                id: config.id.unwrap_or(first_id + index as u64),
                available: config.capacity,
                config,
            })
            .collect();
        Self { offers }
    }

    /// Every offer, including exhausted ones.
    pub fn offers(&self) -> &[Offer] {
        &self.offers
    }

    /// The offer with this id.
    pub fn get(&self, id: u64) -> Option<&Offer> {
        self.offers.iter().find(|offer| offer.id == id)
    }

    /// Takes `units` of capacity from an offer; false if there is not enough.
    pub fn reserve(&mut self, id: u64, units: u32) -> bool {
        match self.offers.iter_mut().find(|offer| offer.id == id) {
            Some(offer) if offer.available >= units => {
                offer.available -= units;
                true
            }
            _ => false,
        }
    }

    /// Gives capacity back to an offer (no-op if the offer vanished).
    pub fn release(&mut self, id: u64, units: u32) {
        if let Some(offer) = self.offers.iter_mut().find(|offer| offer.id == id) {
            offer.available = (offer.available + units).min(offer.config.capacity.max(units));
        }
    }

    /// Sets an offer's remaining capacity; false if there is no such offer.
    pub fn set_capacity(&mut self, id: u64, available: u32) -> bool {
        match self.offers.iter_mut().find(|offer| offer.id == id) {
            Some(offer) => {
                offer.available = available;
                true
            }
            None => false,
        }
    }

    /// Sets an offer's price and spot minimum bid (`None`: not rentable as spot); false if there
    /// is no such offer. Instances already rented keep the price they were rented at.
    pub fn set_price(
        &mut self,
        id: u64,
        price_per_hour: f64,
        spot_price_per_hour: Option<f64>,
    ) -> bool {
        match self.offers.iter_mut().find(|offer| offer.id == id) {
            Some(offer) => {
                offer.config.price_per_hour = price_per_hour;
                offer.config.spot_price_per_hour = spot_price_per_hour;
                true
            }
            None => false,
        }
    }

    /// Removes an offer, as when another customer rents it; false if there is no such offer.
    pub fn remove(&mut self, id: u64) -> bool {
        let before = self.offers.len();
        self.offers.retain(|offer| offer.id != id);
        self.offers.len() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(capacity: u32) -> OfferConfig {
        serde_json::from_value(serde_json::json!({
            "gpu": "RTX 4090", "region": "Austin, US", "price_per_hour": 0.4, "capacity": capacity
        }))
        .unwrap()
    }

    #[test]
    fn reserving_more_than_the_remaining_capacity_fails_and_takes_nothing() {
        let mut market = Market::new(vec![offer(2)], 10);
        assert!(market.reserve(10, 2));
        assert!(!market.reserve(10, 1));
        market.release(10, 1);
        assert_eq!(market.get(10).unwrap().available, 1);
    }

    #[test]
    fn a_removed_offer_cannot_be_reserved() {
        let mut market = Market::new(vec![offer(1)], 7);
        assert!(market.remove(7));
        assert!(!market.reserve(7, 1));
    }
}
