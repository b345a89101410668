//! A gang member's turn to be placed (see [`crate::holds::gangs`]): it waits until every
//! member of its gang is bound to the node, then the first member to find the gang complete
//! plans all the members not yet rented at once, in one provider and region (the group
//! planning of [`crate::holds::regions`]), reserves their budget together and holds it; each
//! member then takes its reservation and rents, confined to that place. A member whose rental
//! fails breaks the round: the gang's held budget is released, the members rented in the round
//! are released (instances deleted and confirmed gone), and the gang is planned again after the
//! retry interval.
//!
//! A member lost later (reclaimed, gone) is replaced as any Pod is, in the gang's place, unless
//! the fallback policy it runs under gives up on the loss: then the whole gang ends
//! ([`Reconciler::gang_ends`]).
//!
//! Not here: the gang's state machine (pure, in `holds::gangs`), the rental itself (`placing`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use neocloud_broker::{Failure, FallbackContext, PlanInput};
use neocloud_core::{Attempt, AttemptOutcome, FailureClass, FallbackAction, OfferQuery};

use super::attempts::from_record;
use super::pod_status::DesiredPod;
use super::{Error, Reconciler};
use crate::holds::HeldPlace;
use crate::holds::gangs::{GANG_ANNOTATION, GANG_SIZE_ANNOTATION, GangSpec, GangState, gang_of};
use crate::holds::regions::{Place, PlannedSet, places};
use neocloud_api::{CloudPodBinding, CloudPodBindingStatus};

/// The reason of a member waiting for the rest of its gang.
pub(super) const GANG_WAITING: &str = "GangWaiting";
/// The reason of a member whose gang annotations are wrong.
pub(super) const INVALID_GANG: &str = "InvalidGang";
/// The reason of a member whose gang's round failed and is rented again.
pub(super) const GANG_RETRYING: &str = "GangRetrying";
/// The reason of every member of a gang its fallback policy ended after a member was lost.
pub(super) const GANG_ENDED: &str = "GangEnded";

/// How long the budget held for a planned gang waits for its members to take it; they take it
/// within one reconcile each, so this only bounds a hold whose members all went away.
const HOLD_LIFE: Duration = Duration::from_secs(600);

/// What a Pod does before it is placed.
pub(super) enum Gate {
    /// It names no gang: it is placed as any Pod.
    Solo,
    /// A member of a planned gang: it rents in `place`, in `round`.
    Member {
        /// The gang, `namespace/name`.
        key: String,
        /// The round it rents in.
        round: u64,
        /// The gang's provider and region.
        place: HeldPlace,
    },
    /// It waits (its status says why): the reconcile ends with this.
    Done(Action),
}

/// The key of a gang's hold in the gangs' [`Holds`](crate::holds::Holds).
fn hold_key(gang: &str) -> String {
    format!("gang:{gang}")
}

/// The live members of gang `name` in `ns` among the node's Pods, by name.
fn members(pods: &[Arc<Pod>], ns: &str, name: &str) -> Vec<Arc<Pod>> {
    let mut found: Vec<Arc<Pod>> = pods
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| p.annotations().get(GANG_ANNOTATION).map(|g| g.trim()) == Some(name))
        .cloned()
        .collect();
    found.sort_by_key(|p| p.name_any());
    found
}

/// Why the members disagree on the gang's size, if they do.
fn disagreement(spec: &GangSpec, me: &str, members: &[Arc<Pod>]) -> Option<String> {
    members.iter().find_map(|m| {
        let theirs = m.annotations().get(GANG_SIZE_ANNOTATION)?;
        let differs = theirs.trim().parse::<u32>().ok() != Some(spec.size);
        differs.then(|| {
            format!(
                "the members of gang {} disagree on metadata.annotations[{GANG_SIZE_ANNOTATION}]: \
                 pod {me} says {}, pod {} says {theirs:?}",
                spec.name,
                spec.size,
                m.name_any()
            )
        })
    })
}

impl Reconciler {
    /// Whether the Pod may be placed now, as a gang member or alone; a member that may not
    /// waits with its reason, and nothing is rented.
    pub(super) async fn gang_gate(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        status: &CloudPodBindingStatus,
    ) -> Result<Gate, Error> {
        let spec = match gang_of(pod.annotations()) {
            Ok(Some(spec)) => spec,
            Ok(None) => return Ok(Gate::Solo),
            Err(why) => return self.gang_wait(pod, b, status, INVALID_GANG, why).await,
        };
        let Some(caches) = self.caches() else {
            return Ok(Gate::Done(Action::requeue(self.cfg.release_poll)));
        };
        let ns = pod.namespace().unwrap_or_default();
        let members = members(&caches.pods.state(), &ns, &spec.name);
        if let Some(why) = disagreement(&spec, &pod.name_any(), &members) {
            return self.gang_wait(pod, b, status, INVALID_GANG, why).await;
        }
        let (name, size, n) = (&spec.name, spec.size, members.len());
        if n < size as usize {
            let why = format!(
                "waiting for the members of gang {name}: {n} of {size} have arrived; nothing is \
                 rented until all have"
            );
            self.gang_wait(pod, b, status, GANG_WAITING, why).await?;
            // Looked at again soon: reading the cache costs nothing, and the member rents as
            // soon as the last one has planned the gang.
            return Ok(Gate::Done(Action::requeue(self.cfg.poll_interval)));
        }
        if n > size as usize {
            let why = format!(
                "gang {name} has {n} members, more than its \
                 metadata.annotations[{GANG_SIZE_ANNOTATION}] {size}"
            );
            return self.gang_wait(pod, b, status, INVALID_GANG, why).await;
        }
        let key = format!("{ns}/{name}");
        self.cfg.gangs.expire(Instant::now());
        let entry = self.cfg.gangs.entry(&key);
        let uid = pod.uid().unwrap_or_default();
        if let Some(gate) = self.gang_take(&key, &entry.state, &uid) {
            return Ok(gate);
        }
        let _planning = entry.planning.lock().await;
        // Another member may have planned it while this one waited for the lock.
        if let Some(gate) = self.gang_take(&key, &entry.state, &uid) {
            return Ok(gate);
        }
        let may = entry.state.lock().may_plan(Instant::now());
        if let Err(waits) = may {
            self.gang_release_stale(&key, &members).await?;
            let why = match &entry.state.lock().state {
                GangState::Broken { why, .. } => why.clone(),
                _ => String::new(),
            };
            let message = format!("gang {name}: {why}; {waits}");
            return self.gang_wait(pod, b, status, GANG_RETRYING, message).await;
        }
        let place = match self.plan_gang(&spec, &key, &members).await? {
            Ok(place) => place,
            Err((reason, why)) => return self.gang_wait(pod, b, status, &reason, why).await,
        };
        let round = entry.state.lock().start(place);
        tracing::info!(gang = %key, round, "gang planned; its members rent");
        Ok(self
            .gang_take(&key, &entry.state, &uid)
            .unwrap_or(Gate::Done(Action::requeue(self.cfg.release_poll))))
    }

    /// The member's reservation taken and its place, while the gang is renting.
    fn gang_take(
        &self,
        key: &str,
        state: &parking_lot::Mutex<crate::holds::gangs::Gang>,
        uid: &str,
    ) -> Option<Gate> {
        let (round, place) = state.lock().take(uid)?;
        self.cfg.gangs.holds().take(&hold_key(key), uid);
        Some(Gate::Member {
            key: key.to_owned(),
            round,
            place,
        })
    }

    /// Plans the members not yet rented at once and holds their budget in the first place that
    /// covers them all and that the budget pays for; or the reason and why not.
    async fn plan_gang(
        &self,
        spec: &GangSpec,
        key: &str,
        members: &[Arc<Pod>],
    ) -> Result<Result<HeldPlace, (String, String)>, Error> {
        let name = &spec.name;
        let mut plans = Vec::new();
        for m in members {
            let ns = m.namespace().unwrap_or_default();
            let rented = self.binding(&ns, &m.name_any()).await?.is_some_and(|b| {
                b.spec.pod_uid == m.uid().unwrap_or_default()
                    && b.status.is_some_and(|s| s.instance_id.is_some())
            });
            if rented {
                continue;
            }
            let (w, mut planner) = match self.plan_pod(m) {
                Ok(ok) => ok,
                Err((reason, why)) => {
                    let why = format!("gang {name}: member {}: {why}", m.name_any());
                    return Ok(Err((reason, why)));
                }
            };
            // Every eligible offer, not the few a single Pod tries: a region may need many.
            planner.max_candidates = usize::MAX;
            let catalog = &self.renter.catalog;
            let view = catalog
                .offers(&OfferQuery::for_workload(&w), &w.providers)
                .await;
            let enabled = catalog.provider_ids();
            let planned = planner.plan(&PlanInput {
                workload: &w,
                offers: &view.offers,
                attempts: &[],
                enabled: &enabled,
                skipped: &[],
                now: Utc::now(),
            });
            match planned {
                Ok(plan) => plans.push((m.name_any(), plan)),
                Err(e) => {
                    let why = format!("gang {name}: member {}: {e}", m.name_any());
                    return Ok(Err(("PolicyError".to_owned(), why)));
                }
            }
        }
        let sets: Vec<PlannedSet<'_>> = plans
            .iter()
            .map(|(member, plan)| PlannedSet {
                noun: "gang member",
                template: member,
                count: 1,
                candidates: &plan.candidates,
                explanation: &plan.explanation,
            })
            .collect();
        let mut found = match places(&sets) {
            Ok(found) => found,
            Err(no) => {
                return Ok(Err((
                    no.reason().to_owned(),
                    format!("gang {name}: {}", no.message()),
                )));
            }
        };
        // Places where a round broke come last, the one that broke longest ago first.
        if let Some(e) = self.cfg.gangs.get(key) {
            let gang = e.state.lock();
            found.sort_by_key(|p| gang.tried_rank(p.provider, &p.region));
        }
        Ok(self.hold_gang(key, found))
    }

    /// The budget of the first place it pays for, held; or `OverBudget` and why.
    fn hold_gang(&self, key: &str, found: Vec<Place>) -> Result<HeldPlace, (String, String)> {
        let mut refused = None;
        for place in found {
            match place.reserve(&self.renter.budget) {
                Ok(reservations) => {
                    let held = HeldPlace {
                        provider: place.provider,
                        region: place.region.clone(),
                    };
                    let until = Instant::now() + HOLD_LIFE;
                    let holds = self.cfg.gangs.holds();
                    holds.hold(&hold_key(key), key, held.clone(), reservations, until);
                    return Ok(held);
                }
                Err(over) => {
                    refused.get_or_insert((over, place));
                }
            }
        }
        let Some((over, place)) = refused else {
            return Err((
                "NoOffer".to_owned(),
                format!("gang {key}: no place was planned"),
            ));
        };
        let message = format!(
            "over budget: {over}, for the {} members of gang {key} on {}; nothing is rented",
            place.picks.len(),
            place.describe()
        );
        Err(("OverBudget".to_owned(), message))
    }

    /// A member's rental in `round` failed with `reason`: the round breaks (its held budget is
    /// released, and so are the members rented in it), and the member waits to be rented again
    /// with the gang.
    pub(super) async fn gang_failed(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        status: CloudPodBindingStatus,
        (key, round): (&str, u64),
        reason: &str,
        message: String,
    ) -> Result<Action, Error> {
        let why = format!("member {} failed ({reason}: {message})", pod.name_any());
        let until = Instant::now() + self.cfg.retry_interval;
        let uid = pod.uid().unwrap_or_default();
        let entry = self.cfg.gangs.entry(key);
        let broke = entry.state.lock().failed(&uid, round, until, why.clone());
        if broke {
            tracing::info!(gang = %key, round, %why, "gang round failed; releasing its members");
            self.cfg.gangs.holds().release(&hold_key(key));
            if let Some(c) = self.caches() {
                let ns = pod.namespace().unwrap_or_default();
                let name = key.rsplit('/').next().unwrap_or_default();
                self.gang_release_stale(key, &members(&c.pods.state(), &ns, name))
                    .await?;
            }
        }
        let message = format!(
            "gang {key}: {why}; the members rented so far are released, and all are rented \
             again in {}s",
            self.cfg.retry_interval.as_secs().max(1)
        );
        self.wait(pod, b, status, GANG_RETRYING, message).await
    }

    /// Releases the instances of `members` rented in a round that broke.
    async fn gang_release_stale(&self, key: &str, members: &[Arc<Pod>]) -> Result<(), Error> {
        for m in members {
            let ns = m.namespace().unwrap_or_default();
            let Some(b) = self.binding(&ns, &m.name_any()).await? else {
                continue;
            };
            let status = b.status.clone().unwrap_or_default();
            if self.gang_stale(m) && status.instance_id.is_some() {
                self.gang_release(key, m, &b, status).await?;
            }
        }
        Ok(())
    }

    /// Whether the Pod's instance was rented in a gang round that broke: it must be released.
    pub(super) fn gang_stale(&self, pod: &Pod) -> bool {
        let Ok(Some(spec)) = gang_of(pod.annotations()) else {
            return false;
        };
        let key = format!("{}/{}", pod.namespace().unwrap_or_default(), spec.name);
        let uid = pod.uid().unwrap_or_default();
        self.cfg
            .gangs
            .get(&key)
            .is_some_and(|e| e.state.lock().stale(&uid))
    }

    /// Releases the instance of a member rented in a round that broke: the binding is Pending
    /// with nothing rented, and the Pod says why. `None` while the instance is being deleted.
    pub(super) async fn gang_release(
        &self,
        key: &str,
        pod: &Pod,
        b: &CloudPodBinding,
        status: CloudPodBindingStatus,
    ) -> Result<Option<Action>, Error> {
        let message = format!("released: another member of gang {key} failed to rent");
        let note = format!("{message}; the gang is rented again, all members at once");
        let class = FailureClass::Transient;
        let retired = self
            .retire(b, status, class, &message, GANG_RETRYING, &note)
            .await?;
        if retired.is_none() {
            return Ok(None);
        }
        if let Some(e) = self.cfg.gangs.get(key) {
            e.state.lock().released(&pod.uid().unwrap_or_default());
        }
        self.event(pod, true, GANG_RETRYING, note.clone()).await;
        self.set_pod(pod, &DesiredPod::pending(GANG_RETRYING, note))
            .await?;
        Ok(Some(Action::requeue(self.cfg.release_poll)))
    }

    /// For a gang member whose instance was reclaimed or lost (`class`, `message`): whether the
    /// whole gang ends instead of the member being replaced. The fallback policy the Pod runs
    /// under decides, asked about the lost instance as about any failed attempt: `give-up`
    /// ends the gang with its reason; any other answer (the default's is `next-offer`), or an
    /// error, replaces the member.
    pub(super) fn gang_ends(
        &self,
        pod: &Pod,
        status: &CloudPodBindingStatus,
        class: FailureClass,
        message: &str,
    ) -> Option<String> {
        Self::gang_key(pod)?;
        let (w, planner) = self.workload(pod).ok()?;
        let (_, fallback, _) = self.with_policy(&w, planner).ok()?;
        let instance = status.instance_id.as_deref();
        let mut history: Vec<Attempt> = (status.attempts.iter())
            .filter_map(|a| from_record(a, instance))
            .collect();
        let last = history
            .iter_mut()
            .rev()
            .find(|a| matches!(a.outcome, AttemptOutcome::Rented { .. }))?;
        last.outcome = AttemptOutcome::Failed {
            class,
            code: None,
            message: message.to_owned(),
        };
        let provider = last.provider;
        let cx = FallbackContext {
            workload: &w,
            attempts: &history,
            failure: Failure {
                class,
                provider,
                retry_after: None,
            },
            retries_of_offer: 0,
        };
        match fallback.next_action(&cx) {
            Ok(FallbackAction::GiveUp { reason }) => Some(reason),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(pod = %pod.name_any(), error = %e, "fallback policy failed on a lost gang member; replacing it");
                None
            }
        }
    }

    /// Ends the gang of `pod` (whose instance was lost): every member fails with
    /// [`GANG_ENDED`], its instance released.
    pub(super) async fn end_gang(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        policy_reason: String,
        message: String,
    ) -> Result<Action, Error> {
        let key = Self::gang_key(pod).unwrap_or_default();
        let why = format!(
            "gang {key} ended: member {} was lost ({message}) and the fallback policy gave up:              {policy_reason}",
            pod.name_any()
        );
        tracing::info!(gang = %key, %why, "gang ended");
        if let Some(c) = self.caches() {
            let ns = pod.namespace().unwrap_or_default();
            let name = key.rsplit('/').next().unwrap_or_default();
            for m in members(&c.pods.state(), &ns, name) {
                if m.uid() == pod.uid() {
                    continue;
                }
                if let Some(mb) = self.binding(&ns, &m.name_any()).await?
                    && mb.spec.pod_uid == m.uid().unwrap_or_default()
                {
                    self.fail(&m, &mb, GANG_ENDED, why.clone()).await?;
                }
            }
        }
        self.fail(pod, b, GANG_ENDED, why).await
    }

    /// The gang key of a member's Pod, when it names a valid gang.
    pub(super) fn gang_key(pod: &Pod) -> Option<String> {
        let spec = gang_of(pod.annotations()).ok()??;
        Some(format!(
            "{}/{}",
            pod.namespace().unwrap_or_default(),
            spec.name
        ))
    }

    /// [`Reconciler::wait`] as a gate.
    async fn gang_wait(
        &self,
        pod: &Pod,
        b: &CloudPodBinding,
        status: &CloudPodBindingStatus,
        reason: &str,
        message: String,
    ) -> Result<Gate, Error> {
        let action = self.wait(pod, b, status.clone(), reason, message).await?;
        Ok(Gate::Done(action))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, gang: &str, size: &str, phase: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "team-a",
                    "annotations": {GANG_ANNOTATION: gang, GANG_SIZE_ANNOTATION: size}},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn members_are_the_live_pods_of_the_namespace_naming_the_gang() {
        let pods = [
            pod("w-1", "train", "3", "Pending"),
            pod("w-0", "train", "3", "Running"),
            pod("w-2", "train", "3", "Failed"),
            pod("other", "infer", "3", "Pending"),
        ];
        let found = members(&pods, "team-a", "train");
        let names: Vec<_> = found.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["w-0", "w-1"]);
        assert!(members(&pods, "team-b", "train").is_empty());
    }

    #[test]
    fn members_disagreeing_on_the_size_are_named_with_both_values() {
        let spec = GangSpec {
            name: "train".into(),
            size: 4,
        };
        let pods = [
            pod("w-0", "train", "4", "Pending"),
            pod("w-1", "train", "3", "Pending"),
        ];
        let why = disagreement(&spec, "w-0", &pods).unwrap();
        assert!(
            why.contains("disagree on metadata.annotations[cloud.aibrix.ai/gang-size]: pod w-0 says 4, pod w-1 says \"3\""),
            "{why}"
        );
        assert_eq!(disagreement(&spec, "w-0", &pods[..1]), None);
    }
}
