//! A TLS listener served within [`ServeLimits`], against slow-loris clients and a flood of idle
//! connections.

use std::time::Duration;

use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::tls::{TlsMaterial, test_connect as connect};

/// A server of `GET /healthz` and `POST /echo` (which reads its body) within `limits`; its
/// address, certificate, and the sender that stops it.
async fn server(limits: ServeLimits) -> (SocketAddr, String, watch::Sender<bool>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
    let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let config = tls.server_config(None).expect("config");
    let (listener, _accepting) = TlsListener::new(tcp, config, "test").expect("listener");
    let addr = Listener::local_addr(&listener).expect("addr");
    let router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/echo", post(|body: Bytes| async move { body }));
    let (stop, stopped) = watch::channel(false);
    let peer = |_: &TlsStream<TcpStream>, addr| addr;
    tokio::spawn(serve(
        listener,
        router,
        limits,
        peer,
        stopped,
        Tasks::default(),
    ));
    (addr, tls.cert_pem().to_owned(), stop)
}

/// `GET /healthz` on a fresh connection: the response's text.
async fn healthz(addr: SocketAddr, cert_pem: &str) -> std::io::Result<String> {
    let mut tls = connect(addr, cert_pem).await?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: node\r\nconnection: close\r\n\r\n")
        .await?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Sends `head` at once, then one byte of `trickle` every 500 ms; returns how many bytes of
/// the trickle were sent when the server closed the connection (reading EOF or an error).
async fn slow_loris(addr: SocketAddr, cert_pem: String, head: &'static [u8]) -> usize {
    let tls = connect(addr, &cert_pem).await.expect("handshake");
    let (mut read, mut write) = tokio::io::split(tls);
    write.write_all(head).await.expect("head");
    let mut sent = 0;
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            r = read.read(&mut buf) => match r {
                Ok(0) | Err(_) => return sent,
                Ok(_) => {} // an error response; the close follows
            },
            () = tokio::time::sleep(Duration::from_millis(500)) => {
                if write.write_all(b"a").await.is_err() {
                    return sent;
                }
                sent += 1;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_connections_are_cut_off_and_a_request_is_answered_meanwhile() {
    let limits = ServeLimits {
        max_connections: 256,
        header_read_timeout: Duration::from_secs(2),
        body_timeout: Duration::from_secs(3),
    };
    let (addr, cert, _stop) = server(limits).await;
    let mut flood = tokio::task::JoinSet::new();
    for n in 0..150 {
        let head: &'static [u8] = if n % 2 == 0 {
            // Headers that never end.
            b"GET /healthz HTTP/1.1\r\nhost: node\r\nx-slow: "
        } else {
            // A body that never ends.
            b"POST /echo HTTP/1.1\r\nhost: node\r\ncontent-length: 100000\r\n\r\n"
        };
        flood.spawn(slow_loris(addr, cert.clone(), head));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), healthz(addr, &cert))
        .await
        .expect("answered during the flood")
        .expect("request");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    // Each slow connection is closed, long before it could send its 100,000 bytes (a trickle
    // kept up for 60 s would have sent 120 of them).
    let cut = tokio::time::timeout(Duration::from_secs(60), async {
        let mut most = 0;
        while let Some(sent) = flood.join_next().await {
            most = most.max(sent.expect("slow client"));
        }
        most
    });
    let most = cut
        .await
        .expect("every slow-loris connection was closed within 60 s");
    assert!(
        most < 120,
        "a slow client sent {most} bytes before it was cut off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_and_later_ones_served() {
    let limits = ServeLimits {
        max_connections: 8,
        header_read_timeout: Duration::from_secs(300),
        ..ServeLimits::default()
    };
    let (addr, cert, _stop) = server(limits).await;
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(connect(addr, &cert).await.expect("idle connect"));
    }
    // The ninth completes its handshake and is closed at once (no header timeout for 300 s).
    let refused = tokio::time::timeout(Duration::from_secs(20), healthz(addr, &cert))
        .await
        .expect("closed in time");
    assert!(
        refused.as_ref().map_or(true, |answer| answer.is_empty()),
        "{refused:?}"
    );
    drop(idle);
    let served = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(answer) = healthz(addr, &cert).await
                && answer.starts_with("HTTP/1.1 200")
            {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert!(
        served
            .await
            .expect("served once the idle ones closed")
            .ends_with("ok")
    );
}
