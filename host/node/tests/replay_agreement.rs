//! The market replay places as the node does: the same market and jobs, once through the
//! replay's harness on a paused clock and once as Pods through the real reconciler on the real
//! control plane, rent the same offers, spot or not, in the same order, and a reclaim is a
//! preemption in both.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use neocloud_cloudsim::{CloudSim, OfferConfig, Timing};
use neocloud_node::crd::BindingPhase;
use neocloud_replay::harness::{self, Options};
use neocloud_replay::jobs::Job;
use neocloud_replay::strategy::Strategy;
use neocloud_replay::trace::{Change, Cloud, Event, FORMAT, Header, Trace};
use serde_json::json;
use support::world::World;

/// The Vast.ai offer whose spot instances are reclaimed.
const RECLAIMED: u64 = 7;
/// When, in seconds from the start (for the node: at the latest this, once the first spot
/// instance runs).
const RECLAIM_AT_S: u64 = 10;

fn offer(
    id: u64,
    gpu: &str,
    count: u32,
    price: f64,
    spot: Option<f64>,
    capacity: u32,
) -> OfferConfig {
    let mut offer: OfferConfig = serde_json::from_value(json!({
        "gpu": gpu, "gpu_count": count, "gpu_memory_gb": 80, "region": "Dallas, US",
        "price_per_hour": price, "spot_price_per_hour": spot, "capacity": capacity,
        "reliability": 0.99, "cloud": if gpu.starts_with("NVIDIA") { Some("SECURE") } else { None }
    }))
    .unwrap();
    offer.id = Some(id);
    offer
}

/// Three clouds with H100s: Vast.ai cheapest (two instances, spot at half price), then RunPod,
/// then Lambda; one reclaim of the Vast.ai spot offer.
fn trace() -> Trace {
    let quick = Timing {
        provisioning_ms: 1_000,
        starting_ms: 1_000,
        terminating_ms: 1_000,
    };
    Trace {
        header: Header {
            format: FORMAT.to_owned(),
            duration_s: 600,
            seed: None,
            sources: None,
            parameters: None,
        },
        timings: Cloud::ALL.iter().map(|c| (*c, quick)).collect(),
        offers: vec![
            (
                Cloud::Vast,
                offer(RECLAIMED, "H100 SXM", 1, 2.0, Some(1.0), 2),
            ),
            (
                Cloud::Runpod,
                offer(11, "NVIDIA H100 80GB HBM3", 8, 2.99, Some(1.75), 8),
            ),
            (
                Cloud::Lambda,
                offer(21, "gpu_1x_h100_sxm5", 1, 3.29, None, 2),
            ),
        ],
        events: vec![Event {
            at_s: RECLAIM_AT_S,
            provider: Cloud::Vast,
            change: Change::Reclaim {
                offer_id: RECLAIMED,
            },
        }],
    }
}

/// Three jobs, one after the other (the node places concurrently; one at a time, the order of
/// rentals, and so which job gets the last cheap instance, is the same in both).
fn jobs() -> Vec<Job> {
    let job = |id: &str, arrival_s: u64, spot_ok: bool| Job {
        id: id.to_owned(),
        arrival_s,
        work_s: 15,
        gpus: 1,
        models: vec!["H100".to_owned()],
        spot_ok,
        max_price_per_hour: None,
    };
    vec![
        job("spot", 0, true),
        job("steady", 3, false),
        job("third", 6, false),
    ]
}

/// (provider, offer, spot) of each instance, in the order rented.
type Rentals = Vec<(String, u64, bool)>;

fn rentals<'a>(entries: impl Iterator<Item = &'a neocloud_cloudsim::LedgerEntry>) -> Rentals {
    let mut entries: Vec<_> = entries.collect();
    entries.sort_by_key(|e| e.created_at);
    entries
        .iter()
        .map(|e| (e.provider.clone(), e.offer_id, e.spot))
        .collect()
}

/// The replay's rentals per job, on a paused clock in a runtime of its own.
fn replayed(trace: &Trace, jobs: &[Job]) -> BTreeMap<String, Rentals> {
    let (trace, jobs) = (trace.clone(), jobs.to_vec());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let strategy = Strategy::read(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../replay/strategies/default.json"),
        )
        .unwrap()
        .compile()
        .unwrap();
        let options = Options {
            poll_s: 1,
            retry_s: 1,
            give_up_s: 120,
            drain_s: 120,
            ..Options::default()
        };
        let outcome = runtime
            .block_on(harness::run(&trace, &jobs, &strategy, &options))
            .unwrap();
        assert_eq!(outcome.violations, Vec::<String>::new());
        assert!(
            outcome.jobs.iter().all(|j| j.completed),
            "{:?}",
            outcome.jobs
        );
        jobs.iter()
            .map(|job| {
                let prefix = format!("{}{}-", harness::NAME_PREFIX, job.id);
                let mine = outcome
                    .ledger
                    .iter()
                    .map(|(_, _, e)| e)
                    .filter(|e| e.name.starts_with(&prefix));
                (job.id.clone(), rentals(mine))
            })
            .collect()
    })
    .join()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_rents_what_the_node_rents_for_the_same_market_and_pods() {
    let trace = trace();
    let jobs = jobs();
    let replay = replayed(&trace, &jobs);

    let sims = CloudSim::start(harness::cloudsim_config(&trace))
        .await
        .unwrap();
    let world = World::with_sims("replay-agree", sims).await;
    for job in &jobs {
        let capacity = if job.spot_ok { "any" } else { "on-demand" };
        let annotations = json!({
            "cloud.aibrix.ai/gpu-type": job.models.join(","),
            "cloud.aibrix.ai/capacity-type": capacity,
        });
        world
            .create_pod_restarting(&job.id, annotations, "Always")
            .await;
        // The next Pod comes once this one has its instance.
        let rented = Instant::now();
        while world
            .bindings()
            .get_opt(&job.id)
            .await
            .unwrap()
            .and_then(|b| b.status)
            .is_none_or(|s| s.instance_id.is_none())
        {
            assert!(
                rented.elapsed() < Duration::from_secs(60),
                "{} not rented",
                job.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Each Pod runs its work on one instance; a new instance starts the work again. The reclaim
    // comes at RECLAIM_AT_S, or once the first spot instance runs if that is later.
    let start = Instant::now();
    let mut running_since: BTreeMap<String, (String, Instant)> = BTreeMap::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut reclaimed = false;
    let mut done: Vec<String> = Vec::new();
    while done.len() < jobs.len() {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "jobs done: {done:?}"
        );
        for job in &jobs {
            if done.contains(&job.id) {
                continue;
            }
            let Some(b) = world.bindings().get_opt(&job.id).await.unwrap() else {
                continue;
            };
            names.insert(job.id.clone(), b.spec.external_name.clone());
            let Some(status) = b.status else { continue };
            let Some(instance) = status.instance_id.clone() else {
                continue;
            };
            if status.phase != BindingPhase::Running {
                continue;
            }
            let since = running_since
                .entry(job.id.clone())
                .or_insert_with(|| (instance.clone(), Instant::now()));
            if since.0 != instance {
                *since = (instance.clone(), Instant::now());
            }
            if since.1.elapsed() >= Duration::from_secs(job.work_s) {
                world
                    .pods()
                    .delete(&job.id, &Default::default())
                    .await
                    .unwrap();
                done.push(job.id.clone());
            }
        }
        if !reclaimed
            && start.elapsed() >= Duration::from_secs(RECLAIM_AT_S)
            && running_since.contains_key("spot")
        {
            let live: Vec<String> = world
                .sims
                .vast
                .ledger()
                .entries
                .into_iter()
                .filter(|e| e.is_live() && e.spot && e.offer_id == RECLAIMED)
                .map(|e| e.instance_id)
                .collect();
            assert!(!live.is_empty(), "the spot job runs on the reclaimed offer");
            for id in live {
                assert!(world.sims.vast.preempt(&id));
            }
            reclaimed = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for job in &jobs {
        world.wait_gone(&job.id).await;
    }
    let ledger = world.sims.ledger();
    assert!(ledger.live().is_empty(), "{:?}", ledger.live());
    let node: BTreeMap<String, Rentals> = jobs
        .iter()
        .map(|job| {
            let name = &names[&job.id];
            let mine = ledger
                .entries
                .iter()
                .filter(|e| e.name.starts_with(name.as_str()));
            (job.id.clone(), rentals(mine))
        })
        .collect();
    assert_eq!(
        node, replay,
        "the node (left) and the replay (right) rented differently"
    );
    // The cases the comparison is for: the last cheap instance taken, the next cloud rented;
    // a reclaim, and spot again under the node's default.
    assert_eq!(
        replay["steady"],
        vec![("vast".to_owned(), RECLAIMED, false)]
    );
    assert_eq!(replay["third"], vec![("runpod".to_owned(), 11, false)]);
    assert_eq!(
        replay["spot"],
        vec![
            ("vast".to_owned(), RECLAIMED, true),
            ("vast".to_owned(), RECLAIMED, true)
        ]
    );
}
