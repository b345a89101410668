//! Planning a group of Pods at once (a ProvisioningRequest's pod sets, a gang's members): from
//! each pod set's planned candidates (the broker's planner, run per pod set) to the places — one
//! provider and one region each — whose offers cover every Pod of the group at once, best
//! first; and the budget of a place reserved for all its Pods or none ([`Place::reserve`]).
//!
//! Pure but for the budget guard: it fetches nothing. An offer that names one machine
//! (`machine_id`, as Vast's asks do) is used for one Pod at most; other offers (a GPU type in a
//! data center) do not say how many machines they have left, and are taken as enough.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use neocloud_broker::{BudgetExceeded, BudgetGuard, Candidate, Reservation};
use neocloud_core::ProviderId;

/// One pod set, planned.
#[derive(Debug, Clone)]
pub struct PlannedSet<'a> {
    /// What the set is, for messages: `PodTemplate` (a ProvisioningRequest's) or `gang member`.
    pub noun: &'a str,
    /// The PodTemplate's or the member's name, for messages.
    pub template: &'a str,
    /// How many Pods.
    pub count: u32,
    /// The planner's candidates, best first (every eligible one, not a cut).
    pub candidates: &'a [Candidate],
    /// Why the planner found nothing, when it did not.
    pub explanation: &'a str,
}

/// What one Pod would rent.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    /// Which pod set it belongs to.
    pub set: usize,
    /// The offer's id.
    pub offer_id: String,
    /// The GPU, as the offer names it.
    pub gpu: String,
    /// What it costs per hour: the bid for spot, the price otherwise.
    pub usd_per_hour: f64,
}

/// A provider and region that covers every Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    /// The provider.
    pub provider: ProviderId,
    /// The region, as the provider names it.
    pub region: String,
    /// One per Pod, pod set by pod set.
    pub picks: Vec<Pick>,
}

impl Place {
    /// The burn rate of every Pod together, USD per hour.
    pub fn usd_per_hour(&self) -> f64 {
        self.picks.iter().map(|p| p.usd_per_hour).sum()
    }

    /// `runpod CA-MTL-1: 4x NVIDIA A40 at $0.4000/h`, GPUs and prices grouped.
    pub fn describe(&self) -> String {
        let mut groups: BTreeMap<(String, String), u32> = BTreeMap::new();
        for p in &self.picks {
            *groups
                .entry((p.gpu.clone(), format!("{:.4}", p.usd_per_hour)))
                .or_default() += 1;
        }
        let parts: Vec<String> = groups
            .into_iter()
            .map(|((gpu, usd), n)| format!("{n}x {gpu} at ${usd}/h"))
            .collect();
        format!("{} {}: {}", self.provider, self.region, parts.join(", "))
    }

    /// One reservation per Pod, all or none; refused with the budget's figures and the place's
    /// whole price as `requested`.
    pub fn reserve(&self, budget: &Arc<BudgetGuard>) -> Result<Vec<Reservation>, BudgetExceeded> {
        let mut held = Vec::with_capacity(self.picks.len());
        for pick in &self.picks {
            match budget.reserve(pick.usd_per_hour) {
                Ok(r) => held.push(r),
                Err(_) => {
                    drop(held);
                    return Err(BudgetExceeded {
                        cap: budget.cap_usd_per_hour().unwrap_or(f64::INFINITY),
                        running: budget.running_usd_per_hour(),
                        in_flight: budget.in_flight_usd_per_hour(),
                        requested: self.usd_per_hour(),
                    });
                }
            }
        }
        Ok(held)
    }
}

/// Why no place covers the request.
#[derive(Debug, Clone, PartialEq)]
pub enum NoPlace {
    /// A pod set has no candidate at all.
    NoOffer {
        /// The pod set, as `PodTemplate ppt-main` or `gang member w-0`.
        template: String,
        /// The planner's explanation.
        explanation: String,
    },
    /// Candidates exist, but no one provider and region has enough of them for every Pod.
    NoRegion {
        /// What each region lacks.
        message: String,
    },
}

impl NoPlace {
    /// The condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            NoPlace::NoOffer { .. } => "NoOffer",
            NoPlace::NoRegion { .. } => "NotEnoughCapacity",
        }
    }

    /// The condition's message.
    pub fn message(&self) -> String {
        match self {
            NoPlace::NoOffer {
                template,
                explanation,
            } => format!("no offer for the pods of {template}: {explanation}"),
            NoPlace::NoRegion { message } => {
                format!("not enough capacity in any one provider and region: {message}")
            }
        }
    }
}

type Region = (ProviderId, String);

/// Every place that covers all Pods, in the order the planner prefers them (the place of the
/// best-ranked candidate of the first pod set first, then by total price).
pub fn places(sets: &[PlannedSet<'_>]) -> Result<Vec<Place>, NoPlace> {
    if let Some(empty) = sets.iter().find(|s| s.candidates.is_empty()) {
        return Err(NoPlace::NoOffer {
            template: format!("{} {}", empty.noun, empty.template),
            explanation: empty.explanation.to_owned(),
        });
    }
    let mut regions: Vec<(usize, Region)> = Vec::new();
    for (rank, c) in sets[0].candidates.iter().enumerate() {
        let region = (c.offer.provider, c.offer.region.clone());
        if !regions.iter().any(|(_, r)| *r == region) {
            regions.push((rank, region));
        }
    }
    let mut found = Vec::new();
    let mut short = Vec::new();
    for (rank, region) in regions {
        match cover(sets, &region) {
            Ok(picks) => found.push((
                rank,
                Place {
                    provider: region.0,
                    region: region.1,
                    picks,
                },
            )),
            Err(lack) => short.push(lack),
        }
    }
    if found.is_empty() {
        short.truncate(3);
        return Err(NoPlace::NoRegion {
            message: short.join("; "),
        });
    }
    found.sort_by(|(ra, a), (rb, b)| {
        ra.cmp(rb)
            .then_with(|| a.usd_per_hour().total_cmp(&b.usd_per_hour()))
    });
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// One pick per Pod in `region`, each pod set taking its candidates there best first; or what
/// the region lacks.
fn cover(sets: &[PlannedSet<'_>], region: &Region) -> Result<Vec<Pick>, String> {
    let mut used: HashSet<&str> = HashSet::new();
    let mut picks = Vec::new();
    for (i, set) in sets.iter().enumerate() {
        let here = set
            .candidates
            .iter()
            .filter(|c| c.offer.provider == region.0 && c.offer.region == region.1);
        let mut got = 0;
        for c in here {
            let one_machine = c.offer.machine_id.is_some();
            while got < set.count {
                if one_machine && !used.insert(c.offer.id.as_str()) {
                    break;
                }
                picks.push(Pick {
                    set: i,
                    offer_id: c.offer.id.clone(),
                    gpu: c.offer.gpu.name().to_owned(),
                    usd_per_hour: c.bid_per_hour.unwrap_or(c.offer.rent_price_per_hour()),
                });
                got += 1;
                if one_machine {
                    break;
                }
            }
        }
        if got < set.count {
            return Err(format!(
                "{} {} has {got} of the {} machines {} {} needs",
                region.0, region.1, set.count, set.noun, set.template
            ));
        }
    }
    Ok(picks)
}

#[cfg(test)]
mod tests {
    use neocloud_core::Offer;

    use super::*;

    fn candidate(
        provider: ProviderId,
        id: &str,
        region: &str,
        price: f64,
        machine: bool,
    ) -> Candidate {
        Candidate {
            offer: Offer {
                region: region.into(),
                machine_id: machine.then_some(7),
                ..neocloud_fixtures::offer(provider, id, "A40", price)
            },
            score: -price,
            max_price_per_hour: price,
            bid_per_hour: None,
        }
    }

    fn set<'a>(count: u32, candidates: &'a [Candidate]) -> PlannedSet<'a> {
        PlannedSet {
            noun: "PodTemplate",
            template: "ppt-main",
            count,
            candidates,
            explanation: "no offer has 8 GPUs",
        }
    }

    #[test]
    fn all_pods_go_to_one_region_and_a_type_offer_serves_many() {
        let c = [
            candidate(ProviderId::Runpod, "a40/eu", "EU-SE-1", 0.39, false),
            candidate(ProviderId::Runpod, "a40/ca", "CA-MTL-1", 0.40, false),
        ];
        let found = places(&[set(4, &c)]).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].region, "EU-SE-1");
        assert_eq!(found[0].picks.len(), 4);
        assert!((found[0].usd_per_hour() - 1.56).abs() < 1e-9);
        assert!(
            found[0].describe().contains("4x A40 at $0.3900/h"),
            "{}",
            found[0].describe()
        );
    }

    #[test]
    fn machines_are_used_once_and_a_short_region_is_skipped() {
        let c = [
            candidate(ProviderId::Vast, "1", "Austin, US", 0.30, true),
            candidate(ProviderId::Vast, "2", "Austin, US", 0.31, true),
            candidate(ProviderId::Vast, "3", "Oslo, NO", 0.35, true),
            candidate(ProviderId::Vast, "4", "Oslo, NO", 0.36, true),
            candidate(ProviderId::Vast, "5", "Oslo, NO", 0.37, true),
        ];
        let found = places(&[set(3, &c)]).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].region, "Oslo, NO");
        let ids: Vec<_> = found[0].picks.iter().map(|p| p.offer_id.as_str()).collect();
        assert_eq!(ids, ["3", "4", "5"]);
    }

    #[test]
    fn two_pod_sets_share_a_region_s_machines() {
        let c = [
            candidate(ProviderId::Vast, "1", "Austin, US", 0.30, true),
            candidate(ProviderId::Vast, "2", "Austin, US", 0.31, true),
        ];
        assert!(places(&[set(1, &c), set(1, &c)]).is_ok());
        let e = places(&[set(1, &c), set(2, &c)]).unwrap_err();
        assert_eq!(e.reason(), "NotEnoughCapacity");
        assert!(
            e.message()
                .contains("vast Austin, US has 1 of the 2 machines"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn a_pod_set_without_candidates_is_no_offer_with_the_planner_s_reason() {
        let c = [candidate(
            ProviderId::Runpod,
            "a40/ca",
            "CA-MTL-1",
            0.40,
            false,
        )];
        let e = places(&[set(1, &c), set(1, &[])]).unwrap_err();
        assert_eq!(e.reason(), "NoOffer");
        assert!(
            e.message()
                .contains("PodTemplate ppt-main: no offer has 8 GPUs"),
            "{}",
            e.message()
        );
    }
}
