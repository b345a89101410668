//! CEL engine benchmarks: a constraint and a rank over 1,000 offers (typed fast path and the
//! interpreter), one evaluation, and compilation. `hack/bench/celgo` runs the same expressions
//! over the same offers with cel-go.

#[path = "../tests/cel_support/mod.rs"]
mod cel_support;

use std::hint::black_box;

use cel_support::{BENCH_CONSTRAINT, BENCH_RANK, attempts, offers, workload};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use neocloud_policy::cel::{CelEngine, CelInput, CelLimits};

const OFFERS: usize = 1_000;

fn over_offers(c: &mut Criterion) {
    let engine = CelEngine::new(CelLimits::default());
    let (w, a, o) = (workload(), attempts(), offers(OFFERS));
    let interpreted_constraint = format!("[0].all(_z, {BENCH_CONSTRAINT})");
    let interpreted_rank = format!("[0].map(_z, {BENCH_RANK})[0]");
    let mut group = c.benchmark_group("cel_1000_offers");
    group.throughput(Throughput::Elements(OFFERS as u64));
    let constraint = engine.compile_constraint(BENCH_CONSTRAINT).unwrap();
    let rank = engine.compile_rank(BENCH_RANK).unwrap();
    group.bench_function("constraint_typed", |b| {
        b.iter(|| constraint.eval_batch(&w, &a, black_box(&o)).unwrap())
    });
    group.bench_function("rank_typed", |b| {
        b.iter(|| rank.eval_batch(&w, &a, black_box(&o)).unwrap())
    });
    group.bench_function("constraint_then_rank_typed", |b| {
        b.iter(|| {
            let keep = constraint.eval_batch(&w, &a, black_box(&o)).unwrap();
            let kept: Vec<_> = o
                .iter()
                .zip(keep)
                .filter(|(_, k)| *k == Ok(true))
                .map(|(o, _)| o.clone())
                .collect();
            rank.eval_batch(&w, &a, &kept).unwrap()
        })
    });
    let ic = engine.compile_constraint(&interpreted_constraint).unwrap();
    let ir = engine.compile_rank(&interpreted_rank).unwrap();
    group.bench_function("constraint_interpreted", |b| {
        b.iter(|| ic.eval_batch(&w, &a, black_box(&o)).unwrap())
    });
    group.bench_function("rank_interpreted", |b| {
        b.iter(|| ir.eval_batch(&w, &a, black_box(&o)).unwrap())
    });
    group.finish();
}

fn one_evaluation(c: &mut Criterion) {
    let engine = CelEngine::new(CelLimits::default());
    let (w, a, o) = (workload(), attempts(), offers(1));
    let input = CelInput {
        workload: &w,
        offer: &o[0],
        attempts: &a,
    };
    let constraint = engine.compile_constraint(BENCH_CONSTRAINT).unwrap();
    let rank = engine.compile_rank(BENCH_RANK).unwrap();
    let mut group = c.benchmark_group("cel_one_offer");
    group.bench_function("constraint_typed", |b| {
        b.iter(|| constraint.eval(black_box(&input)))
    });
    group.bench_function("rank_typed", |b| b.iter(|| rank.eval(black_box(&input))));
    group.finish();
}

fn compile(c: &mut Criterion) {
    let mut group = c.benchmark_group("cel_compile");
    group.sample_size(20);
    for (name, src) in [("constraint", BENCH_CONSTRAINT), ("rank", BENCH_RANK)] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || CelEngine::new(CelLimits::default()),
                |engine| {
                    if name == "rank" {
                        engine.compile_rank(src).map(|_| ()).unwrap();
                    } else {
                        engine.compile_constraint(src).map(|_| ()).unwrap();
                    }
                    engine
                },
                BatchSize::SmallInput,
            )
        });
    }
    let engine = CelEngine::new(CelLimits::default());
    engine.compile_constraint(BENCH_CONSTRAINT).unwrap();
    group.bench_function("constraint_cached", |b| {
        b.iter(|| {
            engine
                .compile_constraint(black_box(BENCH_CONSTRAINT))
                .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, over_offers, one_evaluation, compile);
criterion_main!(benches);
