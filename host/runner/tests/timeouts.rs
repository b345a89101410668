//! The runner's client gives up on a node that accepts its connections and never answers: every
//! request has a timeout, and the log stream, which has no total timeout, a watchdog that lets
//! a stream the node keeps taking run on.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use neocloud_protocol::Secret;
use neocloud_runner::{CallbackClient, RunnerError};
use rustls::ServerConfig;
use rustls::pki_types::PrivateKeyDer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The request timeout the tests give the client.
const LIMIT: Duration = Duration::from_millis(300);
/// How long a test waits before it calls the client hung.
const HUNG: Duration = Duration::from_secs(90);

/// A TLS server that reads everything and answers nothing, except `POST /v1/token` when
/// `exchanges` (so the client gets a session to call the other routes with).
async fn silent_node(exchanges: bool) -> CallbackClient {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let key = PrivateKeyDer::try_from(certified.signing_key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                while exchanges && answer_exchange(&mut tls).await {}
                let _ = tokio::io::copy(&mut tls, &mut tokio::io::sink()).await;
            });
        }
    });
    CallbackClient::new(&url, certified.cert.pem().as_bytes())
        .unwrap()
        .with_request_timeout(LIMIT)
}

/// Reads one request; answers it if it is the token exchange (true), else leaves it be.
async fn answer_exchange<S: AsyncRead + tokio::io::AsyncWrite + Unpin>(io: &mut S) -> bool {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if io.read_exact(&mut byte).await.is_err() {
            return false;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    if !head.starts_with("post /v1/token ") {
        return false;
    }
    let length = (head.lines())
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    if io.read_exact(&mut body).await.is_err() {
        return false;
    }
    let expires = chrono::Utc::now().timestamp() + 3600;
    let json = format!(
        r#"{{"sessionToken":"t","expiresAt":{expires},"spiffeId":"spiffe://test/runner"}}"#
    );
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{json}",
        json.len()
    );
    io.write_all(answer.as_bytes()).await.is_ok()
}

fn assert_timed_out(e: &RunnerError) {
    assert!(
        e.to_string().contains("timed out") && e.is_transient(),
        "not a transient timeout: {e}"
    );
}

#[tokio::test]
async fn the_token_exchange_with_a_node_that_never_answers_fails_with_a_timeout() {
    let client = silent_node(false).await;
    let exchanged = tokio::time::timeout(HUNG, client.exchange(&Secret::new("bootstrap"))).await;
    let e = exchanged
        .expect("the exchange gives up")
        .expect_err("no answer");
    assert_timed_out(&e);
}

#[tokio::test]
async fn a_call_the_node_never_answers_fails_with_a_timeout() {
    let client = silent_node(true).await;
    client
        .exchange(&Secret::new("bootstrap"))
        .await
        .expect("exchange");
    let beat = tokio::time::timeout(HUNG, client.heartbeat(None)).await;
    assert_timed_out(
        &beat
            .expect("the heartbeat gives up")
            .expect_err("no answer"),
    );
}

/// A log stream the node takes (and never answers) runs on past the limit while it lasts, and
/// fails once it has ended and the node still says nothing.
#[tokio::test]
async fn a_log_stream_runs_while_the_node_takes_it_and_fails_when_it_never_answers() {
    let client = silent_node(true).await;
    client
        .exchange(&Secret::new("bootstrap"))
        .await
        .expect("exchange");
    let ticks = 15;
    let body = futures::stream::unfold(0, move |n| async move {
        if n == ticks {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        Some((Ok::<_, std::io::Error>(Bytes::from_static(b"{}\n")), n + 1))
    });
    let started = tokio::time::Instant::now();
    let sent = tokio::time::timeout(HUNG, client.logs(body)).await;
    assert_timed_out(&sent.expect("the stream gives up").expect_err("no answer"));
    assert!(
        started.elapsed() >= Duration::from_millis(100 * ticks),
        "the stream was cut while the node took it, after {:?}",
        started.elapsed()
    );
}
