//! How CEL expressions evaluate: results, classified runtime errors, deadlines, batches, and the
//! typed fast path agreeing with the interpreter.

mod cel_support;

use std::time::Duration;

use cel_support::{attempts, offer, offers, workload};
use neocloud_policy::cel::{CelEngine, CelEvalError, CelEvalErrorKind, CelInput, CelLimits};
use nix::time::{ClockId, clock_gettime};
use proptest::prelude::*;

fn engine() -> CelEngine {
    CelEngine::new(CelLimits::default())
}

fn constraint(src: &str, i: usize) -> Result<bool, CelEvalError> {
    let (w, o, a) = (workload(), offer(i), attempts());
    engine().compile_constraint(src).unwrap().eval(&CelInput {
        workload: &w,
        offer: &o,
        attempts: &a,
    })
}

fn rank(src: &str, i: usize) -> Result<f64, CelEvalError> {
    let (w, o, a) = (workload(), offer(i), attempts());
    engine().compile_rank(src).unwrap().eval(&CelInput {
        workload: &w,
        offer: &o,
        attempts: &a,
    })
}

fn kind_of<T: std::fmt::Debug>(r: Result<T, CelEvalError>) -> CelEvalErrorKind {
    r.unwrap_err().kind()
}

#[test]
fn benchmark_constraint_keeps_cheap_big_us_offers_only() {
    // offer 0: H100 80 GiB, 0.20 $/h, us-east-1; offer 3: RTX-4090 24 GiB; offer 16: eu-central-1.
    assert_eq!(constraint(cel_support::BENCH_CONSTRAINT, 0), Ok(true));
    assert_eq!(constraint(cel_support::BENCH_CONSTRAINT, 3), Ok(false));
    assert_eq!(constraint(cel_support::BENCH_CONSTRAINT, 16), Ok(false));
}

#[test]
fn rank_returns_the_computed_number() {
    let o = offer(1);
    let want = o.reliability * 100.0 - o.price_per_hour * 10.0 + o.gpu.memory_gib as f64 / 8.0;
    assert_eq!(rank(cel_support::BENCH_RANK, 1), Ok(want));
    assert_eq!(rank("offer.gpu_count * 2", 1), Ok(4.0));
}

#[test]
fn workload_and_attempts_are_visible_to_expressions() {
    assert_eq!(
        constraint("offer.gpu.model in workload.gpu_models", 0),
        Ok(true)
    );
    assert_eq!(
        constraint("workload.annotations['team'] == 'ml'", 0),
        Ok(true)
    );
    assert_eq!(
        constraint("has(workload.annotations.team) && size(attempts) == 2", 0),
        Ok(true)
    );
    let src = "!attempts.exists(a, a.provider == offer.provider && a.failure_class == 'capacity')";
    assert_eq!(constraint(src, 2), Ok(false)); // offer 2 is on vast
    assert_eq!(constraint(src, 1), Ok(true));
}

#[test]
fn missing_annotation_is_classified_as_no_such_key_on_both_paths() {
    assert_eq!(
        kind_of(constraint("workload.annotations['nope'] == 'x'", 0)),
        CelEvalErrorKind::NoSuchKey
    );
    let interpreted = "attempts.all(a, workload.annotations['nope'] == 'x')";
    assert_eq!(
        kind_of(constraint(interpreted, 0)),
        CelEvalErrorKind::NoSuchKey
    );
}

#[test]
fn integer_division_by_zero_is_classified() {
    let src = "offer.gpu_count / (offer.gpu_count - offer.gpu_count)";
    assert_eq!(kind_of(rank(src, 0)), CelEvalErrorKind::DivisionByZero);
    let src = "[1].map(x, offer.gpu_count % (x - 1))[0]";
    assert_eq!(kind_of(rank(src, 0)), CelEvalErrorKind::DivisionByZero);
}

#[test]
fn integer_overflow_is_classified() {
    assert_eq!(
        kind_of(rank("9223372036854775807 + offer.gpu_count", 0)),
        CelEvalErrorKind::Overflow
    );
}

#[test]
fn mixed_int_and_double_arithmetic_the_checker_cannot_see_is_a_type_mismatch() {
    // Written plainly, this is refused at load (see cel_load.rs); through a list it is `dyn`.
    let err = rank("[offer.price_per_hour][0] * offer.gpu_count", 0).unwrap_err();
    assert_eq!(err.kind(), CelEvalErrorKind::TypeMismatch, "{err}");
}

#[test]
fn dynamic_result_of_the_wrong_type_is_classified_at_run_time() {
    let err = constraint("[offer.region].map(r, r)[0]", 0).unwrap_err();
    assert_eq!(err.kind(), CelEvalErrorKind::WrongResultType, "{err}");
    assert!(err.to_string().contains("expected bool"), "{err}");
}

#[test]
fn non_finite_rank_is_refused() {
    let err = rank("offer.price_per_hour / 0.0", 0).unwrap_err();
    assert_eq!(err.kind(), CelEvalErrorKind::WrongResultType, "{err}");
}

#[test]
fn and_absorbs_an_error_when_the_other_side_is_false() {
    assert_eq!(
        constraint("workload.annotations['nope'] == 'x' && false", 0),
        Ok(false)
    );
    assert_eq!(constraint("true || offer.gpu_count / 0 == 1", 0), Ok(true));
}

#[test]
fn batch_returns_one_result_per_offer_in_order() {
    let c = engine()
        .compile_constraint(cel_support::BENCH_CONSTRAINT)
        .unwrap();
    let offers = offers(100);
    let results = c.eval_batch(&workload(), &attempts(), &offers).unwrap();
    assert_eq!(results.len(), 100);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(
            *r,
            constraint(cel_support::BENCH_CONSTRAINT, i),
            "offer {i}"
        );
    }
}

#[test]
fn batch_past_its_deadline_fails_as_deadline_exceeded() {
    let limits = CelLimits {
        eval_deadline: Duration::from_micros(200),
        max_cost: u64::MAX,
        ..CelLimits::default()
    };
    let src = "attempts.all(a, attempts.all(b, a.message + b.message != offer.id))";
    let c = CelEngine::new(limits).compile_constraint(src).unwrap();
    let many: Vec<_> = (0..200).flat_map(|_| attempts()).collect();
    let err = c.eval_batch(&workload(), &many, &offers(1000)).unwrap_err();
    assert_eq!(err.kind(), CelEvalErrorKind::DeadlineExceeded, "{err}");
    assert!(err.is_transient());
}

#[test]
fn single_evaluation_past_its_deadline_fails_as_deadline_exceeded() {
    let limits = CelLimits {
        eval_deadline: Duration::from_micros(50),
        max_cost: u64::MAX,
        ..CelLimits::default()
    };
    let src = "attempts.all(a, attempts.all(b, a.message + b.message != offer.id))";
    let c = CelEngine::new(limits).compile_constraint(src).unwrap();
    let (w, o) = (workload(), offer(0));
    let many: Vec<_> = (0..200).flat_map(|_| attempts()).collect();
    let err = c
        .eval(&CelInput {
            workload: &w,
            offer: &o,
            attempts: &many,
        })
        .unwrap_err();
    assert_eq!(err.kind(), CelEvalErrorKind::DeadlineExceeded, "{err}");
}

#[test]
fn attempts_longer_than_the_list_limit_are_refused() {
    let limits = CelLimits {
        max_list_len: 3,
        ..CelLimits::default()
    };
    let c = CelEngine::new(limits)
        .compile_constraint("attempts.all(a, true)")
        .unwrap();
    let many: Vec<_> = (0..2).flat_map(|_| attempts()).collect();
    let err = c.eval_batch(&workload(), &many, &offers(1)).unwrap_err();
    assert_eq!(err.kind(), CelEvalErrorKind::InputTooLarge, "{err}");
}

/// Expressions the typed path runs; wrapped in a comprehension they run interpreted.
const TYPED_CONSTRAINTS: [&str; 8] = [
    cel_support::BENCH_CONSTRAINT,
    "offer.spot != offer.verified || offer.gpu_count >= workload.gpu_count * 4",
    "offer.region in ['us-east-1', 'ap-south-1'] && !(offer.provider == 'vast')",
    "offer.price_per_hour < 2 && offer.reliability >= 0.9 && offer.disk_gib % 20 == 10",
    "offer.gpu.model.endsWith('80GB') || offer.id.contains('7') ? offer.spot : offer.verified",
    "size(offer.region) > 9 && offer.provider < 'p' && -offer.gpu_count < -2",
    "'team' in workload.annotations && workload.annotations.team == 'ml' && offer.id > 'offer-5'",
    "offer.gpu_count / (offer.disk_gib - 50) > 0",
];

const TYPED_RANKS: [&str; 4] = [
    cel_support::BENCH_RANK,
    "offer.gpu_count * offer.gpu.memory_gib - size(attempts) + size(workload.regions)",
    "offer.spot ? offer.price_per_hour * 0.5 : -offer.price_per_hour",
    "double(offer.disk_gib) / (offer.reliability - 0.8)",
];

fn kind<T>(r: &Result<T, CelEvalError>) -> Option<CelEvalErrorKind> {
    r.as_ref().err().map(CelEvalError::kind)
}

proptest! {
    #[test]
    fn typed_path_agrees_with_the_interpreter(i in 0usize..2000, c in 0usize..8, r in 0usize..4) {
        let (typed_c, typed_r) = (TYPED_CONSTRAINTS[c], TYPED_RANKS[r]);
        let engine = engine();
        let tc = engine.compile_constraint(typed_c).unwrap();
        let ic = engine.compile_constraint(&format!("[0].all(_z, {typed_c})")).unwrap();
        let tr = engine.compile_rank(typed_r).unwrap();
        let ir = engine.compile_rank(&format!("[0].map(_z, {typed_r})[0]")).unwrap();
        prop_assert!(tc.is_typed() && tr.is_typed() && !ic.is_typed() && !ir.is_typed());
        let (w, o, a) = (workload(), offer(i), attempts());
        let input = CelInput { workload: &w, offer: &o, attempts: &a };
        let (t, n) = (tc.eval(&input), ic.eval(&input));
        prop_assert!(t.as_ref().ok() == n.as_ref().ok() && kind(&t) == kind(&n), "{typed_c}: {t:?} vs {n:?}");
        let (t, n) = (tr.eval(&input), ir.eval(&input));
        prop_assert!(t.as_ref().ok() == n.as_ref().ok() && kind(&t) == kind(&n), "{typed_r}: {t:?} vs {n:?}");
    }
}

/// The CPU time this thread has used: unlike the wall clock, it does not run on while the thread
/// waits for a core, so a bound on it holds however loaded the machine is.
fn thread_cpu_time() -> Duration {
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("the thread's CPU clock")
        .into()
}

#[test]
fn long_interpreted_evaluation_stops_soon_after_its_deadline() {
    let deadline = Duration::from_millis(20);
    let limits = CelLimits {
        eval_deadline: deadline,
        max_cost: u64::MAX,
        ..CelLimits::default()
    };
    let src = "attempts.all(a, attempts.all(b, a.message + b.message != offer.id))";
    let c = CelEngine::new(limits).compile_constraint(src).unwrap();
    let (w, o) = (workload(), offer(0));
    // 1,000 x 1,000 comparisons: far more work than the deadline allows.
    let many: Vec<_> = (0..500).flat_map(|_| attempts()).collect();
    let start = thread_cpu_time();
    let err = c
        .eval(&CelInput {
            workload: &w,
            offer: &o,
            attempts: &many,
        })
        .unwrap_err();
    // The evaluation ran on this thread: until the deadline it used at most the deadline's CPU
    // time (less when it waited for a core), after it only what stopping takes.
    let worked = thread_cpu_time() - start;
    assert_eq!(err.kind(), CelEvalErrorKind::DeadlineExceeded, "{err}");
    assert!(
        worked < deadline + Duration::from_millis(30),
        "worked {worked:?} of CPU time"
    );
}

/// `hack/bench/celgo` prints the same figures for cel-go over the same generated offers.
#[test]
fn benchmark_expressions_give_the_cel_go_figures_over_the_generated_offers() {
    let engine = engine();
    let (w, a, o) = (workload(), attempts(), offers(1000));
    let keep = engine
        .compile_constraint(cel_support::BENCH_CONSTRAINT)
        .unwrap();
    let kept = keep
        .eval_batch(&w, &a, &o)
        .unwrap()
        .into_iter()
        .filter(|r| *r == Ok(true))
        .count();
    assert_eq!(kept, 143);
    let rank = engine.compile_rank(cel_support::BENCH_RANK).unwrap();
    let sum: f64 = rank
        .eval_batch(&w, &a, &o)
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .sum();
    assert!((sum - 74030.0).abs() < 1e-6, "{sum}");
}
