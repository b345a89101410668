//! Helpers shared by the HTTP tests: a client, JSON responses, and waiting for a status.

#![allow(dead_code)]

use std::time::Duration;

use reqwest::{RequestBuilder, StatusCode};
use serde_json::Value;

/// A client with a short timeout so that a hung simulator fails the test.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Sends a request and returns its status and JSON body (`Null` if empty or not JSON).
pub async fn call(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("request reaches the simulator");
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Polls `read` until `done` holds on its result or 5 seconds pass; returns every value seen.
pub async fn poll_until<F, Fut>(mut read: F, done: impl Fn(&Value) -> bool) -> Vec<Value>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let mut seen = Vec::new();
    for _ in 0..100 {
        let value = read().await;
        let finished = done(&value);
        seen.push(value);
        if finished {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "condition not reached; last values: {:?}",
        seen.iter().rev().take(3).collect::<Vec<_>>()
    );
}

/// The distinct values in order of first appearance.
pub fn distinct(values: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for value in values {
        if out.last() != Some(&value) {
            out.push(value);
        }
    }
    out
}

/// A config whose state changes are slow enough (300 ms each) to observe every status by
/// polling, even on a loaded machine.
pub fn observable() -> neocloud_cloudsim::SimConfig {
    let timing = neocloud_cloudsim::Timing {
        provisioning_ms: 300,
        starting_ms: 300,
        terminating_ms: 300,
    };
    neocloud_cloudsim::SimConfig {
        timing,
        ..neocloud_cloudsim::SimConfig::fast()
    }
}
