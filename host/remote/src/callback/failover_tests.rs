//! The callback across a restart or leader change: two servers sharing one runner identity
//! stand for the old and the new leader.

use std::time::Duration;

use super::*;
use crate::callback::{CredentialKind, RunnerEventKind, RunnerKeys, RunnerState, Workload};
use neocloud_runner::CallbackClient;

fn config(keys: &RunnerKeys) -> CallbackConfig {
    CallbackConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        heartbeat_timeout: Duration::from_millis(400),
        keys: keys.clone(),
        adoption_window: Duration::from_secs(60),
        ..CallbackConfig::default()
    }
}

struct Replica {
    server: CallbackServer,
    events: mpsc::Receiver<RunnerEvent>,
    http: reqwest::Client,
}

async fn replica(config: CallbackConfig, tls: &TlsMaterial) -> Replica {
    let (server, events) = CallbackServer::start(config, tls).await.expect("start");
    let cert = reqwest::Certificate::from_pem(tls.cert_pem().as_bytes()).expect("pem");
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(cert)
        .build()
        .expect("client");
    Replica {
        server,
        events,
        http,
    }
}

fn tls() -> TlsMaterial {
    TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert")
}

impl Replica {
    fn url(&self, path: &str) -> String {
        let port = self.server.local_addr().port();
        format!("https://127.0.0.1:{port}/v1/{path}")
    }

    async fn post(&self, path: &str, bearer: Option<&str>, body: serde_json::Value) -> Answer {
        let mut request = self.http.post(self.url(path)).json(&body);
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let retry_after = response.headers().get("retry-after").cloned();
        let text = response.text().await.expect("body");
        Answer {
            status,
            retry_after: retry_after.map(|v| v.to_str().unwrap_or_default().to_owned()),
            text,
        }
    }

    async fn reauth(&self, credential: &str) -> Answer {
        let body = serde_json::json!({ "credential": credential });
        self.post("token/reauth", None, body).await
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    text: String,
}

impl Answer {
    fn session(&self) -> String {
        let value: serde_json::Value = serde_json::from_str(&self.text).expect("json");
        value["sessionToken"].as_str().expect("session").to_owned()
    }
}

fn workload() -> Workload {
    Workload {
        image: "example/train".into(),
        command: vec!["train".into()],
        ..Workload::default()
    }
}

#[tokio::test]
async fn a_session_signed_by_the_old_leader_is_accepted_by_the_new_one() {
    let (keys, tls) = (RunnerKeys::random(), tls());
    let old = replica(config(&keys), &tls).await;
    let token = old
        .server
        .handle()
        .register("uid-a", 1, workload())
        .unwrap();
    let body = serde_json::json!({ "bootstrapToken": token.expose() });
    let session = old.post("token", None, body).await.session();
    old.server.shutdown().await;

    let mut new = replica(config(&keys), &tls).await;
    let handle = new.server.handle();
    assert!(handle.adopt("uid-a", 1, workload(), Some(RunnerState::Running), None));
    assert!(
        !handle.adopt("uid-a", 1, Workload::default(), None, None),
        "adopted once"
    );
    let beat = serde_json::json!({ "state": "Running" });
    let answer = new.post("heartbeat", Some(&session), beat).await;
    assert_eq!(answer.status, 204, "{answer:?}");
    assert!(
        new.events.try_recv().is_err(),
        "the state was known already"
    );
    // The runner retries a report whose answer the old leader never sent: no news either.
    let running = serde_json::json!({ "state": "Running" });
    let answer = new.post("status", Some(&session), running).await;
    assert!(answer.status < 300, "{answer:?}");
    assert!(new.events.try_recv().is_err(), "a repeated report");
    let exited = serde_json::json!({ "state": "Exited", "exitCode": 4 });
    for _ in 0..2 {
        let answer = new.post("status", Some(&session), exited.clone()).await;
        assert!(answer.status < 300, "{answer:?}");
    }
    let event = new.events.recv().await.expect("event");
    let RunnerEventKind::State(report) = event.kind else {
        panic!("expected a state, got {event:?}");
    };
    assert_eq!(
        (report.state, report.exit_code),
        (RunnerState::Exited, Some(4))
    );
    assert!(new.events.try_recv().is_err(), "the exit is told once");

    let stranger = replica(config(&RunnerKeys::random()), &tls).await;
    stranger
        .server
        .handle()
        .adopt("uid-a", 1, workload(), None, None);
    let answer = stranger
        .post("heartbeat", Some(&session), serde_json::json!({}))
        .await;
    assert_eq!(answer.status, 401, "another identity's session: {answer:?}");
}

#[tokio::test]
async fn a_runner_that_booted_after_the_failover_gets_in_with_its_credential() {
    let (keys, tls) = (RunnerKeys::random(), tls());
    let old = replica(config(&keys), &tls).await;
    let token = old
        .server
        .handle()
        .register("uid-a", 1, workload())
        .unwrap();
    let credential = old.server.handle().credential("uid-a", 1).unwrap();
    old.server.shutdown().await;

    let mut new = replica(config(&keys), &tls).await;
    new.server
        .handle()
        .adopt("uid-a", 1, workload(), None, None);
    let client = CallbackClient::new(&new.url("").replace("/v1/", ""), tls.cert_pem().as_bytes())
        .expect("client")
        .with_credential(Some(credential));
    let refused = client.exchange(&token).await.expect_err("unknown here");
    assert!(refused.is_unauthorized(), "{refused}");
    let spiffe = client.reauthenticate().await.expect("reauth");
    assert!(spiffe.ends_with("/binding/uid-a"), "{spiffe}");
    assert_eq!(client.workload().await.expect("workload"), workload());
    client
        .heartbeat(Some(RunnerState::Running))
        .await
        .expect("beat");
    let event = new.events.recv().await.expect("event");
    let RunnerEventKind::State(report) = event.kind else {
        panic!("expected a state, got {event:?}");
    };
    assert_eq!(report.state, RunnerState::Running);
    // A heartbeat never moves a runner back.
    client
        .heartbeat(Some(RunnerState::Starting))
        .await
        .expect("beat");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(new.events.try_recv().is_err());
}

#[tokio::test]
async fn forged_other_bindings_and_rotated_away_credentials_are_refused() {
    let (keys, tls) = (RunnerKeys::random(), tls());
    let node = replica(config(&keys), &tls).await;
    let handle = node.server.handle();
    handle.adopt("uid-a", 1, workload(), None, None);
    handle.adopt("uid-b", 1, workload(), None, None);
    let domain = crate::callback::DEFAULT_TRUST_DOMAIN;
    let until = neocloud_protocol::unix_now() + 600;
    let boot = |keys: &RunnerKeys| {
        keys.credential(domain, "uid-a", 1, CredentialKind::Boot, until)
            .unwrap()
    };
    let real = boot(&keys);
    let rotated = boot(&RunnerKeys::random());
    let other = real.expose().replace(":uid-a:", ":uid-b:");
    let forged = {
        let forger = boot(&RunnerKeys::random());
        let mac = forger.expose().rsplit(':').next().unwrap().to_owned();
        format!("ncr2:{}:uid-a:1:b:{until}:{mac}", keys.key_id())
    };
    for (credential, why) in [
        (rotated.expose().to_owned(), "rotated-away key"),
        (other, "not valid"),
        (forged, "not valid"),
        ("ncr2:garbage".to_owned(), "malformed"),
    ] {
        let answer = node.reauth(&credential).await;
        assert_eq!(answer.status, 401, "{credential}: {answer:?}");
        assert!(answer.text.contains(why), "{answer:?}");
        let mac = credential.rsplit(':').next().unwrap();
        assert!(!answer.text.contains(mac), "echoed: {answer:?}");
    }
    assert_eq!(node.reauth(real.expose()).await.status, 200);
}

#[tokio::test]
async fn a_binding_not_adopted_yet_is_try_again_and_a_forgotten_one_forbidden() {
    let (keys, tls) = (RunnerKeys::random(), tls());
    let node = replica(config(&keys), &tls).await;
    let handle = node.server.handle();
    let credential = handle.credential("uid-a", 1).unwrap();
    let early = node.reauth(credential.expose()).await;
    assert_eq!(early.status, 503, "{early:?}");
    assert_eq!(early.retry_after.as_deref(), Some("2"));
    handle.adopt("uid-a", 1, workload(), None, None);
    assert_eq!(node.reauth(credential.expose()).await.status, 200);
    handle.unregister("uid-a");
    assert_eq!(node.reauth(credential.expose()).await.status, 403);

    let closed = replica(
        CallbackConfig {
            adoption_window: Duration::ZERO,
            ..config(&keys)
        },
        &tls,
    )
    .await;
    assert_eq!(closed.reauth(credential.expose()).await.status, 403);
}

#[tokio::test]
async fn an_adopted_running_runner_that_never_calls_in_is_lost_after_the_heartbeat_timeout() {
    let (keys, tls) = (RunnerKeys::random(), tls());
    let mut node = replica(config(&keys), &tls).await;
    let handle = node.server.handle();
    let adopted = std::time::Instant::now();
    handle.adopt(
        "uid-running",
        1,
        workload(),
        Some(RunnerState::Running),
        None,
    );
    handle.adopt("uid-booting", 1, workload(), None, None);
    let event = tokio::time::timeout(Duration::from_secs(5), node.events.recv())
        .await
        .expect("in time")
        .expect("event");
    assert_eq!(event.uid, "uid-running");
    assert_eq!(event.kind, RunnerEventKind::Lost);
    assert!(adopted.elapsed() >= Duration::from_millis(400));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        node.events.try_recv().is_err(),
        "a booting runner has the boot timeout, the reconciler's"
    );
}

#[tokio::test]
async fn an_open_log_stream_is_cut_with_503_at_shutdown_so_the_runner_sends_it_again() {
    let (keys, tls) = (RunnerKeys::random(), tls());
    let old = replica(config(&keys), &tls).await;
    let handle = old.server.handle();
    let token = handle.register("uid-l", 1, workload()).unwrap();
    let body = serde_json::json!({ "bootstrapToken": token.expose() });
    let session = old.post("token", None, body).await.session();

    // A stream that has sent one record and stays open, as a runner's does between lines.
    let (lines, rx) = mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
    let record = r#"{"ts":"2026-12-04T00:00:00Z","stream":"stdout","line":"one"}"#;
    lines.send(Ok(format!("{record}\n").into())).await.unwrap();
    let request = old
        .http
        .post(old.url("logs"))
        .bearer_auth(&session)
        .body(reqwest::Body::wrap_stream(futures::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|chunk| (chunk, rx)) },
        )))
        .send();
    let request = tokio::spawn(request);
    tokio::time::timeout(Duration::from_secs(10), async {
        while handle.log_lines("uid-l").unwrap_or_default().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the first record arrives");

    tokio::time::timeout(Duration::from_secs(10), old.server.shutdown())
        .await
        .expect("shutdown does not wait for the stream to end");
    let answer = request.await.expect("join");
    if let Ok(response) = answer {
        assert_eq!(response.status().as_u16(), 503);
    }
    drop(lines);
}
