//! The `cloud.aibrix.ai/*` annotation parser and the Pod translation (`translate_pod`).
//!
//! The first byte picks the shape: even, the rest is a whole Pod as JSON; odd, the rest is
//! `key=value` lines put as annotations on a Pod that is otherwise accepted (a key without a `/`
//! gets the `cloud.aibrix.ai/` prefix), which keeps the fuzzer on the annotation parser.
//!
//! Properties: no panic; a refusal is never empty and each one names a field and a reason; an
//! annotation refusal names an annotation the Pod has; an accepted Pod has only known
//! annotations under the prefix, a positive GPU count, a finite positive price, positive disk
//! sizes and expressions within the length limit.
#![no_main]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use neocloud_core::translate::{ANNOTATION_PREFIX, KNOWN_ANNOTATIONS, MAX_EXPRESSION_BYTES};
use neocloud_core::{WorkloadSpec, translate_pod};

const BASE_POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},
"spec":{"containers":[{"name":"main","image":"ghcr.io/org/img:1",
"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}"#;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let pod = if mode % 2 == 0 {
        match serde_json::from_slice::<Pod>(rest) {
            Ok(pod) => pod,
            Err(_) => return,
        }
    } else {
        with_annotations(&String::from_utf8_lossy(rest))
    };
    check(&pod);
});

fn with_annotations(text: &str) -> Pod {
    let mut pod: Pod = serde_json::from_str(BASE_POD).expect("the base Pod parses");
    let mut annotations = BTreeMap::new();
    for line in text.split('\n') {
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        let key = if key.contains('/') {
            key.to_owned()
        } else {
            format!("{ANNOTATION_PREFIX}{key}")
        };
        annotations.insert(key, value.to_owned());
    }
    pod.metadata.annotations = Some(annotations);
    pod
}

fn check(pod: &Pod) {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    match translate_pod(pod) {
        Ok(workload) => accepted(&workload, &annotations),
        Err(refused) => {
            assert!(!refused.refusals.is_empty(), "a refusal with no reason");
            for r in &refused.refusals {
                assert!(!r.field.is_empty() && !r.reason.is_empty(), "{r:?}");
                if let Some(key) = r
                    .field
                    .strip_prefix("metadata.annotations[")
                    .and_then(|k| k.strip_suffix(']'))
                {
                    assert!(annotations.contains_key(key), "{r} names no annotation");
                }
            }
        }
    }
}

fn accepted(w: &WorkloadSpec, annotations: &BTreeMap<String, String>) {
    for key in annotations.keys() {
        if let Some(name) = key.strip_prefix(ANNOTATION_PREFIX) {
            assert!(KNOWN_ANNOTATIONS.contains(&name), "unknown {key} accepted");
        }
    }
    assert!(w.gpu.count > 0, "zero GPUs accepted");
    if let Some(p) = w.max_price_per_hour {
        assert!(p.is_finite() && p > 0.0, "max price {p} accepted");
    }
    assert!(w.disk_gib != Some(0), "zero disk accepted");
    assert!(w.hints.vast.disk_gib > 0, "zero vast disk accepted");
    for e in [&w.constraint, &w.rank].into_iter().flatten() {
        assert!(
            !e.trim().is_empty() && e.len() <= MAX_EXPRESSION_BYTES,
            "{e:?}"
        );
    }
    assert!(!w.image.is_empty(), "an empty image accepted");
}
