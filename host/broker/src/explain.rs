//! Plan explanations: why the winner won, why the next candidates lost, and what was rejected,
//! as short text for Pod events and the binding status.
//!
//! Not for logging whole offer lists; explanations stay a few lines long.

use std::fmt::Write as _;

use neocloud_core::{Offer, WorkloadSpec};

use crate::planner::{Candidate, Plan};

/// How many runners-up an explanation names.
const RUNNERS_UP: usize = 3;

/// Explains a plan in a few lines.
pub fn explain(plan: &Plan, w: &WorkloadSpec) -> String {
    let mut text = String::new();
    match plan.candidates.first() {
        Some(winner) => {
            let _ = write!(
                text,
                "chose {} at ${:.4}/h: ranked first of {} eligible offers (score {:.4})",
                describe(&winner.offer),
                winner.offer.rent_price_per_hour(),
                plan.eligible,
                winner.score
            );
            for other in plan.candidates.iter().skip(1).take(RUNNERS_UP) {
                let _ = write!(
                    text,
                    "; {} lost: {}",
                    describe(&other.offer),
                    why_lost(winner, other, w)
                );
            }
        }
        None => {
            let _ = write!(
                text,
                "no offer fits: {} considered, none eligible and priced",
                plan.considered
            );
        }
    }
    if !plan.rejected.is_empty() {
        let parts: Vec<String> = plan
            .rejected
            .iter()
            .map(|(r, (n, example))| format!("{n} {r} (e.g. {example})"))
            .collect();
        let _ = write!(text, ". rejected: {}", parts.join(", "));
    }
    if let Some(e) = &plan.policy_error {
        let _ = write!(text, ". first policy error: {e}");
    }
    text
}

fn describe(o: &Offer) -> String {
    format!(
        "{} offer {} ({} x{}, {})",
        o.provider,
        o.id,
        o.gpu.name(),
        o.gpu_count,
        o.region
    )
}

/// The first tie-break (in the planner's order) on which `other` lost to `winner`.
fn why_lost(winner: &Candidate, other: &Candidate, w: &WorkloadSpec) -> String {
    let (a, b) = (&winner.offer, &other.offer);
    if other.score != winner.score {
        return format!("lower score {:.4} < {:.4}", other.score, winner.score);
    }
    if b.rent_price_per_hour() != a.rent_price_per_hour() {
        return format!("same score, higher price ${:.4}/h", b.rent_price_per_hour());
    }
    if b.reliability != a.reliability {
        let r = b
            .reliability
            .map_or("unknown".to_owned(), |r| format!("{r:.3}"));
        return format!("same score and price, lower reliability {r}");
    }
    let preference = |p| w.providers.iter().position(|x| *x == p);
    if preference(b.provider) != preference(a.provider) {
        return format!(
            "same score, price and reliability; {} is later in the provider preference",
            b.provider
        );
    }
    "same score, price and reliability; ordered by provider and offer id".to_owned()
}
