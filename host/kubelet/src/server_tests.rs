//! The kubelet server over real TLS with a fake API server and Pod: what its shutdown ends.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use neocloud_remote::callback::{LogOptions, SessionIo};
use neocloud_remote::tls::{TlsMaterial, test_connect};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::super::auth::{AccessReview, Decision, ReviewError, UserInfo};
use super::super::spdy::frame::{self, Deflater, Frame, Inflater};
use super::super::workloads::{LogError, PodRef, Workloads};
use super::super::{KubeletConfig, KubeletServer};
use neocloud_protocol::session::SessionRequest;

/// Any token is alice's, and alice may do anything.
struct Everyone;

#[async_trait]
impl AccessReview for Everyone {
    async fn review_token(&self, _: &str) -> Result<Option<UserInfo>, ReviewError> {
        let alice = UserInfo {
            name: "alice".into(),
            ..Default::default()
        };
        Ok(Some(alice))
    }

    async fn review_access(
        &self,
        _: &UserInfo,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Decision, ReviewError> {
        let reason = String::new();
        Ok(Decision {
            allowed: true,
            reason,
        })
    }
}

/// A Pod whose sessions are in-memory pipes; keeps the runner's end of each.
#[derive(Default)]
struct Pipes(Mutex<Vec<DuplexStream>>);

#[async_trait]
impl Workloads for Pipes {
    async fn logs(
        &self,
        pod: &PodRef,
        _: &str,
        _: LogOptions,
    ) -> Result<BoxStream<'static, Bytes>, LogError> {
        Err(LogError::PodNotFound { pod: pod.clone() })
    }

    async fn open_session(
        &self,
        _: &PodRef,
        _: Option<&str>,
        _: SessionRequest,
    ) -> Result<SessionIo, LogError> {
        let (ours, runner) = tokio::io::duplex(1024);
        self.0.lock().push(runner);
        Ok(Box::new(ours))
    }
}

/// Upgrades a port-forward request to SPDY on a fresh connection to `server`.
async fn port_forward(
    server: &KubeletServer,
    cert_pem: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut tls = test_connect(server.local_addr(), cert_pem)
        .await
        .expect("connect and handshake");
    let request = "POST /portForward/ns/job HTTP/1.1\r\nhost: node\r\nauthorization: Bearer t\r\n\
                   connection: Upgrade\r\nupgrade: SPDY/3.1\r\n\
                   x-stream-protocol-version: portforward.k8s.io\r\n\r\n";
    tls.write_all(request.as_bytes()).await.expect("request");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tls.read_u8().await.expect("response"));
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    tls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_spdy_sessions_and_their_forwarded_connections() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
    let mut config = KubeletConfig::new("node");
    config.listen = "127.0.0.1:0".parse().unwrap();
    let pipes = Arc::new(Pipes::default());
    let server = KubeletServer::start(config, &tls, Arc::new(Everyone), pipes.clone())
        .await
        .expect("start");
    let mut client = port_forward(&server, tls.cert_pem()).await;
    let mut out = Vec::new();
    let mut deflater = Deflater::default();
    for (id, kind) in [(1, "error"), (3, "data")] {
        let headers = [("streamtype", kind), ("port", "80"), ("requestid", "0")]
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .to_vec();
        let syn = Frame::SynStream(id, false, headers);
        syn.encode(&mut out, &mut deflater).unwrap();
    }
    client.write_all(&out).await.unwrap();
    // The forwarded connection is open once the Pod's side has its session.
    tokio::time::timeout(Duration::from_secs(20), async {
        while pipes.0.lock().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the session was opened");

    tokio::time::timeout(Duration::from_secs(60), server.shutdown())
        .await
        .expect("shutdown returned");
    let mut runner = pipes.0.lock().pop().expect("the runner's end");
    let mut buf = [0u8; 64];
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while runner.read(&mut buf).await.expect("read") > 0 {}
    });
    ended
        .await
        .expect("the forwarded connection ended with the server");
    // The client reads its SYN_REPLYs, then the end of the connection.
    let (mut buf, mut inflater) = (BytesMut::new(), Inflater::default());
    let mut frames = Vec::new();
    let cut = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            while let Some(f) = frame::decode(&mut buf, &mut inflater).expect("frame") {
                frames.push(f);
            }
            match client.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    cut.await
        .expect("the SPDY connection ended with the server");
    assert!(
        frames.contains(&Frame::SynReply(3, false, vec![])),
        "{frames:?}"
    );
}
