//! Gangs without Kueue: Pods that name a gang ([`GANG_ANNOTATION`]) and its size
//! ([`GANG_SIZE_ANNOTATION`]) are rented all together, in one provider and one region, or not
//! at all. This module holds what is pure about it: the annotations read, and each gang's state
//! from one round of renting to the next ([`Gang`]), kept in a table ([`Gangs`]) beside the
//! budget held for the gangs planned and not yet rented (a [`Holds`] of their own: it counts
//! against the budget, and so against the GPUs the node advertises, from the moment it is
//! held).
//!
//! Not here: waiting for the members, planning them and renting (`reconcile::gangs`, which
//! uses the group planning of [`super::regions`] and confines each member to the gang's place
//! with [`super::confine`]). The table lives in memory: after a restart, members already rented
//! keep their instances, and the members still to rent are planned again as a gang of their
//! own.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::{HeldPlace, Holds};

/// The annotation naming a Pod's gang: every Pod of the namespace that names the same gang is a
/// member of it.
pub const GANG_ANNOTATION: &str = "cloud.aibrix.ai/gang";

/// The annotation giving the gang's size: how many members it waits for before it rents.
pub const GANG_SIZE_ANNOTATION: &str = "cloud.aibrix.ai/gang-size";

/// The largest gang the node rents.
pub const MAX_GANG_SIZE: u32 = 64;

/// A gang as one member's annotations name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangSpec {
    /// The gang's name, unique within the namespace.
    pub name: String,
    /// How many members it has.
    pub size: u32,
}

/// The gang `annotations` name, `None` when they name none; an error names the annotation and
/// its value.
pub fn gang_of(annotations: &BTreeMap<String, String>) -> Result<Option<GangSpec>, String> {
    let name = annotations.get(GANG_ANNOTATION);
    let size = annotations.get(GANG_SIZE_ANNOTATION);
    let at = |a: &str| format!("metadata.annotations[{a}]");
    let (name, size) = match (name, size) {
        (None, None) => return Ok(None),
        (Some(n), None) => {
            return Err(format!(
                "{}: gang {n:?} has no size: set {GANG_SIZE_ANNOTATION} too",
                at(GANG_SIZE_ANNOTATION)
            ));
        }
        (None, Some(s)) => {
            return Err(format!(
                "{}: a size ({s:?}) without a gang: set {GANG_ANNOTATION} too",
                at(GANG_ANNOTATION)
            ));
        }
        (Some(n), Some(s)) => (n.trim(), s.trim()),
    };
    if name.is_empty() || name.len() > 253 {
        return Err(format!(
            "{}: {name:?} is not a gang name (1 to 253 characters)",
            at(GANG_ANNOTATION)
        ));
    }
    let size = match size.parse::<u32>() {
        Ok(0) => Err("must be at least 1"),
        Ok(n) if n > MAX_GANG_SIZE => Err("is more than the 64 members a gang may have"),
        Ok(n) => Ok(n),
        Err(_) => Err("is not a whole number of members"),
    }
    .map_err(|why| format!("{}: {size:?} {why}", at(GANG_SIZE_ANNOTATION)))?;
    Ok(Some(GangSpec {
        name: name.to_owned(),
        size,
    }))
}

/// Where a gang is between rounds of renting.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum GangState {
    /// Not planned: its members wait for it to be complete, or it is planned next.
    #[default]
    Open,
    /// Planned in `place`, its budget held: each member rents there, and only there.
    Renting {
        /// The gang's provider and region.
        place: HeldPlace,
    },
    /// A member's rental failed: the members rented in the round are released, and the gang is
    /// planned again once they are and `until` has passed.
    Broken {
        /// When it may be planned again.
        until: Instant,
        /// What failed.
        why: String,
    },
}

/// One gang's state. Pure: the reconciler does the planning, renting and releasing.
#[derive(Debug, Default)]
pub struct Gang {
    /// The current round of renting; each plan starts a new one.
    pub round: u64,
    /// Where it is.
    pub state: GangState,
    /// The members that have, or may have (a rental in flight), an instance, by Pod UID, with
    /// the round they rented in.
    busy: HashMap<String, u64>,
    /// The places of rounds that broke, the latest last: the next plan tries others first.
    tried: Vec<HeldPlace>,
}

impl Gang {
    /// Starts a round of renting in `place`; returns its number.
    pub fn start(&mut self, place: HeldPlace) -> u64 {
        self.round += 1;
        self.state = GangState::Renting { place };
        self.round
    }

    /// A member about to rent: the round and the place, while the gang is renting.
    pub fn take(&mut self, uid: &str) -> Option<(u64, HeldPlace)> {
        let GangState::Renting { place } = &self.state else {
            return None;
        };
        self.busy.insert(uid.to_owned(), self.round);
        Some((self.round, place.clone()))
    }

    /// A member's rental in `round` failed (nothing of it is rented): the gang breaks if that
    /// round is the current one. Whether it broke now (and the caller must release the rest).
    pub fn failed(&mut self, uid: &str, round: u64, until: Instant, why: String) -> bool {
        self.busy.remove(uid);
        let current = round == self.round && matches!(self.state, GangState::Renting { .. });
        if current {
            let broken = GangState::Broken { until, why };
            if let GangState::Renting { place } = std::mem::replace(&mut self.state, broken) {
                self.tried.retain(|t| *t != place);
                self.tried.push(place);
            }
        }
        current
    }

    /// How far back `provider` and `region` come in the next plan: 0 for a place no broken
    /// round used, then the place that broke longest ago first (a gang's "next offer").
    pub fn tried_rank(&self, provider: neocloud_core::ProviderId, region: &str) -> usize {
        self.tried
            .iter()
            .position(|t| t.provider == provider && t.region == region)
            .map_or(0, |i| i + 1)
    }

    /// A member has no instance any more (released, or gone with its Pod).
    pub fn released(&mut self, uid: &str) {
        self.busy.remove(uid);
    }

    /// Whether a member's instance belongs to a round that broke or ended: it must be released.
    pub fn stale(&self, uid: &str) -> bool {
        self.busy
            .get(uid)
            .is_some_and(|r| *r != self.round || matches!(self.state, GangState::Broken { .. }))
    }

    /// Whether the gang may be planned at `now`: open, or broken with every member of the
    /// broken round released and the wait over. Otherwise what it still waits for.
    pub fn may_plan(&self, now: Instant) -> Result<(), String> {
        match &self.state {
            GangState::Open => Ok(()),
            GangState::Renting { .. } => Err("it is renting".to_owned()),
            GangState::Broken { .. } if !self.busy.is_empty() => Err(format!(
                "{} member(s) rented before the failure are being released",
                self.busy.len()
            )),
            GangState::Broken { until, .. } if *until > now => Err(format!(
                "renting again in {}s",
                (*until - now).as_secs() + 1
            )),
            GangState::Broken { .. } => Ok(()),
        }
    }
}

/// One gang's entry: its state, and a lock taken while it is planned (so that its members do
/// not plan it twice at once).
#[derive(Debug, Default)]
pub struct GangEntry {
    /// Its state; held only between awaits.
    pub state: Mutex<Gang>,
    /// Held while the gang is planned.
    pub planning: tokio::sync::Mutex<()>,
}

/// Every gang of the node's Pods, by `namespace/name`, and the budget held for them.
#[derive(Debug)]
pub struct Gangs {
    table: Mutex<HashMap<String, Arc<GangEntry>>>,
    holds: Arc<Holds>,
}

impl Default for Gangs {
    fn default() -> Self {
        Gangs {
            table: Mutex::default(),
            holds: Holds::new(None),
        }
    }
}

impl Gangs {
    /// An empty table.
    pub fn new() -> Arc<Gangs> {
        Arc::new(Gangs::default())
    }

    /// The entry of gang `key` (`namespace/name`), made empty the first time.
    pub fn entry(&self, key: &str) -> Arc<GangEntry> {
        Arc::clone(self.table.lock().entry(key.to_owned()).or_default())
    }

    /// The entry of gang `key`, if it has one.
    pub fn get(&self, key: &str) -> Option<Arc<GangEntry>> {
        self.table.lock().get(key).cloned()
    }

    /// The budget held for gangs planned and not yet rented.
    pub fn holds(&self) -> &Arc<Holds> {
        &self.holds
    }

    /// Releases the holds whose members did not all take their share in time (they went away):
    /// the budget is not held for Pods that will not come.
    pub fn expire(&self, now: Instant) {
        for (key, _) in self.holds.expired(now) {
            self.holds.release(&key);
            tracing::info!(gang = %key, "the gang's members did not take its held budget in time; released");
        }
    }

    /// Everything held for gangs, USD per hour.
    pub fn usd_per_hour(&self) -> f64 {
        self.holds.usd_per_hour()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use neocloud_core::ProviderId;

    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<GangSpec>, String> {
        gang_of(&annotations(pairs))
    }

    #[test]
    fn a_gang_and_its_size_are_read_from_the_annotations() {
        let spec = parse(&[(GANG_ANNOTATION, "train-1"), (GANG_SIZE_ANNOTATION, " 4 ")]);
        let want = GangSpec {
            name: "train-1".into(),
            size: 4,
        };
        assert_eq!(spec, Ok(Some(want)));
        assert_eq!(parse(&[("cloud.aibrix.ai/gpu-type", "A40")]), Ok(None));
        let most = parse(&[(GANG_ANNOTATION, "g"), (GANG_SIZE_ANNOTATION, "64")]);
        assert_eq!(most.unwrap().unwrap().size, MAX_GANG_SIZE);
    }

    #[test]
    fn bad_sizes_are_errors_that_name_the_annotation_and_the_value() {
        for (value, why) in [
            ("0", "\"0\" must be at least 1"),
            ("four", "\"four\" is not a whole number"),
            ("-2", "\"-2\" is not a whole number"),
            ("65", "\"65\" is more than the 64 members"),
            ("99999999999", "\"99999999999\" is not a whole number"),
        ] {
            let e = parse(&[(GANG_ANNOTATION, "g"), (GANG_SIZE_ANNOTATION, value)]).unwrap_err();
            assert!(
                e.starts_with("metadata.annotations[cloud.aibrix.ai/gang-size]: "),
                "{e}"
            );
            assert!(e.contains(why), "{value}: {e}");
        }
    }

    #[test]
    fn a_gang_without_a_size_or_a_size_without_a_gang_is_an_error() {
        let e = parse(&[(GANG_ANNOTATION, "g")]).unwrap_err();
        assert!(
            e.contains("[cloud.aibrix.ai/gang-size]: gang \"g\" has no size"),
            "{e}"
        );
        let e = parse(&[(GANG_SIZE_ANNOTATION, "4")]).unwrap_err();
        assert!(
            e.contains("[cloud.aibrix.ai/gang]: a size (\"4\") without a gang"),
            "{e}"
        );
        let e = parse(&[(GANG_ANNOTATION, " "), (GANG_SIZE_ANNOTATION, "4")]).unwrap_err();
        assert!(e.contains("\"\" is not a gang name"), "{e}");
    }

    fn place() -> HeldPlace {
        HeldPlace {
            provider: ProviderId::Runpod,
            region: "CA-MTL-1".into(),
        }
    }

    #[test]
    fn a_failed_member_breaks_the_round_and_the_rest_are_released_before_it_plans_again() {
        let mut g = Gang::default();
        let now = Instant::now();
        assert_eq!(g.may_plan(now), Ok(()));
        assert_eq!(g.take("a"), None, "an open gang rents nothing");
        let round = g.start(place());
        assert_eq!(g.take("a"), Some((round, place())));
        assert_eq!(g.take("b"), Some((round, place())));
        assert!(g.may_plan(now).is_err(), "a renting gang is not planned");
        assert!(!g.stale("a"));
        let later = now + Duration::from_secs(5);
        assert!(g.failed("c", round, later, "capacity".into()));
        assert!(g.stale("a") && g.stale("b"), "the round's rentals go");
        assert_eq!(g.tried_rank(ProviderId::Runpod, "CA-MTL-1"), 1);
        assert_eq!(g.tried_rank(ProviderId::Runpod, "EU-SE-1"), 0);
        assert!(!g.stale("c"));
        assert_eq!(g.take("d"), None, "a broken gang rents nothing");
        let waits = g.may_plan(later).unwrap_err();
        assert!(waits.contains("2 member(s)"), "{waits}");
        g.released("a");
        g.released("b");
        assert!(g.may_plan(now).unwrap_err().contains("renting again in"));
        assert_eq!(g.may_plan(later), Ok(()));
        let next = g.start(place());
        assert_eq!(next, round + 1);
        assert!(
            !g.failed("late", round, later, "old".into()),
            "a failure of an earlier round breaks nothing"
        );
        assert!(matches!(g.state, GangState::Renting { .. }));
    }

    #[test]
    fn a_hold_its_members_never_take_is_released_when_it_expires() {
        let budget = neocloud_broker::BudgetGuard::new(Some(2.0));
        let gangs = Gangs::new();
        let now = Instant::now();
        let held = vec![budget.reserve(0.4).unwrap(), budget.reserve(0.4).unwrap()];
        gangs.holds().hold(
            "gang:ns/late",
            "ns/late",
            place(),
            held,
            now + Duration::from_secs(600),
        );
        gangs.expire(now);
        assert!((gangs.usd_per_hour() - 0.8).abs() < 1e-9, "not yet");
        gangs.expire(now + Duration::from_secs(601));
        assert_eq!(gangs.usd_per_hour(), 0.0);
        assert_eq!(budget.in_flight_usd_per_hour(), 0.0);
    }

    #[test]
    fn a_member_rented_in_an_earlier_round_is_stale() {
        let mut g = Gang::default();
        let first = g.start(place());
        g.take("a");
        g.start(place());
        assert!(g.stale("a"), "rented in round {first}");
        g.take("a");
        assert!(!g.stale("a"));
        assert!(!g.stale("never-rented"));
    }
}
