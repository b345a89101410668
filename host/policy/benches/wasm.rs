//! Wasm engine benchmarks: (b) a placement decision over 1,000 offers per guest language,
//! instantiation included; (c) instantiation alone; (d) how far past its deadline a looping guest
//! runs. Besides criterion's estimates, each benchmark prints p50/p99 of its own samples to
//! stderr, since the targets are stated as p99.
//!
//! Needs the guests built by `make policies` (or `NEOCLOUD_POLICIES_DIR`).

#[path = "../tests/wasm_support/mod.rs"]
mod wasm_support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use neocloud_policy::wasm::{EngineConfig, PolicySettings, WasmEngine, WasmPolicy};
use wasm_support::{load, placement_input, settings, tight, with_log};

const OFFERS: usize = 1_000;
const GUESTS: [&str; 2] = ["placement-c", "placement-js"];

fn engine() -> WasmEngine {
    WasmEngine::new(EngineConfig {
        cache_dir: Some(std::env::temp_dir().join("neocloud-policy-wasm-bench-cache")),
        ..EngineConfig::default()
    })
    .expect("engine")
}

fn guest(engine: &WasmEngine, name: &str) -> WasmPolicy {
    let mut s: PolicySettings = with_log(settings(name));
    s.budget.deadline = Duration::from_secs(5);
    s.budget.memory_bytes = 256 << 20;
    load(engine, name, s)
}

/// Times `run` per call, prints p50 and p99 of the samples, and returns the total.
fn timed(samples: &mut Vec<Duration>, iters: u64, mut run: impl FnMut() -> Duration) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let took = run();
        samples.push(took);
        total += took;
    }
    total
}

fn report(name: &str, samples: &mut [Duration]) {
    if samples.is_empty() {
        return;
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "{name}: n={} p50={:?} p99={:?} max={:?}",
        samples.len(),
        at(0.50),
        at(0.99),
        samples[samples.len() - 1]
    );
}

fn placement_over_1000_offers(c: &mut Criterion) {
    let engine = engine();
    let input = placement_input(OFFERS);
    let mut group = c.benchmark_group("wasm_placement_1000_offers");
    group.throughput(Throughput::Elements(OFFERS as u64));
    for name in GUESTS {
        let policy = guest(&engine, name);
        assert!(policy.place(&input).verdict.applied().is_some());
        let mut samples = Vec::new();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed(&mut samples, iters, || {
                    let started = Instant::now();
                    black_box(policy.place(black_box(&input)));
                    started.elapsed()
                })
            })
        });
        report(&format!("wasm_placement_1000_offers/{name}"), &mut samples);
    }
    group.finish();
}

fn instantiation(c: &mut Criterion) {
    let engine = engine();
    let mut group = c.benchmark_group("wasm_instantiate");
    for name in GUESTS {
        let policy = guest(&engine, name);
        let mut samples = Vec::new();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed(&mut samples, iters, || {
                    let started = Instant::now();
                    policy.instantiate().expect("instantiates");
                    started.elapsed()
                })
            })
        });
        report(&format!("wasm_instantiate/{name}"), &mut samples);
    }
    group.finish();
}

/// Criterion's time here is the overrun (elapsed minus the 10 ms deadline), not the run time.
fn deadline_overrun(c: &mut Criterion) {
    let engine = engine();
    let deadline = Duration::from_millis(10);
    let mut s = tight("hostile-loop");
    s.budget.deadline = deadline;
    let policy = load(&engine, "hostile-loop", s);
    let input = placement_input(10);
    let mut samples = Vec::new();
    let mut group = c.benchmark_group("wasm_deadline_overrun");
    group.sample_size(20);
    group.bench_function("hostile-loop_10ms", |b| {
        b.iter_custom(|iters| {
            timed(&mut samples, iters, || {
                let started = Instant::now();
                let evaluation = policy.place(&input);
                assert!(evaluation.verdict.error().is_some());
                started.elapsed().saturating_sub(deadline)
            })
        })
    });
    report("wasm_deadline_overrun/hostile-loop_10ms", &mut samples);
    group.finish();
}

criterion_group!(
    benches,
    placement_over_1000_offers,
    instantiation,
    deadline_overrun
);
criterion_main!(benches);
