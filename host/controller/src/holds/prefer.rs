//! A consuming Pod's preference for the place its ProvisioningRequest was planned in: offers
//! of that provider and region rank above every other, in the order the Pod's own ranking gives
//! them. A preference, not a constraint: if the market moved and nothing is left there, the Pod
//! is placed as any other. A gang member is confined to its gang's place instead
//! ([`confine`]): all members in one provider and region, or none.

use std::sync::Arc;

use neocloud_broker::{OfferFilter, OfferRanker, Planner, PolicyError};
use neocloud_core::{Attempt, Offer, WorkloadSpec};

use super::HeldPlace;

/// What is added to the score of an offer in the held place: more than any ranking spreads its
/// scores in practice (prices, reliabilities, CEL scores of that order).
const BONUS: f64 = 1.0e6;

/// `planner` ranking offers in `place` first.
pub fn prefer(mut planner: Planner, place: HeldPlace) -> Planner {
    planner.ranker = Arc::new(PreferPlace {
        inner: planner.ranker,
        place,
    });
    planner
}

/// `planner` accepting only offers in `place`, on top of what it accepted before.
pub fn confine(mut planner: Planner, place: HeldPlace) -> Planner {
    planner.filter = Arc::new(InPlace {
        inner: planner.filter,
        place,
    });
    planner
}

#[derive(Debug)]
struct InPlace {
    inner: Arc<dyn OfferFilter>,
    place: HeldPlace,
}

impl OfferFilter for InPlace {
    fn accepts(
        &self,
        w: &WorkloadSpec,
        o: &Offer,
        attempts: &[Attempt],
    ) -> Result<bool, PolicyError> {
        if !self.place.holds(o) {
            return Ok(false);
        }
        self.inner.accepts(w, o, attempts)
    }
}

#[derive(Debug)]
struct PreferPlace {
    inner: Arc<dyn OfferRanker>,
    place: HeldPlace,
}

impl PreferPlace {
    fn bonus(&self, o: &Offer) -> f64 {
        if self.place.holds(o) { BONUS } else { 0.0 }
    }
}

impl OfferRanker for PreferPlace {
    fn rank(
        &self,
        w: &WorkloadSpec,
        offers: &[&Offer],
        attempts: &[Attempt],
    ) -> Result<Vec<f64>, PolicyError> {
        let scores = self.inner.rank(w, offers, attempts)?;
        Ok(scores
            .into_iter()
            .zip(offers)
            .map(|(s, o)| s + self.bonus(o))
            .collect())
    }

    fn score(&self, w: &WorkloadSpec, o: &Offer, attempts: &[Attempt]) -> Result<f64, PolicyError> {
        Ok(self.inner.score(w, o, attempts)? + self.bonus(o))
    }
}

#[cfg(test)]
mod tests {
    use neocloud_broker::PlanInput;
    use neocloud_core::ProviderId;

    use super::*;

    fn offer(id: &str, region: &str, price: f64) -> Offer {
        Offer {
            region: region.into(),
            ..neocloud_fixtures::offer(ProviderId::Runpod, id, "A40", price)
        }
    }

    /// The ids of the offers `wrap(planner, CA-MTL-1)` plans, in its order, and its explanation.
    fn planned(wrap: fn(Planner, HeldPlace) -> Planner) -> (Vec<String>, String) {
        let offers = [offer("eu", "EU-SE-1", 0.30), offer("ca", "CA-MTL-1", 0.40)];
        let place = HeldPlace {
            provider: ProviderId::Runpod,
            region: "CA-MTL-1".into(),
        };
        let planner = wrap(Planner::default(), place);
        let w = neocloud_fixtures::workload();
        let input = PlanInput {
            workload: &w,
            offers: &offers,
            attempts: &[],
            enabled: &[],
            skipped: &[],
            now: chrono::Utc::now(),
        };
        let plan = planner.plan(&input).unwrap();
        let ids = plan.candidates.iter().map(|c| c.offer.id.clone()).collect();
        (ids, plan.explanation)
    }

    #[test]
    fn offers_in_the_held_place_come_first_even_when_dearer() {
        let (ids, explanation) = planned(prefer);
        assert_eq!(ids, ["ca", "eu"], "{explanation}");
    }

    #[test]
    fn a_confined_planner_keeps_only_offers_in_the_place() {
        let (ids, explanation) = planned(confine);
        assert_eq!(ids, ["ca"], "{explanation}");
    }
}
