//! What a replay shows: per strategy, cost, cost per useful GPU-hour, time to Running,
//! preemptions and how fast they were noticed, jobs never placed, and the invariants (no
//! overspend against a job's maximum price or the cluster budget, no leaked instance, no two
//! instances of one job at once), all read from the simulators' billing ledgers.
//!
//! Not the replay itself (see [`crate::harness`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use neocloud_cloudsim::LedgerEntry;
use serde::Serialize;

use crate::harness::{NAME_PREFIX, Outcome};
use crate::jobs::Job;
use crate::trace::Cloud;

/// Slack for float comparisons of prices (a thousandth of a cent).
const EPSILON: f64 = 1e-5;

/// The job an instance was rented for, from its name (`replay-<job>-<generation>`).
pub fn job_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    rest.rsplit_once('-').map(|(job, _)| job)
}

/// When an instance created at `created` (seconds from the start) was terminated, in the same
/// seconds; infinity while it is live.
fn ended_s(created: f64, entry: &LedgerEntry) -> f64 {
    entry.terminated_at.map_or(f64::INFINITY, |t| {
        created + (t - entry.created_at).num_milliseconds() as f64 / 1000.0
    })
}

/// Every broken invariant in a replay's ledger, one line each.
pub fn violations(
    jobs: &[Job],
    ledger: &[(Cloud, f64, LedgerEntry)],
    budget_usd_per_hour: Option<f64>,
) -> Vec<String> {
    let by_id: BTreeMap<&str, &Job> = jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    let mut out = Vec::new();
    let mut per_job: BTreeMap<&str, Vec<(f64, f64, &LedgerEntry)>> = BTreeMap::new();
    for (cloud, created, entry) in ledger {
        if entry.is_live() {
            out.push(format!(
                "leak: {cloud} instance {} ({}) is still billed after the replay",
                entry.instance_id, entry.name
            ));
        }
        let Some(job) = job_of(&entry.name).and_then(|id| by_id.get(id)) else {
            out.push(format!(
                "unknown instance: {cloud} {} is named {:?}, which is no job's",
                entry.instance_id, entry.name
            ));
            continue;
        };
        if let Some(max) = job.max_price_per_hour
            && entry.price_per_hour > max + EPSILON
        {
            out.push(format!(
                "overspend: job {} allows {max} USD/h; {cloud} instance {} costs {}",
                job.id, entry.instance_id, entry.price_per_hour
            ));
        }
        let ended = ended_s(*created, entry);
        per_job
            .entry(job.id.as_str())
            .or_default()
            .push((*created, ended, entry));
    }
    for (job, mut lives) in per_job {
        lives.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in lives.windows(2) {
            let (_, ended, first) = pair[0];
            let (created, _, second) = pair[1];
            if created < ended {
                out.push(format!(
                    "double rental: job {job} had {} and {} at once",
                    first.instance_id, second.instance_id
                ));
            }
        }
    }
    if let Some(cap) = budget_usd_per_hour {
        let peak = peak_burn(ledger);
        if peak > cap + EPSILON {
            out.push(format!(
                "over budget: {peak:.3} USD/h of instances at once against a cap of {cap}"
            ));
        }
    }
    out
}

/// The highest sum of prices of instances alive at the same time.
pub fn peak_burn(ledger: &[(Cloud, f64, LedgerEntry)]) -> f64 {
    let mut edges: Vec<(f64, f64)> = Vec::new();
    for (_, created, entry) in ledger {
        let ended = ended_s(*created, entry);
        edges.push((*created, entry.price_per_hour));
        edges.push((ended, -entry.price_per_hour));
    }
    // Ends before starts at the same second: a replacement is not an overlap.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let (mut burn, mut peak) = (0.0_f64, 0.0_f64);
    for (_, delta) in edges {
        burn += delta;
        peak = peak.max(burn);
    }
    peak
}

/// One strategy's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// The strategy.
    pub strategy: String,
    /// Jobs submitted.
    pub jobs: usize,
    /// Jobs whose work completed.
    pub completed: usize,
    /// Jobs that never ran.
    pub never_placed: usize,
    /// Jobs failed after the most replacements the node makes (5).
    pub failed: usize,
    /// Jobs that ran, did not fail, and did not complete before the end of the replay.
    pub unfinished: usize,
    /// Instances rented.
    pub instances: usize,
    /// Spot instances rented.
    pub spot_instances: usize,
    /// USD billed, all instances.
    pub cost_usd: f64,
    /// GPU-hours of completed work.
    pub useful_gpu_hours: f64,
    /// GPU-hours billed.
    pub billed_gpu_hours: f64,
    /// USD per useful GPU-hour.
    pub usd_per_useful_gpu_hour: f64,
    /// USD per useful GPU-hour over the jobs every compared strategy completed (what each
    /// strategy paid for the same work, preempted instances included); set by [`compare`].
    pub usd_per_common_gpu_hour: f64,
    /// Minutes from arrival to first Running: 50th, 95th and 99th percentile.
    pub time_to_running_min: [f64; 3],
    /// Preemptions.
    pub preemptions: u32,
    /// Seconds from reclaim to notice: mean and max.
    pub detection_s: [f64; 2],
    /// Broken invariants.
    pub violations: Vec<String>,
}

/// The `p`-th percentile (nearest rank) of sorted values; 0 when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn gpus_of(jobs: &BTreeMap<&str, &Job>, entry: &LedgerEntry) -> f64 {
    job_of(&entry.name)
        .and_then(|id| jobs.get(id))
        .map_or(0.0, |j| f64::from(j.gpus))
}

/// The figures of one replay.
pub fn summarize(jobs: &[Job], outcome: &Outcome) -> Summary {
    let by_id: BTreeMap<&str, &Job> = jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    let cost_usd: f64 = outcome.ledger.iter().map(|(_, _, e)| e.cost_usd).sum();
    let billed_gpu_hours: f64 = outcome
        .ledger
        .iter()
        .map(|(_, _, e)| e.billed_seconds / 3600.0 * gpus_of(&by_id, e))
        .sum();
    let useful_gpu_hours: f64 = outcome
        .jobs
        .iter()
        .filter(|j| j.completed)
        .map(|j| j.work_s as f64 / 3600.0 * f64::from(j.gpus))
        .sum();
    let mut ttr: Vec<f64> = outcome
        .jobs
        .iter()
        .filter_map(|j| j.time_to_running_s)
        .map(|s| s / 60.0)
        .collect();
    ttr.sort_by(f64::total_cmp);
    let delays: Vec<f64> = outcome
        .jobs
        .iter()
        .flat_map(|j| j.detection_delays_s.iter().copied())
        .collect();
    let detection_mean = if delays.is_empty() {
        0.0
    } else {
        delays.iter().sum::<f64>() / delays.len() as f64
    };
    Summary {
        strategy: outcome.strategy.clone(),
        jobs: outcome.jobs.len(),
        completed: outcome.jobs.iter().filter(|j| j.completed).count(),
        never_placed: outcome
            .jobs
            .iter()
            .filter(|j| j.time_to_running_s.is_none())
            .count(),
        failed: outcome.jobs.iter().filter(|j| j.failed).count(),
        unfinished: outcome
            .jobs
            .iter()
            .filter(|j| j.time_to_running_s.is_some() && !j.completed && !j.failed)
            .count(),
        instances: outcome.ledger.len(),
        spot_instances: outcome.ledger.iter().filter(|(_, _, e)| e.spot).count(),
        cost_usd,
        useful_gpu_hours,
        billed_gpu_hours,
        usd_per_useful_gpu_hour: if useful_gpu_hours > 0.0 {
            cost_usd / useful_gpu_hours
        } else {
            f64::NAN
        },
        usd_per_common_gpu_hour: f64::NAN,
        time_to_running_min: [
            percentile(&ttr, 50.0),
            percentile(&ttr, 95.0),
            percentile(&ttr, 99.0),
        ],
        preemptions: outcome.jobs.iter().map(|j| j.preemptions).sum(),
        detection_s: [detection_mean, delays.iter().copied().fold(0.0, f64::max)],
        violations: outcome.violations.clone(),
    }
}

/// Summaries of several replays of the same jobs, with the cost of the work they all
/// completed.
pub fn compare(jobs: &[Job], outcomes: &[Outcome]) -> Vec<Summary> {
    let mut common: Option<std::collections::BTreeSet<&str>> = None;
    for outcome in outcomes {
        let done: std::collections::BTreeSet<&str> = outcome
            .jobs
            .iter()
            .filter(|j| j.completed)
            .map(|j| j.id.as_str())
            .collect();
        common = Some(match common {
            None => done,
            Some(c) => c.intersection(&done).copied().collect(),
        });
    }
    let common = common.unwrap_or_default();
    let useful: f64 = jobs
        .iter()
        .filter(|j| common.contains(j.id.as_str()))
        .map(|j| j.work_s as f64 / 3600.0 * f64::from(j.gpus))
        .sum();
    outcomes
        .iter()
        .map(|outcome| {
            let mut summary = summarize(jobs, outcome);
            let paid: f64 = outcome
                .ledger
                .iter()
                .filter(|(_, _, e)| job_of(&e.name).is_some_and(|id| common.contains(id)))
                .map(|(_, _, e)| e.cost_usd)
                .sum();
            summary.usd_per_common_gpu_hour = if useful > 0.0 {
                paid / useful
            } else {
                f64::NAN
            };
            summary
        })
        .collect()
}

/// Cumulative USD billed at each hour from the start (index = hour).
pub fn cost_by_hour(outcome: &Outcome) -> Vec<f64> {
    let hours = (outcome.simulated_s / 3600.0).ceil() as usize;
    (0..=hours)
        .map(|h| {
            let t = h as f64 * 3600.0;
            outcome
                .ledger
                .iter()
                .map(|(_, created, e)| {
                    (t - created).clamp(0.0, e.billed_seconds) / 3600.0 * e.price_per_hour
                })
                .sum()
        })
        .collect()
}

/// The Markdown table of several strategies' summaries.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| strategy | done / jobs | never placed | failed | unfinished | instances (spot) | cost USD | \
         useful GPU-h | billed GPU-h | USD per useful GPU-h | same work: USD per GPU-h | \
         to Running p50 / p95 / p99 min | preemptions | noticed mean / max s | invariants |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        let invariants = if s.violations.is_empty() {
            "held".to_owned()
        } else {
            format!("{} broken", s.violations.len())
        };
        let _ = writeln!(
            out,
            "| {} | {} / {} | {} | {} | {} | {} ({}) | {:.2} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1} / {:.1} / {:.1} | {} | {:.0} / {:.0} | {} |",
            s.strategy,
            s.completed,
            s.jobs,
            s.never_placed,
            s.failed,
            s.unfinished,
            s.instances,
            s.spot_instances,
            s.cost_usd,
            s.useful_gpu_hours,
            s.billed_gpu_hours,
            s.usd_per_useful_gpu_hour,
            s.usd_per_common_gpu_hour,
            s.time_to_running_min[0],
            s.time_to_running_min[1],
            s.time_to_running_min[2],
            s.preemptions,
            s.detection_s[0],
            s.detection_s[1],
            invariants
        );
    }
    out
}

/// How the node's default compares with the two baselines, in words, from the figures (the
/// target: 20% lower cost per useful GPU-hour than single-provider, no worse p95 time to
/// Running than cheapest-first).
pub fn reading(summaries: &[Summary], ours: &str, single: &str, cheapest: &str) -> String {
    let find = |name: &str| summaries.iter().find(|s| s.strategy == name);
    let (Some(o), Some(s), Some(c)) = (find(ours), find(single), find(cheapest)) else {
        return format!("(no comparison: the run lacks one of {ours}, {single}, {cheapest})\n");
    };
    let lower = |a: f64, b: f64| 100.0 * (1.0 - a / b);
    let saving = lower(o.usd_per_common_gpu_hour, s.usd_per_common_gpu_hour);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "- Cost per useful GPU-hour of the same work (the jobs every strategy completed): \
         {ours} {:.3} USD against {single} {:.3} USD, {saving:.1}% lower (target: at least \
         20%): **{}**. Over each strategy's own completed jobs: {:.3} against {:.3} USD.",
        o.usd_per_common_gpu_hour,
        s.usd_per_common_gpu_hour,
        if saving >= 20.0 { "met" } else { "missed" },
        o.usd_per_useful_gpu_hour,
        s.usd_per_useful_gpu_hour,
    );
    let _ = writeln!(
        out,
        "- Against {cheapest} ({:.3} USD for the same work): {:.1}% lower.",
        c.usd_per_common_gpu_hour,
        lower(o.usd_per_common_gpu_hour, c.usd_per_common_gpu_hour)
    );
    let _ = writeln!(
        out,
        "- p95 time to Running: {ours} {:.1} min against {cheapest} {:.1} min (target: no \
         worse): **{}**.",
        o.time_to_running_min[1],
        c.time_to_running_min[1],
        if o.time_to_running_min[1] <= c.time_to_running_min[1] + 1e-9 {
            "met"
        } else {
            "missed"
        }
    );
    let _ = writeln!(
        out,
        "- Jobs never placed: {ours} {}, {single} {}, {cheapest} {}.",
        o.never_placed, s.never_placed, c.never_placed
    );
    let broken: usize = summaries.iter().map(|s| s.violations.len()).sum();
    let _ = writeln!(
        out,
        "- Invariants (overspend, budget, leaks, double rentals): {}.",
        if broken == 0 {
            "held in every strategy".to_owned()
        } else {
            format!("{broken} broken (listed below)")
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        name: &str,
        price: f64,
        created_s: i64,
        ended_s: Option<i64>,
    ) -> (Cloud, f64, LedgerEntry) {
        let origin = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let at = |s: i64| origin + chrono::Duration::seconds(s);
        (
            Cloud::Vast,
            created_s as f64,
            LedgerEntry {
                provider: "vast".into(),
                instance_id: format!("i-{name}-{created_s}"),
                name: name.into(),
                offer_id: 1,
                spot: false,
                price_per_hour: price,
                created_at: at(created_s),
                terminated_at: ended_s.map(at),
                billed_seconds: ended_s.map_or(0.0, |e| (e - created_s) as f64),
                cost_usd: 0.0,
            },
        )
    }

    fn job(id: &str, max: Option<f64>) -> Job {
        Job {
            id: id.into(),
            arrival_s: 0,
            work_s: 60,
            gpus: 1,
            models: vec![],
            spot_ok: false,
            max_price_per_hour: max,
        }
    }

    #[test]
    fn overlaps_overspend_leaks_and_budget_are_each_reported() {
        let jobs = [job("a", Some(1.0)), job("b", None)];
        let ledger = vec![
            entry("replay-a-0", 0.9, 0, Some(100)),
            entry("replay-a-1", 1.5, 50, Some(200)),
            entry("replay-b-0", 2.0, 100, None),
            entry("stranger", 0.1, 0, Some(1)),
        ];
        let v = violations(&jobs, &ledger, Some(3.0));
        assert!(
            v.iter().any(|l| l.starts_with("double rental: job a")),
            "{v:#?}"
        );
        assert!(
            v.iter()
                .any(|l| l.starts_with("overspend: job a allows 1 USD/h")),
            "{v:#?}"
        );
        assert!(
            v.iter()
                .any(|l| l.starts_with("leak: vast instance i-replay-b-0-100")),
            "{v:#?}"
        );
        assert!(
            v.iter().any(|l| l.starts_with("unknown instance")),
            "{v:#?}"
        );
        assert!(
            v.iter().any(|l| l.starts_with("over budget: 3.500")),
            "{v:#?}"
        );
    }

    #[test]
    fn a_replacement_that_starts_when_the_last_ended_is_no_double_rental() {
        let jobs = [job("a", None)];
        let ledger = vec![
            entry("replay-a-0", 1.0, 0, Some(100)),
            entry("replay-a-1", 1.0, 100, Some(200)),
        ];
        assert_eq!(violations(&jobs, &ledger, Some(1.0)), Vec::<String>::new());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
