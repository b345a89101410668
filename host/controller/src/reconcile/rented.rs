//! The `Rented` event's text: the instance and the offer actually rented, where that offer stood
//! in the plan, and, when it was not the first choice, the attempts before it. The plan's own
//! explanation (why the first choice won) is given only when the first choice was rented.

use neocloud_broker::{Plan, Rental};
use neocloud_core::{Attempt, AttemptOutcome};

use super::mirror::describe;

/// How many earlier attempts the event names.
const EARLIER_NAMED: usize = 5;

/// `rented <instance> from <offer> ...` for the attempts made after the first `history` ones.
pub(super) fn rented_note(rental: &Rental, plan: &Plan, history: usize, policy: &str) -> String {
    let instance = describe(&rental.instance);
    let earlier = earlier(&rental.attempts[history.min(rental.attempts.len())..]);
    match rental.candidate {
        None => format!(
            "adopted {instance}{policy}: found by its name after a create whose answer was lost{}",
            after(&earlier)
        ),
        Some(0) if earlier.is_empty() => {
            format!("rented {instance}{policy}: {}", plan.explanation)
        }
        Some(i) => {
            let offer = &plan.candidates[i].offer;
            format!(
                "rented {instance}{policy} from {} offer {}, choice {} of {} in the plan{}",
                offer.provider,
                offer.id,
                i + 1,
                plan.candidates.len(),
                after(&earlier)
            )
        }
    }
}

/// The failed attempts of this round, most recent last, at most [`EARLIER_NAMED`].
fn earlier(attempts: &[Attempt]) -> Vec<String> {
    let failed: Vec<String> = attempts
        .iter()
        .filter_map(|a| match &a.outcome {
            AttemptOutcome::Failed { class, .. } => Some(format!(
                "attempt {} on {} offer {} failed ({class})",
                a.number, a.provider, a.offer_id
            )),
            _ => None,
        })
        .collect();
    let skip = failed.len().saturating_sub(EARLIER_NAMED);
    failed.into_iter().skip(skip).collect()
}

fn after(earlier: &[String]) -> String {
    if earlier.is_empty() {
        String::new()
    } else {
        format!(", after {}", earlier.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use neocloud_broker::Candidate;
    use neocloud_core::{
        FailureClass, GpuModel, InstancePhase, InstanceState, Offer, OfferCapacity, ProviderId,
    };

    fn offer(provider: ProviderId, id: &str) -> Offer {
        Offer {
            provider,
            id: id.into(),
            gpu: GpuModel::Known {
                name: "A40".into(),
                memory_gib: 48,
            },
            gpu_count: 1,
            price_per_hour: 0.4,
            capacity: OfferCapacity::OnDemand,
            region: "US".into(),
            reliability: None,
            verified: true,
            disk_gib: None,
            machine_id: None,
            runpod_cloud: None,
            expires_at: None,
        }
    }

    fn plan() -> Plan {
        let candidate = |o| Candidate {
            offer: o,
            score: 1.0,
            max_price_per_hour: 1.0,
            bid_per_hour: None,
        };
        Plan {
            candidates: vec![
                candidate(offer(ProviderId::Runpod, "first")),
                candidate(offer(ProviderId::Vast, "second")),
            ],
            considered: 2,
            eligible: 2,
            rejected: Default::default(),
            policy_error: None,
            explanation: "chose runpod offer first ... ranked first".into(),
        }
    }

    fn attempt(number: u32, provider: ProviderId, id: &str, failed: bool) -> Attempt {
        Attempt {
            number,
            provider,
            offer_id: id.into(),
            price_per_hour: 0.4,
            started_at: Utc::now(),
            outcome: if failed {
                AttemptOutcome::Failed {
                    class: FailureClass::Capacity,
                    code: None,
                    message: "none left".into(),
                }
            } else {
                AttemptOutcome::Rented {
                    instance_id: "v-9".into(),
                }
            },
        }
    }

    fn rental(candidate: Option<usize>, attempts: Vec<Attempt>) -> Rental {
        Rental {
            instance: InstanceState {
                provider: ProviderId::Vast,
                id: "v-9".into(),
                external_name: "ncn-t-1".into(),
                phase: InstancePhase::Starting,
                provider_status: "loading".into(),
                message: None,
                gpu: GpuModel::Known {
                    name: "A40".into(),
                    memory_gib: 48,
                },
                gpu_count: 1,
                price_per_hour: 0.4,
                region: "US".into(),
                endpoints: Vec::new(),
                public_ip: None,
                created_at: None,
                interruptible: false,
                exit_code: None,
                ready: None,
            },
            attempts,
            adopted: candidate.is_none(),
            candidate,
        }
    }

    #[test]
    fn after_a_fallback_the_event_names_the_offer_rented_and_the_attempts_before_it() {
        let r = rental(
            Some(1),
            vec![
                attempt(1, ProviderId::Runpod, "first", true),
                attempt(2, ProviderId::Vast, "second", false),
            ],
        );
        let note = rented_note(&r, &plan(), 0, " under policy p (sha256:ab)");
        assert_eq!(
            note,
            "rented vast instance v-9 (1x A40, $0.4000/h, US) under policy p (sha256:ab) from \
             vast offer second, choice 2 of 2 in the plan, after attempt 1 on runpod offer first \
             failed (capacity)"
        );
        assert!(!note.contains("ranked first"), "{note}");
    }

    #[test]
    fn the_first_choice_rented_at_once_keeps_the_plan_explanation() {
        let r = rental(
            Some(0),
            vec![
                attempt(1, ProviderId::Vast, "old", true),
                attempt(2, ProviderId::Runpod, "first", false),
            ],
        );
        let note = rented_note(&r, &plan(), 1, "");
        assert!(
            note.ends_with(": chose runpod offer first ... ranked first"),
            "{note}"
        );
    }
}
