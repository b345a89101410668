//! The replay end to end: the simulators, the broker and the adapters on a paused clock, with
//! hand-made markets for the cases that must happen (a reclaim, a window of refusals, a budget)
//! and a generated day of market under every shipped strategy.

use std::path::PathBuf;

use neocloud_cloudsim::{OfferConfig, Timing};
use neocloud_replay::generate::{MarketParams, generate};
use neocloud_replay::harness::{Options, Outcome, run};
use neocloud_replay::jobs::{self, Job, JobParams};
use neocloud_replay::report;
use neocloud_replay::strategy::{Compiled, Strategy};
use neocloud_replay::trace::{Change, Cloud, Event, FORMAT, Header, Trace};

fn shipped(name: &str) -> Compiled {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("strategies")
        .join(format!("{name}.json"));
    Strategy::read(&path).unwrap().compile().unwrap()
}

fn vast_offer(id: u64, gpu: &str, price: f64, capacity: u32) -> OfferConfig {
    vast_offer_of(id, gpu, price, capacity, 0.99)
}

fn vast_offer_of(id: u64, gpu: &str, price: f64, capacity: u32, reliability: f64) -> OfferConfig {
    serde_json::from_value(serde_json::json!({
        "id": null, "gpu": gpu, "gpu_count": 1, "gpu_memory_gb": 80, "region": "Dallas, US",
        "price_per_hour": price, "spot_price_per_hour": price * 0.5, "capacity": capacity,
        "reliability": reliability
    }))
    .map(|mut o: OfferConfig| {
        o.id = Some(id);
        o
    })
    .unwrap()
}

/// One Vast offer of H100s, quick boots, and the events given.
fn market(duration_s: u64, events: Vec<Event>) -> Trace {
    Trace {
        header: Header {
            format: FORMAT.to_owned(),
            duration_s,
            seed: None,
            sources: None,
            parameters: None,
        },
        timings: Cloud::ALL
            .iter()
            .map(|c| {
                (
                    *c,
                    Timing {
                        provisioning_ms: 10_000,
                        starting_ms: 20_000,
                        terminating_ms: 5_000,
                    },
                )
            })
            .collect(),
        offers: vec![(Cloud::Vast, vast_offer(7, "H100 SXM", 2.0, 4))],
        events,
    }
}

fn job(id: &str, arrival_s: u64, work_s: u64, spot_ok: bool) -> Job {
    Job {
        id: id.to_owned(),
        arrival_s,
        work_s,
        gpus: 1,
        models: vec!["H100".to_owned()],
        spot_ok,
        max_price_per_hour: None,
    }
}

fn reclaim(at_s: u64) -> Event {
    Event {
        at_s,
        provider: Cloud::Vast,
        change: Change::Reclaim { offer_id: 7 },
    }
}

async fn replay(trace: &Trace, jobs: &[Job], strategy: &Compiled) -> Outcome {
    let outcome = run(trace, jobs, strategy, &Options::default())
        .await
        .unwrap();
    assert_eq!(
        outcome.violations,
        Vec::<String>::new(),
        "{}",
        outcome.strategy
    );
    outcome
}

/// Spot or not, per instance, in the order rented.
fn spot_sequence(outcome: &Outcome) -> Vec<bool> {
    let mut ledger = outcome.ledger.clone();
    ledger.sort_by(|a, b| a.1.total_cmp(&b.1));
    ledger.iter().map(|(_, _, e)| e.spot).collect()
}

#[tokio::test(start_paused = true)]
async fn a_reclaim_is_noticed_at_the_next_poll_and_the_work_is_placed_again_from_scratch() {
    let trace = market(6 * 3600, vec![reclaim(1800)]);
    let jobs = [job("train", 0, 3600, true)];
    let outcome = replay(&trace, &jobs, &shipped("default")).await;
    let j = &outcome.jobs[0];
    assert_eq!(j.preemptions, 1, "{j:?}");
    assert_eq!(j.rentals, 2, "{j:?}");
    assert!(j.completed, "{j:?}");
    assert_eq!(j.detection_delays_s.len(), 1);
    assert!(
        j.detection_delays_s[0] <= Options::default().poll_s as f64,
        "noticed {} s after the reclaim",
        j.detection_delays_s[0]
    );
    assert_eq!(spot_sequence(&outcome), [true, true]);
    // The first instance was billed only until the reclaim; the work ran again in full.
    let summary = report::summarize(&jobs, &outcome);
    assert!((summary.useful_gpu_hours - 1.0).abs() < 1e-9);
    assert!(summary.billed_gpu_hours > 1.4, "{summary:?}");
}

#[tokio::test(start_paused = true)]
async fn a_job_reclaimed_long_after_it_arrived_is_placed_again_not_given_up() {
    let trace = market(6 * 3600, vec![reclaim(2400)]);
    let jobs = [job("train", 0, 3600, true)];
    let options = Options {
        give_up_s: 1800,
        ..Options::default()
    };
    let outcome = run(&trace, &jobs, &shipped("default"), &options)
        .await
        .unwrap();
    let j = &outcome.jobs[0];
    assert_eq!(
        (j.preemptions, j.rentals, j.completed),
        (1, 2, true),
        "{j:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reclaimed_runpod_pod_is_a_preemption_too() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("neocloud_replay=debug")
        .try_init();
    let mut trace = market(6 * 3600, vec![]);
    let mut offer = MarketParams::week().offers[3].1.clone();
    offer.id = Some(104);
    trace.offers = vec![(Cloud::Runpod, offer)];
    trace.events = vec![Event {
        at_s: 1800,
        provider: Cloud::Runpod,
        change: Change::Reclaim { offer_id: 104 },
    }];
    let jobs = [job("train", 0, 3600, true)];
    let outcome = replay(&trace, &jobs, &shipped("default")).await;
    let j = &outcome.jobs[0];
    assert_eq!(
        (j.preemptions, j.rentals, j.completed),
        (1, 2, true),
        "{j:?}"
    );
    assert_eq!(spot_sequence(&outcome), [true, true]);
}

#[tokio::test(start_paused = true)]
async fn after_two_preemptions_the_cel_sample_rents_on_demand_and_the_default_stays_on_spot() {
    let trace = market(8 * 3600, vec![reclaim(1200), reclaim(2400)]);
    let jobs = [job("train", 0, 3600, true)];
    let cel = replay(&trace, &jobs, &shipped("cel-spot-then-on-demand")).await;
    assert_eq!(cel.jobs[0].preemptions, 2);
    assert_eq!(spot_sequence(&cel), [true, true, false]);
    assert!(cel.jobs[0].completed);
    let default = replay(&trace, &jobs, &shipped("default")).await;
    assert_eq!(spot_sequence(&default), [true, true, true]);
    assert!(default.jobs[0].completed);
    // A strategy file can say the same as the CEL policy.
    let switching = Strategy {
        on_demand_after_preemptions: Some(2),
        ..shipped("default").strategy
    }
    .compile()
    .unwrap();
    let outcome = replay(&trace, &jobs, &switching).await;
    assert_eq!(spot_sequence(&outcome), [true, true, false]);
    // A job that does not tolerate spot never gets it, reclaims or not.
    let strict = [job("serve", 0, 3600, false)];
    let outcome = replay(&trace, &strict, &shipped("default")).await;
    assert_eq!(spot_sequence(&outcome), [false]);
    assert_eq!(outcome.jobs[0].preemptions, 0);
}

#[tokio::test(start_paused = true)]
async fn the_node_default_fails_a_job_after_five_replacements_where_the_cel_sample_goes_on_demand()
{
    let reclaims = (1..=6).map(|n| reclaim(n * 900)).collect();
    let trace = market(8 * 3600, reclaims);
    let jobs = [job("train", 0, 3600, true)];
    let default = replay(&trace, &jobs, &shipped("default")).await;
    let j = &default.jobs[0];
    assert_eq!(
        (j.rentals, j.replacements, j.failed, j.completed),
        (6, 6, true, false),
        "{j:?}"
    );
    assert!(spot_sequence(&default).iter().all(|spot| *spot));
    let cel = replay(&trace, &jobs, &shipped("cel-spot-then-on-demand")).await;
    let j = &cel.jobs[0];
    assert_eq!(
        (j.rentals, j.failed, j.completed),
        (3, false, true),
        "{j:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_window_of_capacity_refusals_delays_the_rental_until_it_ends() {
    let refusals = Event {
        at_s: 0,
        provider: Cloud::Vast,
        change: Change::RefuseCapacity { for_s: 900 },
    };
    let trace = market(4 * 3600, vec![refusals]);
    let jobs = [job("train", 0, 600, false)];
    let outcome = replay(&trace, &jobs, &shipped("cheapest-first")).await;
    let ttr = outcome.jobs[0].time_to_running_s.unwrap();
    assert!(
        ttr >= 900.0,
        "Running {ttr} s after arrival, inside the window"
    );
    assert!(
        ttr < 900.0 + 60.0 + 30.0 + 30.0 + 60.0,
        "Running only {ttr} s after arrival"
    );
    assert_eq!(outcome.ledger.len(), 1, "refused creates rent nothing");
}

#[tokio::test(start_paused = true)]
async fn a_delete_refused_in_a_window_of_rate_limits_is_asked_again_and_nothing_leaks() {
    let limits = Event {
        at_s: 600,
        provider: Cloud::Vast,
        change: Change::RateLimit {
            for_s: 900,
            retry_after_s: 5,
        },
    };
    let trace = market(4 * 3600, vec![limits]);
    let jobs = [job("train", 0, 600, false)];
    let outcome = replay(&trace, &jobs, &shipped("cheapest-first")).await;
    assert!(outcome.jobs[0].completed);
    let (_, created, entry) = &outcome.ledger[0];
    let ended = entry.terminated_at.expect("deleted") - entry.created_at;
    let ended_s = created + ended.num_seconds() as f64;
    assert!(
        ended_s >= 1500.0,
        "deleted at {ended_s} s, inside the window of 429s (600 to 1500 s)"
    );
    assert!(
        ended_s <= 1500.0 + 2.0 * Options::default().poll_s as f64,
        "deleted only at {ended_s} s: the refused delete was not asked again after the window"
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_still_running_when_the_replay_ends_is_stopped_and_nothing_leaks() {
    let trace = market(2 * 3600, vec![]);
    let jobs = [job("long", 0, 10 * 3600, false)];
    let options = Options {
        drain_s: 600,
        ..Options::default()
    };
    let outcome = run(&trace, &jobs, &shipped("cheapest-first"), &options)
        .await
        .unwrap();
    assert_eq!(
        outcome.violations,
        Vec::<String>::new(),
        "nothing left billed"
    );
    let j = &outcome.jobs[0];
    assert!(j.time_to_running_s.is_some() && !j.completed, "{j:?}");
    assert!(outcome.ledger[0].2.terminated_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn the_cluster_budget_holds_jobs_back_instead_of_overspending() {
    let trace = market(6 * 3600, vec![]);
    let jobs = [
        job("a", 0, 3600, false),
        job("b", 0, 3600, false),
        job("c", 0, 3600, false),
    ];
    let capped = Strategy {
        budget_usd_per_hour: Some(4.5),
        ..shipped("cheapest-first").strategy
    }
    .compile()
    .unwrap();
    let outcome = replay(&trace, &jobs, &capped).await;
    assert!(report::peak_burn(&outcome.ledger) <= 4.5);
    assert!(
        outcome.jobs.iter().all(|j| j.completed),
        "{:?}",
        outcome.jobs
    );
    let mut ttr: Vec<f64> = outcome
        .jobs
        .iter()
        .filter_map(|j| j.time_to_running_s)
        .collect();
    ttr.sort_by(f64::total_cmp);
    assert!(
        ttr[2] >= 3600.0,
        "the third job waited for a budget slot: {ttr:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_generated_day_under_every_shipped_strategy_keeps_every_invariant() {
    let mut params = MarketParams::week();
    params.duration_s = 36 * 3600;
    let trace = generate(&params, 20261204);
    let mut mix = JobParams::week();
    mix.count = 40;
    mix.arrivals_over_s = 24 * 3600;
    let jobs = jobs::generate(&mix, 20261204);
    let mut outcomes = Vec::new();
    for name in [
        "single-provider",
        "cheapest-first",
        "default",
        "cel-spot-then-on-demand",
    ] {
        outcomes.push(replay(&trace, &jobs, &shipped(name)).await);
    }
    let summaries = report::compare(&jobs, &outcomes);
    for s in &summaries {
        assert!(s.completed >= 30, "{s:?}");
        assert!(s.usd_per_common_gpu_hour.is_finite(), "{s:?}");
    }
    let spot: Vec<usize> = summaries.iter().map(|s| s.spot_instances).collect();
    assert_eq!(
        spot[0] + spot[1],
        0,
        "on-demand strategies rented spot: {spot:?}"
    );
    assert!(
        spot[2] > 0 && spot[3] > 0,
        "spot strategies rented none: {spot:?}"
    );
    // Only RunPod for the single-provider strategy.
    assert!(
        outcomes[0]
            .ledger
            .iter()
            .all(|(c, _, _)| *c == Cloud::Runpod)
    );
}

#[tokio::test(start_paused = true)]
async fn the_sample_wasm_policy_ranks_by_reliability_per_dollar_where_the_default_takes_the_cheapest()
 {
    let mut trace = market(4 * 3600, vec![]);
    trace.offers = vec![
        (Cloud::Vast, vast_offer_of(1, "H100 SXM", 2.00, 2, 0.96)),
        (Cloud::Vast, vast_offer_of(2, "H100 SXM", 2.02, 2, 0.999)),
    ];
    let jobs = [job("train", 0, 600, false)];
    let offer_rented = |outcome: &Outcome| outcome.ledger[0].2.offer_id;
    let cheapest = replay(&trace, &jobs, &shipped("cheapest-first")).await;
    assert_eq!(offer_rented(&cheapest), 1);
    // policies/build/placement-c.wasm, built by `make policies` (`make test` builds it first).
    let wasm = replay(&trace, &jobs, &shipped("wasm-reliable-per-dollar")).await;
    assert_eq!(offer_rented(&wasm), 2, "0.999 / 2.02 beats 0.96 / 2.00");
    assert!(wasm.jobs[0].completed);
}

#[test]
fn a_strategy_with_a_missing_component_or_a_bad_failure_policy_is_refused_by_field() {
    let base = shipped("wasm-reliable-per-dollar").strategy;
    let missing = Strategy {
        wasm: Some(PathBuf::from("no-such.wasm")),
        ..base.clone()
    };
    let error = missing.compile().unwrap_err().to_string();
    assert!(
        error.starts_with("strategy wasm-reliable-per-dollar: wasm ")
            && error.contains("no-such.wasm"),
        "{error}"
    );
    let bad = Strategy {
        failure_policy: Some("Retry".into()),
        ..base
    };
    assert_eq!(
        bad.compile().unwrap_err().to_string(),
        "strategy wasm-reliable-per-dollar: failure_policy is \"Retry\" (Fail or Ignore, as a BurstPolicy's)"
    );
}

#[test]
fn a_bad_trace_is_refused_naming_the_line_and_the_field() {
    let header = r#"{"kind":"header","format":"neocloud-market-trace/v1","duration_s":100}"#;
    let offer = r#"{"kind":"offer","provider":"vast","offer_id":1,"offer":{"gpu":"RTX 4090","region":"x","price_per_hour":0.4,"capacity":1}}"#;
    let read = |lines: &[&str]| {
        Trace::read(lines.join("\n").as_bytes())
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        read(&[offer]),
        "trace line 1: the first record must be the header"
    );
    assert_eq!(
        read(&[&header.replace("v1", "v9")]),
        "trace line 1: format is \"neocloud-market-trace/v9\"; this replay reads \"neocloud-market-trace/v1\""
    );
    assert_eq!(
        read(&[
            header,
            offer,
            r#"{"kind":"reclaim","at_s":5,"provider":"vast","offer_id":2}"#
        ]),
        "trace line 3: offer_id 2 is not an offer of vast"
    );
    assert_eq!(
        read(&[
            header,
            offer,
            r#"{"kind":"capacity","at_s":50,"provider":"vast","offer_id":1,"available":0}"#,
            r#"{"kind":"capacity","at_s":40,"provider":"vast","offer_id":1,"available":1}"#
        ]),
        "trace line 4: at_s is 40 (before the previous event's 50)"
    );
    assert_eq!(
        read(&[
            header,
            offer,
            r#"{"kind":"price","at_s":5,"provider":"vast","offer_id":1,"price_per_hour":-1}"#
        ]),
        "trace line 3: price_per_hour is -1 (must be above 0)"
    );
    assert_eq!(
        read(&[
            header,
            offer,
            r#"{"kind":"reclaim","at_s":500,"provider":"vast","offer_id":1}"#
        ]),
        "trace line 3: at_s is 500 (after the trace's duration_s 100)"
    );
    assert_eq!(
        read(&[header, offer, offer]),
        "trace line 3: offer_id 1 of vast twice"
    );
    let unknown = read(&[header, r#"{"kind":"discount","at_s":1}"#]);
    assert!(
        unknown.starts_with("trace line 2: unknown variant `discount`"),
        "{unknown}"
    );
}
