//! The egress route over real HTTPS, with the runner's own client: a named destination is
//! dialled and relayed, an un-named one is refused before anything is dialled, a wrong session
//! is refused, the per-binding cap is enforced and named.

use std::net::SocketAddr;
use std::sync::Mutex;

use neocloud_runner::CallbackClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::callback::{CallbackConfig, CallbackHandle, CallbackServer, TlsMaterial, Workload};

/// Dials 127.0.0.1 at the destination's port, recording every destination it was asked for.
#[derive(Default)]
struct LoopbackDialer(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl EgressDialer for LoopbackDialer {
    async fn dial(&self, target: &EgressTarget) -> Result<SessionIo, String> {
        self.0.lock().unwrap().push(target.to_string());
        let socket = TcpStream::connect(("127.0.0.1", target.port))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Box::new(socket))
    }
}

struct Rig {
    server: CallbackServer,
    handle: CallbackHandle,
    dialer: Arc<LoopbackDialer>,
    _events: tokio::sync::mpsc::Receiver<crate::callback::RunnerEvent>,
}

async fn rig(max: usize) -> Rig {
    let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
    let dialer = Arc::new(LoopbackDialer::default());
    let config = CallbackConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        egress: EgressConfig {
            dialer: Some(dialer.clone()),
            max_connections_per_binding: max,
            ..EgressConfig::default()
        },
        ..CallbackConfig::default()
    };
    let (server, events) = CallbackServer::start(config, &tls).await.expect("start");
    let handle = server.handle();
    Rig {
        server,
        handle,
        dialer,
        _events: events,
    }
}

impl Rig {
    /// Registers `uid` naming `egress` and authenticates its runner.
    async fn runner(&self, uid: &str, egress: Vec<EgressTarget>) -> CallbackClient {
        let workload = Workload {
            egress,
            ..Workload::default()
        };
        let token = self.handle.register(uid, 1, workload).expect("register");
        let url = format!("https://127.0.0.1:{}", self.server.local_addr().port());
        let client = CallbackClient::new(&url, self.server.cert_pem().as_bytes()).expect("client");
        client.exchange(&token).await.expect("exchange");
        client
    }
}

fn target(port: u16) -> EgressTarget {
    EgressTarget {
        service: "echo".into(),
        namespace: "default".into(),
        port,
    }
}

/// An echo server on the loopback; its port.
async fn echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = socket.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// Relays a fresh loopback pair through `io`; the workload's end.
async fn through(io: reqwest::Upgraded) -> TcpStream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (socket, _) = listener.accept().await.unwrap();
    tokio::spawn(neocloud_protocol::relay::relay(socket, io, None));
    app
}

#[tokio::test]
async fn a_named_destination_is_dialled_and_carried_both_ways() {
    let rig = rig(64).await;
    let port = echo().await;
    let runner = rig.runner("uid-1", vec![target(port)]).await;
    let mut app = through(runner.open_egress(0).await.expect("open")).await;
    app.write_all(b"hello").await.unwrap();
    app.shutdown().await.unwrap();
    let mut got = Vec::new();
    app.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"hello");
    assert_eq!(
        *rig.dialer.0.lock().unwrap(),
        [format!("echo.default:{port}")]
    );
}

#[tokio::test]
async fn an_index_the_pod_did_not_name_is_refused_and_nothing_is_dialled() {
    let rig = rig(64).await;
    let runner = rig.runner("uid-1", vec![target(echo().await)]).await;
    for index in [1, 7] {
        let err = runner.open_egress(index).await.expect_err("not named");
        let text = err.to_string();
        assert!(text.contains("404"), "{text}");
        assert!(
            text.contains(&format!(
                "binding uid-1 named no egress destination {index} (it names 1)"
            )),
            "{text}"
        );
    }
    assert!(rig.dialer.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_wrong_session_is_refused() {
    let rig = rig(64).await;
    let port = echo().await;
    let _runner = rig.runner("uid-1", vec![target(port)]).await;
    let url = format!(
        "https://127.0.0.1:{}/v1/egress/0",
        rig.server.local_addr().port()
    );
    let cert = reqwest::Certificate::from_pem(rig.server.cert_pem().as_bytes()).unwrap();
    let http = reqwest::Client::builder()
        .add_root_certificate(cert)
        .build()
        .unwrap();
    let response = http
        .get(url)
        .bearer_auth("not-a-session")
        .header("connection", "upgrade")
        .header("upgrade", neocloud_protocol::session::SESSION_UPGRADE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::UNAUTHORIZED);
    assert!(rig.dialer.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn connections_past_the_per_binding_cap_are_refused_naming_the_limit() {
    let rig = rig(2).await;
    let runner = rig.runner("uid-1", vec![target(echo().await)]).await;
    let first = runner.open_egress(0).await.expect("first");
    let _second = runner.open_egress(0).await.expect("second");
    let err = runner.open_egress(0).await.expect_err("third").to_string();
    assert!(err.contains("429"), "{err}");
    assert!(
        err.contains("binding uid-1 already has 2 egress connections open (the limit runner.egress.maxConnectionsPerBinding)"),
        "{err}"
    );
    drop(first);
    // The closed connection frees its place.
    let again = async {
        loop {
            if runner.open_egress(0).await.is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), again)
        .await
        .expect("a place is freed");
}

#[tokio::test]
async fn an_unreachable_destination_is_an_error_frame_naming_it() {
    use futures::StreamExt;
    let rig = rig(64).await;
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let runner = rig.runner("uid-1", vec![target(closed)]).await;
    let io = runner.open_egress(0).await.expect("upgraded");
    let frame = neocloud_protocol::session::frame_reader(io).next().await;
    match frame {
        Some(Ok(neocloud_protocol::session::Frame::Error(message))) => assert!(
            message.starts_with(&format!(
                "failed to connect to echo.default:{closed} from the cluster: "
            )),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_connection_outlives_the_runners_request_timeout() {
    let rig = rig(64).await;
    let port = echo().await;
    let runner = rig.runner("uid-1", vec![target(port)]).await;
    let runner = runner.with_request_timeout(std::time::Duration::from_millis(300));
    let mut app = through(runner.open_egress(0).await.expect("open")).await;
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    app.write_all(b"still here").await.unwrap();
    app.shutdown().await.unwrap();
    let mut got = Vec::new();
    app.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"still here");
}
