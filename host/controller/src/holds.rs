//! The budget held for admitted ProvisioningRequests, by request (`namespace/name`): one budget
//! [`Reservation`] per Pod, which counts against the cluster budget as a rental in flight does
//! (for every other request and Pod; the GPUs it pays for stay advertised for the request's own
//! Pods, see the node's `run::capacity`), and the place it was planned in. A Pod that consumes
//! the request takes one reservation just before it reserves its own budget, so the two never
//! count twice.
//!
//! A request may also hold machines rented ahead of its Pods ([`HeldMachine`], each a binding
//! labelled [`HELD_LABEL`] whose runner waits for a Pod): a Pod that consumes the request takes
//! one ([`Holds::take_machine_for`]) instead of renting, and the machine's budget, committed when
//! it was rented, moves to the Pod's binding. Not the ProvisioningRequest controller that holds
//! (`neocloud-provisioning`): the Pod controller takes holds, so they are kept below both.

pub mod gangs;
mod prefer;
pub mod regions;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use neocloud_broker::Reservation;
use neocloud_core::ProviderId;
use neocloud_telemetry::metrics::Metrics;

pub use prefer::{confine, prefer};

/// The annotation Kueue puts on the Pods of an admitted Workload: the ProvisioningRequest they
/// consume, whose hold each takes.
pub const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";
use parking_lot::Mutex;

/// The label of a binding rented ahead for a ProvisioningRequest: the request's UID. Such a
/// binding has no Pod (its `spec.podName` is empty) until a Pod takes its machine.
pub const HELD_LABEL: &str = "cloud.aibrix.ai/held-for";

/// A machine rented ahead of its Pod for a request: its binding and what a Pod that takes it
/// writes into its own binding.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldMachine {
    /// The held binding's namespace.
    pub namespace: String,
    /// The held binding's name.
    pub binding: String,
    /// The held binding's `spec.podUid`: its runner's identity until a Pod takes it.
    pub slot: String,
    /// Its provider.
    pub provider: ProviderId,
    /// Its instance.
    pub instance_id: String,
    /// The offer it was rented from.
    pub offer_id: String,
    /// What it costs, USD per hour.
    pub usd_per_hour: f64,
    /// The image it was rented for (a container provider starts the container from it).
    pub image: String,
    /// Its GPUs.
    pub gpu_count: u32,
}

impl HeldMachine {
    /// The broker's key of the held binding: `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.binding)
    }
}

/// Where a request's Pods were planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPlace {
    /// The provider.
    pub provider: ProviderId,
    /// The region.
    pub region: String,
}

impl HeldPlace {
    /// Whether `offer` is in this provider and region.
    pub fn holds(&self, offer: &neocloud_core::Offer) -> bool {
        offer.provider == self.provider && offer.region == self.region
    }
}

#[derive(Debug)]
struct Held {
    uid: String,
    place: HeldPlace,
    reservations: Vec<Reservation>,
    /// Machines rented ahead and not taken yet.
    machines: Vec<HeldMachine>,
    takers: HashSet<String>,
    deadline: Instant,
}

impl Held {
    fn untaken(&self) -> usize {
        self.reservations.len() + self.machines.len()
    }
}

/// The table. Every method is safe to call concurrently.
#[derive(Debug, Default)]
pub struct Holds {
    table: Mutex<HashMap<String, Held>>,
    metrics: Option<Arc<Metrics>>,
}

impl Holds {
    /// A table that reports what it holds to `metrics`.
    pub fn new(metrics: Option<Arc<Metrics>>) -> Arc<Holds> {
        let holds = Holds {
            table: Mutex::default(),
            metrics,
        };
        holds.report(&holds.table.lock());
        Arc::new(holds)
    }

    /// Holds `reservations` for request `key` (its `uid`) until `deadline`, replacing what it
    /// held before (which is released).
    pub fn hold(
        &self,
        key: &str,
        uid: &str,
        place: HeldPlace,
        reservations: Vec<Reservation>,
        deadline: Instant,
    ) {
        self.restore(key, uid, place, reservations, Vec::new(), deadline);
    }

    /// [`Holds::hold`] for a request held before, by an earlier leader: the Pods `takers` (by
    /// UID) took theirs then, so they take nothing more, and `reservations` are the rest.
    pub fn restore(
        &self,
        key: &str,
        uid: &str,
        place: HeldPlace,
        reservations: Vec<Reservation>,
        takers: Vec<String>,
        deadline: Instant,
    ) {
        let mut table = self.table.lock();
        let held = Held {
            uid: uid.to_owned(),
            place,
            reservations,
            machines: Vec::new(),
            takers: takers.into_iter().collect(),
            deadline,
        };
        table.insert(key.to_owned(), held);
        self.report(&table);
    }

    /// For a Pod that consumes a request (its [`CONSUME_ANNOTATION`]): drops one of the
    /// request's reservations the first time this Pod asks, and returns where the request was
    /// planned. A Pod that asks again drops nothing more.
    pub fn take_for(&self, pod: &Pod) -> Option<HeldPlace> {
        let name = pod.annotations().get(CONSUME_ANNOTATION)?;
        let key = format!("{}/{name}", pod.namespace().unwrap_or_default());
        self.take(&key, &pod.uid().unwrap_or_default())
    }

    /// Adds a machine rented ahead for request `key` (the request with `uid`); its budget is
    /// the rental's (the reservation it replaces was dropped before it was rented, see
    /// [`Holds::drop_one`]). False, adding nothing, when the request holds nothing (it was
    /// released meanwhile: the machine is to be released).
    pub fn add_machine(&self, key: &str, uid: &str, machine: HeldMachine) -> bool {
        let mut table = self.table.lock();
        let Some(held) = table.get_mut(key).filter(|h| h.uid == uid) else {
            return false;
        };
        held.machines.push(machine);
        self.report(&table);
        true
    }

    /// Drops one reservation of request `key`, just before a machine is rented for it with a
    /// reservation of its own.
    pub fn drop_one(&self, key: &str) {
        let mut table = self.table.lock();
        if let Some(held) = table.get_mut(key) {
            drop(held.reservations.pop());
        }
        self.report(&table);
    }

    /// For a Pod that consumes a request: one of its machines rented ahead that `fits` it (its
    /// image and GPUs), the first time this Pod asks; `None` when none is left that fits (or
    /// none at all) or this Pod took one before.
    pub fn take_machine_for(
        &self,
        pod: &Pod,
        fits: impl Fn(&HeldMachine) -> bool,
    ) -> Option<HeldMachine> {
        let name = pod.annotations().get(CONSUME_ANNOTATION)?;
        let key = format!("{}/{name}", pod.namespace().unwrap_or_default());
        let uid = pod.uid().unwrap_or_default();
        let mut table = self.table.lock();
        let held = table.get_mut(&key)?;
        if held.takers.contains(&uid) {
            return None;
        }
        let at = held.machines.iter().position(fits)?;
        let machine = held.machines.remove(at);
        held.takers.insert(uid);
        self.report(&table);
        Some(machine)
    }

    /// Every machine held and not taken: its request's key and UID, and the machine.
    pub fn machines(&self) -> Vec<(String, String, HeldMachine)> {
        let table = self.table.lock();
        let each = table.iter().flat_map(|(key, h)| {
            (h.machines.iter()).map(move |m| (key.clone(), h.uid.clone(), m.clone()))
        });
        each.collect()
    }

    /// Drops the machine `slot` of request `key` (it was lost); whether it was there.
    pub fn remove_machine(&self, key: &str, slot: &str) -> bool {
        let mut table = self.table.lock();
        let Some(held) = table.get_mut(key) else {
            return false;
        };
        let before = held.machines.len();
        held.machines.retain(|m| m.slot != slot);
        let removed = held.machines.len() < before;
        self.report(&table);
        removed
    }

    /// Whether the request with `uid` holds anything (its machines are kept while it does).
    pub fn holds_uid(&self, uid: &str) -> bool {
        self.table.lock().values().any(|h| h.uid == uid)
    }

    /// [`Holds::take_for`] by request key and Pod UID.
    pub fn take(&self, key: &str, pod_uid: &str) -> Option<HeldPlace> {
        let mut table = self.table.lock();
        let held = table.get_mut(key)?;
        if held.takers.insert(pod_uid.to_owned()) {
            drop(held.reservations.pop());
        }
        let place = held.place.clone();
        self.report(&table);
        Some(place)
    }

    /// Releases what request `key` holds; whether it held anything.
    pub fn release(&self, key: &str) -> bool {
        let mut table = self.table.lock();
        let had = table.remove(key).is_some();
        self.report(&table);
        had
    }

    /// Releases what request `key` holds if it is the request with `uid` (a request deleted and
    /// made again under its name keeps the new one's hold).
    pub fn release_uid(&self, key: &str, uid: &str) -> bool {
        let mut table = self.table.lock();
        let had = table.get(key).is_some_and(|h| h.uid == uid);
        if had {
            table.remove(key);
        }
        self.report(&table);
        had
    }

    /// The requests whose booking ended at `now` with reservations still untaken, with the UID
    /// each was held for.
    pub fn expired(&self, now: Instant) -> Vec<(String, String)> {
        let table = self.table.lock();
        table
            .iter()
            .filter(|(_, h)| h.untaken() > 0 && h.deadline <= now)
            .map(|(k, h)| (k.clone(), h.uid.clone()))
            .collect()
    }

    /// Every request with an entry, and the UID it was held for.
    pub fn keys(&self) -> Vec<(String, String)> {
        let table = self.table.lock();
        table
            .iter()
            .map(|(k, h)| (k.clone(), h.uid.clone()))
            .collect()
    }

    /// Reservations and machines of request `key` not yet taken by a Pod.
    pub fn untaken(&self, key: &str) -> usize {
        self.table.lock().get(key).map_or(0, Held::untaken)
    }

    /// Everything held, USD per hour.
    pub fn usd_per_hour(&self) -> f64 {
        Self::sum(&self.table.lock())
    }

    fn sum(table: &HashMap<String, Held>) -> f64 {
        let reserved = table.values().flat_map(|h| h.reservations.iter());
        let rented = table.values().flat_map(|h| h.machines.iter());
        // From `0`: a float sum of nothing is `-0`, which the gauge would print as `-0.0`.
        (reserved.map(Reservation::usd_per_hour))
            .chain(rented.map(|m| m.usd_per_hour))
            .fold(0.0, |sum, usd| sum + usd)
    }

    fn report(&self, table: &HashMap<String, Held>) {
        if let Some(m) = &self.metrics {
            m.set_provisioning_held(Self::sum(table));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use neocloud_broker::BudgetGuard;
    use serde_json::json;

    use super::*;

    fn place() -> HeldPlace {
        HeldPlace {
            provider: ProviderId::Runpod,
            region: "CA-MTL-1".into(),
        }
    }

    fn reserve(budget: &Arc<BudgetGuard>, n: usize) -> Vec<Reservation> {
        (0..n).map(|_| budget.reserve(0.4).unwrap()).collect()
    }

    fn consumer(uid: &str, request: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": uid, "namespace": "team-a",
            "uid": uid, "annotations": {CONSUME_ANNOTATION: request}}}))
        .unwrap()
    }

    #[test]
    fn each_consuming_pod_takes_one_reservation_once() {
        let budget = BudgetGuard::new(Some(2.0));
        let holds = Holds::new(None);
        let at = Instant::now() + Duration::from_secs(600);
        holds.hold("team-a/req-1", "u1", place(), reserve(&budget, 4), at);
        assert!((budget.in_flight_usd_per_hour() - 1.6).abs() < 1e-9);
        assert!(
            budget.reserve(0.5).is_err(),
            "the hold counts against the budget"
        );
        assert_eq!(holds.take_for(&consumer("p1", "req-1")), Some(place()));
        assert_eq!(holds.take_for(&consumer("p1", "req-1")), Some(place()));
        assert_eq!(
            holds.untaken("team-a/req-1"),
            3,
            "a Pod asking twice takes one"
        );
        assert!((budget.in_flight_usd_per_hour() - 1.2).abs() < 1e-9);
        assert_eq!(holds.take_for(&consumer("p2", "other")), None);
        for p in ["p2", "p3", "p4", "p5"] {
            holds.take_for(&consumer(p, "req-1"));
        }
        assert_eq!(holds.untaken("team-a/req-1"), 0);
        assert_eq!(budget.in_flight_usd_per_hour(), 0.0);
    }

    #[test]
    fn expiry_lists_untaken_holds_and_release_frees_the_budget() {
        let budget = BudgetGuard::new(None);
        let holds = Holds::new(None);
        let now = Instant::now();
        holds.hold("ns/late", "u1", place(), reserve(&budget, 2), now);
        holds.hold("ns/taken", "u2", place(), reserve(&budget, 1), now);
        holds.take("ns/taken", "pod");
        holds.hold(
            "ns/early",
            "u3",
            place(),
            reserve(&budget, 1),
            now + Duration::from_secs(60),
        );
        assert_eq!(
            holds.expired(now),
            vec![("ns/late".to_owned(), "u1".to_owned())]
        );
        assert!(!holds.release_uid("ns/late", "other-uid"));
        assert!(holds.release_uid("ns/late", "u1"));
        assert!(holds.release("ns/early"));
        assert!(!holds.release("ns/early"));
        assert_eq!(holds.usd_per_hour(), 0.0);
        assert_eq!(budget.in_flight_usd_per_hour(), 0.0);
    }

    #[test]
    fn a_new_hold_of_the_same_request_replaces_the_old_one() {
        let budget = BudgetGuard::new(None);
        let holds = Holds::new(None);
        let at = Instant::now();
        holds.hold("ns/r", "u1", place(), reserve(&budget, 3), at);
        holds.hold("ns/r", "u2", place(), reserve(&budget, 1), at);
        assert!((budget.in_flight_usd_per_hour() - 0.4).abs() < 1e-9);
        assert!((holds.usd_per_hour() - 0.4).abs() < 1e-9);
    }

    #[test]
    fn nothing_held_reads_zero_not_minus_zero() {
        let metrics = Arc::new(Metrics::new());
        let holds = Holds::new(Some(metrics.clone()));
        let budget = BudgetGuard::new(None);
        holds.hold("ns/r", "u1", place(), reserve(&budget, 1), Instant::now());
        holds.release("ns/r");
        assert!(holds.usd_per_hour().is_sign_positive());
        let text = metrics.encode();
        assert!(
            text.contains("\nneocloud_provisioning_held_usd_per_hour 0.0\n"),
            "{text}"
        );
    }

    fn machine(n: usize) -> HeldMachine {
        HeldMachine {
            namespace: "team-a".into(),
            binding: format!("held-u1-{n}"),
            slot: format!("u1-{n}"),
            provider: ProviderId::Lambda,
            instance_id: format!("i-{n}"),
            offer_id: "o".into(),
            usd_per_hour: 0.75,
            image: "train:1".into(),
            gpu_count: 1,
        }
    }

    #[test]
    fn each_consuming_pod_takes_one_machine_once_and_untaken_machines_expire() {
        let budget = BudgetGuard::new(None);
        let metrics = Arc::new(Metrics::new());
        let holds = Holds::new(Some(metrics.clone()));
        let now = Instant::now();
        holds.hold("team-a/req-1", "u1", place(), reserve(&budget, 2), now);
        assert!(holds.holds_uid("u1") && !holds.holds_uid("u2"));
        // Each machine replaces a reservation, given up just before it is rented.
        for n in 0..2 {
            holds.drop_one("team-a/req-1");
            assert!(holds.add_machine("team-a/req-1", "u1", machine(n)));
        }
        assert!(!holds.add_machine("team-a/req-1", "other-uid", machine(9)));
        assert_eq!(budget.in_flight_usd_per_hour(), 0.0);
        assert!((holds.usd_per_hour() - 1.5).abs() < 1e-9);
        assert!(
            metrics
                .encode()
                .contains("neocloud_provisioning_held_usd_per_hour 1.5")
        );
        assert_eq!(holds.untaken("team-a/req-1"), 2);
        assert_eq!(holds.expired(now).len(), 1, "untaken machines expire");

        let took = holds
            .take_machine_for(&consumer("p1", "req-1"), |_| true)
            .expect("a machine");
        assert_eq!(
            holds.take_machine_for(&consumer("p1", "req-1"), |_| true),
            None,
            "once per Pod"
        );
        assert_eq!(holds.take_for(&consumer("p1", "req-1")), Some(place()));
        assert_eq!(
            holds.untaken("team-a/req-1"),
            1,
            "p1 took one machine and nothing else"
        );
        let other = holds
            .take_machine_for(&consumer("p2", "req-1"), |m| m.image == "train:1")
            .expect("the other");
        assert_ne!(took, other);
        assert_eq!(
            holds.take_machine_for(&consumer("p3", "req-1"), |_| true),
            None
        );
        assert!(holds.expired(now).is_empty(), "all taken");
        assert_eq!(holds.usd_per_hour(), 0.0);
        assert!(holds.release_uid("team-a/req-1", "u1"));
        assert!(
            !holds.add_machine("team-a/req-1", "u1", machine(3)),
            "released: refused"
        );
    }

    #[test]
    fn a_restored_hold_knows_the_pods_that_took_theirs_before() {
        let budget = BudgetGuard::new(None);
        let holds = Holds::new(None);
        let at = Instant::now() + Duration::from_secs(600);
        let takers = vec!["p1".to_owned()];
        holds.restore(
            "team-a/req-1",
            "u1",
            place(),
            reserve(&budget, 1),
            takers,
            at,
        );
        assert_eq!(holds.take_for(&consumer("p1", "req-1")), Some(place()));
        assert_eq!(holds.untaken("team-a/req-1"), 1, "p1 took its own before");
        holds.take_for(&consumer("p2", "req-1"));
        assert_eq!(holds.untaken("team-a/req-1"), 0);
        assert_eq!(budget.in_flight_usd_per_hour(), 0.0);
    }
}
