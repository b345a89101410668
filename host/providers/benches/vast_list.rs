//! Lists 1,000 Vast.ai instances through keyset pagination (40 pages of 25) against the
//! in-process simulator, twice: through the adapter's `list_ours` (request building, auth,
//! retry bookkeeping, typed decoding, conversion to instance states, prefix filtering) and as a
//! raw reqwest GET loop over the same pages that only reads `next_token`. The difference divided
//! by the page count is the adapter's overhead per call.
//!
//! Run: `cargo bench -p neocloud-providers --bench vast_list -- --warm-up-time 1 --measurement-time 5`

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use neocloud_cloudsim::{SimConfig, VastSim};
use neocloud_providers::{ApiKey, Provider, VastConfig, VastProvider};
use serde_json::Value;

const INSTANCES: usize = 1_000;
const PAGE: usize = 25;

struct Rig {
    runtime: tokio::runtime::Runtime,
    sim: VastSim,
    adapter: VastProvider,
    client: reqwest::Client,
}

fn rig() -> Rig {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let sim = runtime
        .block_on(VastSim::start(SimConfig::fast()))
        .expect("the simulator starts");
    sim.seed_instances(INSTANCES, "nc-bench-");
    let mut config = VastConfig::new(ApiKey::new(sim.api_key()));
    config.base_url = sim.base_url();
    let adapter = VastProvider::new(config).expect("the adapter builds");
    Rig {
        runtime,
        sim,
        adapter,
        client: reqwest::Client::new(),
    }
}

/// Only what the raw loop reads of a page: the token and how many instances it holds.
#[derive(serde::Deserialize)]
struct RawPage {
    instances: Vec<serde::de::IgnoredAny>,
    next_token: Option<String>,
}

/// The raw loop: same query parameters and bearer key; each body is read only for `next_token`
/// and the instance count, so it is the floor any client pays for the round trips.
async fn raw_list(rig: &Rig) -> usize {
    let url = format!("{}/api/v1/instances/", rig.sim.base_url());
    let mut token: Option<String> = None;
    let mut seen = 0;
    loop {
        let mut params = vec![
            ("limit", PAGE.to_string()),
            ("order_by", r#"[{"col":"id","dir":"asc"}]"#.to_owned()),
        ];
        if let Some(t) = &token {
            params.push(("after_token", Value::from(t.as_str()).to_string()));
        }
        let request = rig
            .client
            .get(&url)
            .bearer_auth(rig.sim.api_key())
            .query(&params);
        let response = request.send().await.expect("page");
        let page: RawPage = response.json().await.expect("json");
        seen += page.instances.len();
        match page.next_token {
            Some(next) => token = Some(next),
            None => return seen,
        }
    }
}

async fn adapter_list(rig: &Rig) -> usize {
    rig.adapter
        .list_ours("nc-bench-")
        .await
        .expect("listing works")
        .len()
}

/// A plain-timer summary printed beside criterion's: mean per listing and per page.
fn summary(rig: &Rig) {
    let runs = 20;
    let time = |f: &dyn Fn() -> usize| {
        let start = Instant::now();
        for _ in 0..runs {
            assert_eq!(f(), INSTANCES);
        }
        start.elapsed() / runs
    };
    let raw = time(&|| rig.runtime.block_on(raw_list(rig)));
    let adapter = time(&|| rig.runtime.block_on(adapter_list(rig)));
    let pages = (INSTANCES / PAGE) as u32;
    let overhead_us = (adapter.as_secs_f64() - raw.as_secs_f64()) * 1e6 / f64::from(pages);
    eprintln!(
        "vast_list summary: {INSTANCES} instances, {pages} pages; raw {raw:?} per listing ({:?} per page); \
         adapter {adapter:?} per listing ({:?} per page); adapter overhead {overhead_us:+.1} µs per call (negative: within noise)",
        raw / pages,
        adapter / pages
    );
}

fn bench(c: &mut Criterion) {
    let rig = rig();
    assert_eq!(rig.runtime.block_on(raw_list(&rig)), INSTANCES);
    assert_eq!(rig.runtime.block_on(adapter_list(&rig)), INSTANCES);
    summary(&rig);
    let mut group = c.benchmark_group("vast_list_1000_instances");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.bench_function("raw_reqwest_pages", |b| {
        b.iter(|| rig.runtime.block_on(raw_list(&rig)))
    });
    group.bench_function("adapter_list_ours", |b| {
        b.iter(|| rig.runtime.block_on(adapter_list(&rig)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
