//! Proves the test collector is a real OpenTelemetry Collector: an OTLP/HTTP JSON export is
//! accepted and lands, span and resource, in its traces file, both receivers listen on loopback,
//! and a stopped collector refuses connections on the ports it had.

use std::time::{Duration, Instant};

use neocloud_testenv::Collector;
use neocloud_testenv::otelcol::attributes;
use neocloud_testenv::registry::chain;
use serde_json::{Value, json};

/// Starts a collector; a failure reads as the error's message, which names `make testenv` when
/// the binary is missing.
async fn start() -> Collector {
    Collector::start().await.unwrap_or_else(|e| panic!("{e}"))
}

/// `host:port` of an `http://` endpoint.
fn addr(endpoint: &str) -> String {
    endpoint.trim_start_matches("http://").to_owned()
}

/// Polls `read` until it returns something, or panics with the collector's log after 10s.
async fn wait_for(collector: &Collector, read: impl Fn(&Collector) -> Vec<Value>) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let items = read(collector);
        if !items.is_empty() {
            return items;
        }
        assert!(
            Instant::now() < deadline,
            "nothing reached the collector's files in 10s; its log:\n{}",
            collector.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_otlp_http_json_trace_lands_in_the_traces_file() {
    let mut collector = start().await;
    let http = collector.otlp_http_endpoint();
    let grpc = collector.otlp_grpc_endpoint();
    assert!(http.starts_with("http://127.0.0.1:"), "{http}");
    assert!(grpc.starts_with("http://127.0.0.1:"), "{grpc}");
    assert_ne!(http, grpc);
    std::net::TcpStream::connect(addr(&grpc)).expect("the gRPC receiver listens");
    assert!(
        collector.read_spans().is_empty(),
        "a fresh collector is empty"
    );
    assert_eq!(collector.traces_file(), collector.dir().join("traces.json"));
    assert_eq!(
        collector.metrics_file(),
        collector.dir().join("metrics.json")
    );

    let request = json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "k8s.cluster.name", "value": {"stringValue": "test-cluster"}},
            {"key": "service.name", "value": {"stringValue": "neocloud-node"}},
        ]},
        "scopeSpans": [{
            "scope": {"name": "neocloud-testenv", "version": "1"},
            "spans": [{
                "traceId": "5b8efff798038103d269b633813fc60c",
                "spanId": "eee19b7ec3c1b174",
                "name": "reconcile",
                "kind": 1,
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000001000000000",
                "attributes": [
                    {"key": "neocloud.binding", "value": {"stringValue": "team-a/app"}},
                    {"key": "neocloud.attempt", "value": {"intValue": "2"}},
                ],
            }],
        }],
    }]});
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let response = client
        .post(format!("{http}/v1/traces"))
        .header("content-type", "application/json")
        .body(request.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(response.status(), 200, "{}", collector.log_tail(20));

    let spans = wait_for(&collector, Collector::read_spans).await;
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let span = &spans[0];
    assert_eq!(span["name"], "reconcile");
    assert_eq!(span["traceId"], "5b8efff798038103d269b633813fc60c");
    assert_eq!(span["spanId"], "eee19b7ec3c1b174");
    assert_eq!(
        span["resource"],
        json!({"k8s.cluster.name": "test-cluster", "service.name": "neocloud-node"})
    );
    assert_eq!(span["scope"]["name"], "neocloud-testenv");
    assert_eq!(
        Value::Object(attributes(span)),
        json!({"neocloud.binding": "team-a/app", "neocloud.attempt": 2})
    );
    assert!(
        collector.read_metrics().is_empty(),
        "traces do not reach the metrics file"
    );

    collector.stop();
    let err = std::net::TcpStream::connect(addr(&http)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    let err = std::net::TcpStream::connect(addr(&grpc)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    // A new client: the first one's pooled connection was merely closed.
    let err = reqwest::Client::new()
        .post(format!("{http}/v1/traces"))
        .header("content-type", "application/json")
        .body(request.to_string())
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{}", chain(&err));
    assert_eq!(
        collector.read_spans(),
        spans,
        "the spans outlive the process"
    );
    let log = collector.log_tail(50);
    assert!(
        log.contains("Everything is ready"),
        "the log outlives the process:\n{log}"
    );

    collector.stop();
    let dir = collector.dir().to_owned();
    drop(collector);
    if std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_none() {
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }
}

#[tokio::test]
async fn an_otlp_http_json_metric_lands_in_the_metrics_file() {
    let collector = start().await;
    let request = json!({"resourceMetrics": [{
        "resource": {"attributes": [
            {"key": "k8s.cluster.name", "value": {"stringValue": "test-cluster"}},
        ]},
        "scopeMetrics": [{
            "scope": {"name": "neocloud-testenv"},
            "metrics": [{
                "name": "neocloud.bindings",
                "unit": "1",
                "gauge": {"dataPoints": [{
                    "timeUnixNano": "1700000000000000000",
                    "asInt": "3",
                    "attributes": [{"key": "state", "value": {"stringValue": "placed"}}],
                }]},
            }],
        }],
    }]});
    let response = reqwest::Client::new()
        .post(format!("{}/v1/metrics", collector.otlp_http_endpoint()))
        .header("content-type", "application/json")
        .body(request.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(response.status(), 200, "{}", collector.log_tail(20));

    let metrics = wait_for(&collector, Collector::read_metrics).await;
    assert_eq!(metrics.len(), 1, "{metrics:#?}");
    assert_eq!(metrics[0]["name"], "neocloud.bindings");
    assert_eq!(metrics[0]["resource"]["k8s.cluster.name"], "test-cluster");
    let point = &metrics[0]["gauge"]["dataPoints"][0];
    assert_eq!(Value::Object(attributes(point)), json!({"state": "placed"}));
    assert!(collector.read_spans().is_empty());
}
