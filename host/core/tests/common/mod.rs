//! Pods for translation tests, built from JSON the way a user writes them.
#![allow(dead_code)] // each test file uses a different part of these helpers

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// The smallest Pod the virtual node accepts: one container, an image, one GPU.
pub fn minimal_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": "1a2b"},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "pytorch/pytorch:2.4.0",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}
            }]
        }
    })
}

/// The minimal Pod with one annotation under `cloud.aibrix.ai/`.
pub fn pod_with_annotation(name: &str, value: &str) -> Pod {
    let mut pod = minimal_pod();
    pod["metadata"]["annotations"] = json!({ format!("cloud.aibrix.ai/{name}"): value });
    to_pod(pod)
}

/// Parses JSON into a Pod.
pub fn to_pod(v: Value) -> Pod {
    serde_json::from_value(v).expect("test pod is valid JSON for a Pod")
}
