//! The relay process against the kubelet API over real TLS, with a Pod whose port-forward
//! sessions echo in upper case: bytes both ways with their ends, and every refusal.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use neocloud_remote::callback::{LogOptions, SessionIo};
use neocloud_remote::tls::{TlsMaterial, test_connect};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{self, RelayConfig};
use super::{RELAY_UPGRADE, RelayGrant, RelayTable};
use crate::{
    AccessReview, Decision, KubeletConfig, KubeletServer, LogError, PodRef, ReviewError, UserInfo,
    Workloads,
};
use neocloud_protocol::session::{Frame, SessionRequest, split_frames};

/// Nobody: the relay route must not need the cluster's authentication.
struct Nobody;

#[async_trait]
impl AccessReview for Nobody {
    async fn review_token(&self, _: &str) -> Result<Option<UserInfo>, ReviewError> {
        Ok(None)
    }

    async fn review_access(
        &self,
        _: &UserInfo,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Decision, ReviewError> {
        Ok(Decision {
            allowed: false,
            reason: String::new(),
        })
    }
}

/// A Pod whose forwarded connections echo what they get in upper case, then end when the
/// caller's side ends; records the ports asked for.
#[derive(Default)]
struct Shouting(Mutex<Vec<u16>>);

#[async_trait]
impl Workloads for Shouting {
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
        request: SessionRequest,
    ) -> Result<SessionIo, LogError> {
        let SessionRequest::PortForward { port } = request else {
            panic!("only port-forwards: {request:?}");
        };
        self.0.lock().push(port);
        let (ours, runner) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let (mut from_node, mut to_node) = split_frames(runner);
            while let Some(Ok(frame)) = from_node.next().await {
                match frame {
                    Frame::Data(bytes) => {
                        let loud = bytes.to_ascii_uppercase();
                        to_node.send(Frame::Data(loud)).await.unwrap();
                    }
                    Frame::DataEnd => {
                        to_node.send(Frame::DataEnd).await.unwrap();
                        break;
                    }
                    _ => {}
                }
            }
        });
        Ok(Box::new(ours))
    }
}

struct Rig {
    server: KubeletServer,
    tls: TlsMaterial,
    source: Arc<Shouting>,
    dir: tempfile::TempDir,
}

const UID: &str = "0d7c5c1e-uid";

async fn rig() -> Rig {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
    let table = Arc::new(RelayTable::default());
    let pod = PodRef {
        namespace: "ml".into(),
        name: "vllm-0".into(),
    };
    let ports = [free_port()].into_iter().collect();
    table.set(UID, "s3cret", RelayGrant { pod, ports });
    let mut config = KubeletConfig::new("node");
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.relays = Some(table);
    let source = Arc::new(Shouting::default());
    let server = KubeletServer::start(config, &tls, Arc::new(Nobody), source.clone())
        .await
        .expect("server");
    let dir = tempfile::tempdir().unwrap();
    let node = server.local_addr().to_string();
    client::write_secret_dir(dir.path(), "s3cret", &node, tls.cert_pem()).unwrap();
    Rig {
        server,
        tls,
        source,
        dir,
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the relay of [`UID`] on a free port; returns the port.
async fn relay(rig: &Rig) -> u16 {
    let port = free_port();
    let mut config = RelayConfig::new(UID, vec![port], rig.dir.path());
    config.listen = "127.0.0.1".parse().unwrap();
    config.connect_timeout = Duration::from_secs(5);
    tokio::spawn(client::run(config));
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            // That probe connection was carried too (and ended at once).
            return port;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the relay never listened on {port}");
}

/// Sends `bytes` through the relay on `port`, closes for writing, and reads to the end.
async fn exchange(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(bytes).await.unwrap();
    conn.shutdown().await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut got))
        .await
        .expect("the relay ends the connection");
    // A connection the relay cannot carry is closed unread, which resets it.
    match read {
        Ok(_) => got,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => got,
        Err(e) => panic!("reading from the relay: {e}"),
    }
}

/// The granted port of the rig's table, which the relay also listens on in these tests.
fn granted(rig: &Rig, port: u16) -> RelayConfig {
    let mut config = RelayConfig::new(UID, vec![port], rig.dir.path());
    config.listen = "127.0.0.1".parse().unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_connection_carries_bytes_both_ways_to_the_declared_port_and_ends() {
    let rig = rig().await;
    let port = relay(&rig).await;
    // The relay listens on `port` but the table grants another: refused, nothing opened.
    assert_eq!(exchange(port, b"hi").await, b"");
    assert!(rig.source.0.lock().is_empty());
    // A relay on the granted port.
    let (table_port, listening) = {
        let granted_port = granted_port(&rig).await;
        (granted_port, granted(&rig, granted_port))
    };
    tokio::spawn(client::run(listening));
    wait_listening(table_port).await;
    let big = vec![b'a'; 300_000];
    let got = exchange(table_port, &big).await;
    assert_eq!(got.len(), big.len());
    assert!(got.iter().all(|&b| b == b'A'));
    assert!(rig.source.0.lock().iter().all(|&p| p == table_port));
    assert!(!rig.source.0.lock().is_empty());
    drop(rig.server);
}

async fn granted_port(rig: &Rig) -> u16 {
    // The table's one port: ask the route with the right token for each candidate is overkill;
    // the rig granted exactly one, which a wrong-port request names.
    let (status, body) = raw(rig, &format!("/relay/{UID}/1"), "s3cret", true).await;
    assert_eq!(status, 403, "{body}");
    let ports = body.rsplit("its ports: ").next().unwrap();
    ports.trim_end_matches(')').parse().unwrap()
}

async fn wait_listening(port: u16) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the relay never listened on {port}");
}

/// A request to the kubelet API by hand: its status and body.
async fn raw(rig: &Rig, path: &str, token: &str, upgrade: bool) -> (u16, String) {
    let mut tls = test_connect(rig.server.local_addr(), rig.tls.cert_pem())
        .await
        .unwrap();
    let upgrade = if upgrade {
        format!("connection: Upgrade\r\nupgrade: {RELAY_UPGRADE}\r\n")
    } else {
        String::new()
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: node\r\nauthorization: Bearer {token}\r\n{upgrade}\
         content-length: 0\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tls.read_u8().await.unwrap());
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .map_or(0, |l| l.trim().parse().unwrap());
    let mut body = vec![0; length];
    tls.read_exact(&mut body).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_route_refuses_wrong_tokens_other_ports_bad_ports_and_plain_requests() {
    let rig = rig().await;
    let port = granted_port(&rig).await;
    let path = format!("/relay/{UID}/{port}");
    let (status, body) = raw(&rig, &path, "guess", true).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body,
        format!("the relay token is not valid for pod uid {UID}")
    );
    let (status, body) = raw(&rig, &format!("/relay/other-uid/{port}"), "s3cret", true).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = raw(&rig, &format!("/relay/{UID}/22"), "s3cret", true).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.starts_with("port 22 is not a TCP containerPort of pod ml/vllm-0"),
        "{body}"
    );
    let (status, body) = raw(&rig, &format!("/relay/{UID}/http"), "s3cret", true).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"http\""), "{body}");
    let (status, body) = raw(&rig, &path, "s3cret", false).await;
    assert_eq!(status, 426, "{body}");
    assert!(rig.source.0.lock().is_empty(), "nothing was opened");
    // The right token, port and upgrade: 101.
    let (status, _) = raw(&rig, &path, "s3cret", true).await;
    assert_eq!(status, 101);
    assert_eq!(*rig.source.0.lock(), vec![port]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_talks_only_to_the_pinned_certificate() {
    let rig = rig().await;
    let port = granted_port(&rig).await;
    // Another certificate for the same address: the handshake fails, nothing is opened.
    let other = TlsMaterial::self_signed(&["127.0.0.1".into()]).unwrap();
    let node = rig.server.local_addr().to_string();
    client::write_secret_dir(rig.dir.path(), "s3cret", &node, other.cert_pem()).unwrap();
    tokio::spawn(client::run(granted(&rig, port)));
    wait_listening(port).await;
    assert_eq!(exchange(port, b"hi").await, b"");
    assert!(rig.source.0.lock().is_empty());
    // The files are read for each connection: the right certificate works at once.
    client::write_secret_dir(rig.dir.path(), "s3cret", &node, rig.tls.cert_pem()).unwrap();
    assert_eq!(exchange(port, b"hi").await, b"HI");
}

#[tokio::test]
async fn a_relay_refuses_to_start_without_ports_or_on_a_taken_port() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut config = RelayConfig::new(UID, vec![port], "/nonexistent");
    config.listen = "127.0.0.1".parse().unwrap();
    let err = client::run(config).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("failed to listen on port {port}")),
        "{err}"
    );
    let err = client::run(RelayConfig::new(UID, vec![], "/x"))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "ports: 0 given; a relay carries 1 to 64");
}
