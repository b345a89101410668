//! `neocloud-replay`: generate a market trace and a job mix, and replay them under several
//! strategies (see `docs/REPLAY.md`).

use std::fs::File;
use std::io::{BufReader, BufWriter, Write as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use neocloud_replay::generate::{MarketParams, generate};
use neocloud_replay::jobs::{self, JobParams};
use neocloud_replay::report::{self, Summary};
use neocloud_replay::trace::{Change, Cloud};
use neocloud_replay::{Options, Strategy, Trace, plot};

#[derive(Debug, Parser)]
#[command(
    name = "neocloud-replay",
    about = "Replay a GPU market through the broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Writes OUT/trace.jsonl and OUT/jobs.jsonl from a seed.
    Generate {
        /// The seed.
        #[arg(long)]
        seed: u64,
        /// Days of market (the jobs arrive over all but the last).
        #[arg(long, default_value_t = 7)]
        days: u64,
        /// How many jobs.
        #[arg(long, default_value_t = 1000)]
        jobs: usize,
        /// The directory written to.
        #[arg(long)]
        out: PathBuf,
    },
    /// Replays a trace and jobs under each strategy; writes OUT/report.md, OUT/summary.json,
    /// OUT/cost-by-hour.csv, OUT/instances.csv (every instance billed), OUT/jobs.csv (every job)
    /// and the plots OUT/cost.png, OUT/time-to-running.png and OUT/market.png.
    Run {
        /// The trace (JSON Lines).
        #[arg(long)]
        trace: PathBuf,
        /// The jobs (JSON Lines).
        #[arg(long)]
        jobs: PathBuf,
        /// A strategy file (JSON); repeat for several.
        #[arg(long = "strategy", required = true)]
        strategies: Vec<PathBuf>,
        /// The directory written to.
        #[arg(long)]
        out: PathBuf,
        /// Seconds between status polls.
        #[arg(long, default_value_t = 30)]
        poll_s: u64,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Generate {
            seed,
            days,
            jobs: count,
            out,
        } => generate_files(seed, days, count, &out),
        Command::Run {
            trace,
            jobs,
            strategies,
            out,
            poll_s,
        } => run(&trace, &jobs, &strategies, &out, poll_s),
    }
}

fn generate_files(seed: u64, days: u64, count: usize, out: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(days >= 2, "--days is {days}; a replay needs at least 2");
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut market = MarketParams::week();
    market.duration_s = days * 86_400;
    let trace = generate(&market, seed);
    let mut params = JobParams::week();
    params.count = count;
    params.arrivals_over_s = (days - 1) * 86_400;
    let jobs = jobs::generate(&params, seed);
    let path = out.join("trace.jsonl");
    let mut w = BufWriter::new(File::create(&path).with_context(|| path.display().to_string())?);
    trace.write(&mut w)?;
    w.flush()?;
    let path = out.join("jobs.jsonl");
    let mut w = BufWriter::new(File::create(&path).with_context(|| path.display().to_string())?);
    jobs::write(&jobs, &mut w)?;
    w.flush()?;
    eprintln!(
        "wrote {} market events and {} jobs to {}",
        trace.events.len(),
        jobs.len(),
        out.display()
    );
    Ok(())
}

fn run(
    trace_path: &Path,
    jobs_path: &Path,
    strategy_paths: &[PathBuf],
    out: &Path,
    poll_s: u64,
) -> anyhow::Result<()> {
    let open = |p: &Path| {
        File::open(p)
            .map(BufReader::new)
            .with_context(|| format!("opening {}", p.display()))
    };
    let trace = Trace::read(open(trace_path)?)?;
    let jobs = jobs::read(open(jobs_path)?)?;
    let strategies = strategy_paths
        .iter()
        .map(|p| Strategy::read(p)?.compile())
        .collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let options = Options {
        poll_s,
        ..Options::default()
    };
    let mut outcomes = Vec::new();
    let mut series = Vec::new();
    let mut job_rows = String::from(
        "strategy,job,time_to_running_s,completed,failed,preemptions,replacements,rentals,detection_delays_s\n",
    );
    let mut instances = String::from(
        "strategy,provider,instance,name,offer,spot,price_per_hour,created_s,billed_s,cost_usd\n",
    );
    for strategy in &strategies {
        let started = std::time::Instant::now();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()?;
        let outcome = runtime.block_on(neocloud_replay::run(&trace, &jobs, strategy, &options))?;
        let summary = report::summarize(&jobs, &outcome);
        eprintln!(
            "{}: {} of {} jobs done, {:.2} USD, {:.3} USD per useful GPU-hour, {} violations, \
             {:.0} s of market in {:.1} s",
            summary.strategy,
            summary.completed,
            summary.jobs,
            summary.cost_usd,
            summary.usd_per_useful_gpu_hour,
            summary.violations.len(),
            outcome.simulated_s,
            started.elapsed().as_secs_f64()
        );
        series.push((summary.strategy.clone(), report::cost_by_hour(&outcome)));
        for (cloud, created, e) in &outcome.ledger {
            instances.push_str(&format!(
                "{},{cloud},{},{},{},{},{},{created:.0},{:.0},{:.4}\n",
                summary.strategy,
                e.instance_id,
                e.name,
                e.offer_id,
                e.spot,
                e.price_per_hour,
                e.billed_seconds,
                e.cost_usd
            ));
        }
        for j in &outcome.jobs {
            job_rows.push_str(&format!(
                "{},{},{},{},{},{},{},{},{}\n",
                summary.strategy,
                j.id,
                j.time_to_running_s
                    .map_or(String::new(), |s| format!("{s:.0}")),
                j.completed,
                j.failed,
                j.preemptions,
                j.replacements,
                j.rentals,
                j.detection_delays_s
                    .iter()
                    .map(|d| format!("{d:.0}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        outcomes.push(outcome);
    }
    let summaries: Vec<Summary> = report::compare(&jobs, &outcomes);
    let mut md = String::from("# Market replay\n\n");
    md.push_str(&format!(
        "Trace {} (seed {}, {} days, {} events); {} jobs from {}.\n\n",
        trace_path.display(),
        trace
            .header
            .seed
            .map_or("none".to_owned(), |s| s.to_string()),
        trace.header.duration_s / 86_400,
        trace.events.len(),
        jobs.len(),
        jobs_path.display()
    ));
    md.push_str(&report::table(&summaries));
    md.push('\n');
    md.push_str(&report::reading(
        &summaries,
        "default",
        "single-provider",
        "cheapest-first",
    ));
    for s in &summaries {
        for v in &s.violations {
            md.push_str(&format!("- {}: {v}\n", s.strategy));
        }
    }
    std::fs::write(out.join("report.md"), &md)?;
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&summaries)?,
    )?;
    let mut csv = String::from("hour");
    for (name, _) in &series {
        csv.push(',');
        csv.push_str(name);
    }
    csv.push('\n');
    let hours = series.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
    for h in 0..hours {
        csv.push_str(&h.to_string());
        for (_, s) in &series {
            csv.push_str(&format!(
                ",{:.2}",
                s.get(h).or(s.last()).copied().unwrap_or(0.0)
            ));
        }
        csv.push('\n');
    }
    std::fs::write(out.join("cost-by-hour.csv"), csv)?;
    std::fs::write(out.join("instances.csv"), instances)?;
    std::fs::write(out.join("jobs.csv"), job_rows)?;
    plot::cumulative_cost(&out.join("cost.png"), &series)?;
    let ttr: Vec<(String, Vec<f64>)> = outcomes
        .iter()
        .map(|o| {
            let minutes = o
                .jobs
                .iter()
                .filter_map(|j| j.time_to_running_s)
                .map(|s| s / 60.0)
                .collect();
            (o.strategy.clone(), minutes)
        })
        .collect();
    plot::time_to_running(&out.join("time-to-running.png"), &ttr)?;
    let (prices, capacity) = market_series(&trace);
    plot::market(&out.join("market.png"), &prices, &capacity)?;
    std::io::stdout().write_all(md.as_bytes())?;
    let broken: usize = summaries.iter().map(|s| s.violations.len()).sum();
    anyhow::ensure!(
        broken == 0,
        "{broken} invariants broken (see {})",
        out.join("report.md").display()
    );
    Ok(())
}

type Series = Vec<(String, Vec<(f64, f64)>)>;

/// The prices (on-demand and spot) and free capacity over time of the single-GPU H100 and
/// RTX 4090 offers of the trace, in hours.
fn market_series(trace: &Trace) -> (Series, Series) {
    // RunPod offers carry the most GPUs a pod may take; Lambda and Vast offers are instances.
    let shown = |cloud: Cloud, gpu: &str, count: u32| {
        let gpu = gpu.to_lowercase();
        (cloud == Cloud::Runpod || count == 1) && (gpu.contains("h100") || gpu.contains("4090"))
    };
    let mut prices = Vec::new();
    let mut capacity = Vec::new();
    for (cloud, offer) in &trace.offers {
        let Some(id) = offer.id else { continue };
        if !shown(*cloud, &offer.gpu, offer.gpu_count) {
            continue;
        }
        let label = format!(
            "{cloud} {} {}",
            offer.gpu.trim_start_matches("NVIDIA "),
            offer.region
        );
        let events = trace.events.iter().filter(|e| e.provider == *cloud);
        let mut on_demand = vec![(0.0, offer.price_per_hour)];
        let mut spot: Vec<(f64, f64)> = offer
            .spot_price_per_hour
            .map(|p| (0.0, p))
            .into_iter()
            .collect();
        let mut free = vec![(0.0, f64::from(offer.capacity))];
        for event in events {
            let hour = event.at_s as f64 / 3600.0;
            match &event.change {
                Change::Price {
                    offer_id,
                    price_per_hour,
                    spot_price_per_hour,
                } if *offer_id == id => {
                    on_demand.push((hour, *price_per_hour));
                    if let Some(p) = spot_price_per_hour {
                        spot.push((hour, *p));
                    }
                }
                Change::Capacity {
                    offer_id,
                    available,
                } if *offer_id == id => free.push((hour, f64::from(*available))),
                _ => {}
            }
        }
        let end = trace.header.duration_s as f64 / 3600.0;
        for series in [&mut on_demand, &mut spot, &mut free] {
            if let Some(&(_, last)) = series.last() {
                series.push((end, last));
            }
        }
        let per_gpu = if *cloud == Cloud::Runpod {
            " (per GPU)"
        } else {
            ""
        };
        prices.push((format!("{label}{per_gpu}"), on_demand));
        if !spot.is_empty() {
            prices.push((format!("{label} spot{per_gpu}"), spot));
        }
        capacity.push((label, free));
    }
    (prices, capacity)
}
