//! The node's HTTP endpoint for Prometheus and the kubelet probes: `GET /metrics` (OpenMetrics
//! text), `GET /healthz` (the process answers) and `GET /readyz` (the node is ready to serve).
//!
//! Not the kubelet API (logs, exec) and not the runner callback; those have their own servers.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::Metrics;

/// The content type of an OpenMetrics text exposition.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone)]
struct Endpoint {
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the listener fails. `/readyz`
/// answers 200 while `*ready.borrow()` is true and 503 otherwise (also after the sender is
/// dropped with `false` as its last value).
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router(Endpoint { metrics, ready })).await
}

fn router(endpoint: Endpoint) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readiness))
        .with_state(endpoint)
}

async fn scrape(State(endpoint): State<Endpoint>) -> Response {
    let body = endpoint.metrics.encode();
    ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response()
}

async fn readiness(State(endpoint): State<Endpoint>) -> Response {
    let ready = *endpoint.ready.borrow();
    if ready {
        (StatusCode::OK, "ok").into_response()
    } else {
        let reason = "not ready: the node has not signalled readiness";
        (StatusCode::SERVICE_UNAVAILABLE, reason).into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use neocloud_core::ProviderId;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::metrics::RentalOutcome;
    use crate::metrics::tests::sample;

    /// A real HTTP/1.1 GET over TCP: the status code, the headers (lower-cased) and the body.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_lowercase(), body.to_owned())
    }

    async fn start(metrics: Arc<Metrics>, ready: watch::Receiver<bool>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, metrics, ready));
        addr
    }

    #[tokio::test]
    async fn scrape_over_http_returns_openmetrics_with_recorded_values() {
        let metrics = Arc::new(Metrics::new());
        let (_tx, ready) = watch::channel(true);
        let addr = start(metrics.clone(), ready).await;
        metrics.record_rental(ProviderId::Lambda, RentalOutcome::Created);

        let (status, head, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.contains(&format!("content-type: {OPENMETRICS}")),
            "{head}"
        );
        let created = r#"neocloud_rentals_total{provider="lambda",outcome="created",class="none"}"#;
        assert_eq!(sample(&body, created), Some(1.0), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");

        let (status, _, body) = get(addr, "/healthz").await;
        assert_eq!((status, body.as_str()), (200, "ok"));
        let (status, _, _) = get(addr, "/nope").await;
        assert_eq!(status, 404);
    }

    #[tokio::test]
    async fn readyz_turns_from_503_to_200_when_ready_is_signalled() {
        let (tx, ready) = watch::channel(false);
        let addr = start(Arc::new(Metrics::new()), ready).await;

        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.starts_with("not ready"), "{body}");

        tx.send(true).unwrap();
        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (200, "ok"));
    }
}
