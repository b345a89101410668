//! CEL load and check: `CelEngine::compile_constraint` and `compile_rank` on any source, then one
//! evaluation of what loaded against a sample workload, offer and attempt.
//!
//! Properties: no panic, and the compiler thread never dies (a `CompilerThread` error means the
//! parser or checker panicked or overflowed its stack); a refusal's line:column is inside the
//! source (at most one past its last line and column); the same source loads the same way
//! twice; a rank that evaluates is finite.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use neocloud_policy::cel::{
    CelAttempt, CelEngine, CelError, CelGpu, CelInput, CelLimits, CelOffer, CelWorkload,
};

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    let engine = CelEngine::new(CelLimits::default());
    let (workload, offer, attempts) = sample();
    let input = CelInput {
        workload: &workload,
        offer: &offer,
        attempts: &attempts,
    };
    match engine.compile_constraint(src) {
        Ok(c) => drop(c.eval(&input)),
        Err(e) => refused(src, &e),
    }
    match engine.compile_rank(src) {
        Ok(r) => {
            if let Ok(v) = r.eval(&input) {
                assert!(v.is_finite(), "rank {src:?} evaluated to {v}");
            }
        }
        Err(e) => refused(src, &e),
    }
    let again = CelEngine::new(CelLimits::default());
    assert_eq!(
        engine.compile_rank(src).err(),
        again.compile_rank(src).err(),
        "{src:?} loads differently twice"
    );
});

fn refused(src: &str, e: &CelError) {
    assert!(
        !matches!(e, CelError::CompilerThread { .. }),
        "the compiler thread died on {src:?}: {e}"
    );
    if let Some(at) = e.position() {
        let lines: Vec<&str> = src.split('\n').collect();
        let line = at.line as usize;
        assert!(line >= 1 && line <= lines.len(), "{e} is past the source");
        let width = lines[line - 1].chars().count();
        assert!(
            at.column >= 1 && at.column as usize <= width + 1,
            "{e} is past its line of {width} characters"
        );
    }
}

fn sample() -> (CelWorkload, CelOffer, Vec<CelAttempt>) {
    let workload = CelWorkload {
        gpu_count: 1,
        gpu_models: vec!["A100 80GB".into()],
        max_price: 2.5,
        capacity_type: "on-demand".into(),
        regions: vec!["us-east".into()],
        image: "ghcr.io/org/img:1".into(),
        annotations: BTreeMap::from([("team".into(), "ml".into())]),
    };
    let offer = CelOffer {
        provider: "runpod".into(),
        id: "A100/SECURE/US-1".into(),
        gpu: CelGpu {
            model: "A100 80GB".into(),
            memory_gib: 80,
        },
        gpu_count: 1,
        price_per_hour: 1.89,
        spot: false,
        region: "us-east".into(),
        reliability: 0.99,
        verified: true,
        disk_gib: 40,
    };
    let attempts = vec![CelAttempt {
        provider: "vast".into(),
        offer_id: "123".into(),
        failure_class: "capacity".into(),
        message: "no longer available".into(),
    }];
    (workload, offer, attempts)
}
