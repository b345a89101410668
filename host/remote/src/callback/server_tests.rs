use std::time::Duration;

use futures::StreamExt;

use super::*;
use crate::callback::{
    EnvVar, LogOptions, LogRecord, LogStream, RateLimit, RunnerEventKind, RunnerState, Secret,
    StatusReport, Workload,
};
use neocloud_runner::CallbackClient;

const SECRET_ENV: &str = "sk-live-very-secret-value";

fn config() -> CallbackConfig {
    CallbackConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        heartbeat_timeout: Duration::from_millis(400),
        ..CallbackConfig::default()
    }
}

async fn start(config: CallbackConfig) -> (CallbackServer, mpsc::Receiver<RunnerEvent>) {
    let tls = TlsMaterial::self_signed(&["127.0.0.1".into(), "localhost".into()]).expect("cert");
    CallbackServer::start(config, &tls).await.expect("start")
}

fn url(server: &CallbackServer) -> String {
    format!("https://127.0.0.1:{}", server.local_addr().port())
}

fn client(server: &CallbackServer) -> CallbackClient {
    CallbackClient::new(&url(server), server.cert_pem().as_bytes()).expect("client")
}

fn raw(server: &CallbackServer) -> reqwest::Client {
    let cert = reqwest::Certificate::from_pem(server.cert_pem().as_bytes()).expect("pem");
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(cert)
        .build()
        .expect("client")
}

fn workload(name: &str) -> Workload {
    Workload {
        image: format!("example/{name}"),
        command: vec!["run".into()],
        env: vec![EnvVar::new("API_KEY", SECRET_ENV)],
        ..Workload::default()
    }
}

#[tokio::test]
async fn a_session_reaches_only_its_own_binding() {
    let (server, mut events) = start(config()).await;
    let handle = server.handle();
    let token_a = handle.register("uid-a", 1, workload("a")).expect("a");
    handle.register("uid-b", 1, workload("b")).expect("b");
    let a = client(&server);
    let spiffe = a.exchange(&token_a).await.expect("exchange");
    assert_eq!(spiffe, "spiffe://neocloud.local/neocloud/binding/uid-a");
    let got = a.workload().await.expect("workload");
    assert_eq!(got, workload("a"));
    let report = StatusReport {
        exit_code: None,
        ..StatusReport::new(RunnerState::Running)
    };
    a.status(&report).await.expect("status");
    let event = events.recv().await.expect("event");
    assert_eq!(event.uid, "uid-a");
    assert_eq!(event.kind, RunnerEventKind::State(report));
}

#[tokio::test]
async fn a_session_of_an_unregistered_binding_is_refused() {
    let (server, _events) = start(config()).await;
    let handle = server.handle();
    let token = handle.register("uid-a", 1, workload("a")).expect("a");
    let a = client(&server);
    a.exchange(&token).await.expect("exchange");
    handle.unregister("uid-a");
    let err = a.workload().await.expect_err("unregistered");
    assert!(err.is_forbidden(), "{err}");
}

#[tokio::test]
async fn requests_without_a_valid_session_are_refused() {
    let (server, _events) = start(config()).await;
    let http = raw(&server);
    for auth in [None, Some("Bearer nope"), Some("Basic abc")] {
        let mut request = http.get(format!("{}/v1/workload", url(&server)));
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = request.send().await.expect("send");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
    }
}

#[tokio::test]
async fn token_exchange_is_rate_limited_per_client_ip() {
    let mut config = config();
    config.token_rate_per_ip = RateLimit {
        burst: 2,
        per_second: 0.01,
    };
    let (server, _events) = start(config).await;
    let http = raw(&server);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let response = http
            .post(format!("{}/v1/token", url(&server)))
            .json(&serde_json::json!({ "bootstrapToken": "wrong" }))
            .send()
            .await
            .expect("send");
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::UNAUTHORIZED,
            StatusCode::UNAUTHORIZED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn requests_are_rate_limited_per_binding() {
    let mut config = config();
    config.request_rate_per_binding = RateLimit {
        burst: 2,
        per_second: 0.01,
    };
    let (server, _events) = start(config).await;
    let a = client(&server);
    let token = server
        .handle()
        .register("uid-a", 1, workload("a"))
        .expect("a");
    a.exchange(&token).await.expect("exchange");
    a.heartbeat(None).await.expect("1");
    a.heartbeat(None).await.expect("2");
    let err = a.heartbeat(None).await.expect_err("3");
    assert!(err.to_string().contains("429"), "{err}");
}

#[tokio::test]
async fn silent_runner_is_reported_lost_once_and_only_after_authenticating() {
    let (server, mut events) = start(config()).await;
    let handle = server.handle();
    let token = handle.register("uid-a", 1, workload("a")).expect("a");
    handle
        .register("never-started", 1, workload("b"))
        .expect("b");
    client(&server).exchange(&token).await.expect("exchange");
    let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("lost in time")
        .expect("event");
    assert_eq!(event.uid, "uid-a");
    assert_eq!(event.kind, RunnerEventKind::Lost);
    let more = tokio::time::timeout(Duration::from_millis(800), events.recv()).await;
    assert!(more.is_err(), "a second event: {more:?}");
}

#[tokio::test]
async fn heartbeats_keep_a_runner_alive() {
    let (server, mut events) = start(config()).await;
    let token = server
        .handle()
        .register("uid-a", 1, workload("a"))
        .expect("a");
    let a = client(&server);
    a.exchange(&token).await.expect("exchange");
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.heartbeat(None).await.expect("heartbeat");
    }
    assert!(events.try_recv().is_err());
}

#[tokio::test]
async fn logs_are_appended_from_ndjson_and_bad_records_refused() {
    let (server, _events) = start(config()).await;
    let handle = server.handle();
    let token = handle.register("uid-a", 1, workload("a")).expect("a");
    let a = client(&server);
    a.exchange(&token).await.expect("exchange");
    let body = "{\"ts\":\"2026-01-01T00:00:00.000000001Z\",\"stream\":\"stdout\",\"line\":\"one\"}\n\
                {\"ts\":\"2026-01-01T00:00:01Z\",\"stream\":\"stderr\",\"line\":\"two\"}\n";
    let stream = futures::stream::iter([Ok(Bytes::from(body))]);
    a.logs(stream).await.expect("logs");
    let lines = handle.log_lines("uid-a").expect("lines");
    let got: Vec<(LogStream, &str)> = lines.iter().map(|l| (l.stream, l.line.as_str())).collect();
    assert_eq!(
        got,
        [(LogStream::Stdout, "one"), (LogStream::Stderr, "two")]
    );
    let read: Vec<Bytes> = handle
        .read_logs("uid-a", LogOptions::default())
        .expect("read")
        .collect()
        .await;
    assert_eq!(read.concat(), b"one\ntwo\n");
    let bad = futures::stream::iter([Ok(Bytes::from("not json\n"))]);
    let err = a.logs(bad).await.expect_err("bad record");
    assert!(err.to_string().contains("400"), "{err}");
}

#[tokio::test]
async fn a_restart_in_place_keeps_the_last_run_s_log_as_the_previous_one() {
    let (server, mut events) = start(config()).await;
    let handle = server.handle();
    let tcp = neocloud_protocol::ProbeAction::TcpSocket {
        host: String::new(),
        port: 8000,
    };
    let always = Workload {
        restart_policy: Some(neocloud_protocol::RestartPolicy::Always),
        probes: Some(neocloud_protocol::Probes {
            readiness: Some(neocloud_protocol::Probe::new(tcp)),
            ..Default::default()
        }),
        ..workload("a")
    };
    let token = handle.register("uid-a", 1, always.clone()).expect("a");
    let a = client(&server);
    a.exchange(&token).await.expect("exchange");
    // A runner that restarts in place and runs probes is given the policy and the probes; one
    // that does not ask is given neither.
    assert_eq!(a.workload().await.expect("workload"), always);
    let token_b = handle.register("uid-b", 1, always.clone()).expect("b");
    let http = raw(&server);
    let body = serde_json::json!({ "bootstrapToken": token_b.expose() });
    let sent = http.post(format!("{}/v1/token", url(&server))).json(&body);
    let session: TokenResponse = sent.send().await.expect("send").json().await.expect("json");
    let old = http
        .get(format!("{}/v1/workload", url(&server)))
        .bearer_auth(&session.session_token)
        .send()
        .await
        .expect("get");
    let old: serde_json::Value = old.json().await.expect("json");
    assert!(old.get("restartPolicy").is_none(), "{old}");
    assert!(old.get("probes").is_none(), "{old}");

    let line = |run: u32, text: &str| {
        let record = LogRecord {
            ts: chrono::Utc::now(),
            stream: LogStream::Stdout,
            line: text.into(),
            run,
        };
        Ok::<_, std::io::Error>(Bytes::from(serde_json::to_string(&record).unwrap() + "\n"))
    };
    let read = |previous: bool| {
        let options = LogOptions {
            previous,
            ..LogOptions::default()
        };
        let handle = handle.clone();
        async move {
            match handle.read_logs("uid-a", options) {
                Ok(stream) => Some(stream.collect::<Vec<Bytes>>().await.concat()),
                Err(e) => {
                    assert!(matches!(e, CallbackError::NoPreviousRun(_)), "{e}");
                    None
                }
            }
        }
    };
    a.status(&StatusReport::new(RunnerState::Running))
        .await
        .expect("running");
    a.logs(futures::stream::iter([line(0, "first")]))
        .await
        .expect("logs");
    assert_eq!(read(true).await, None, "no previous run yet");
    let ended = neocloud_protocol::Termination::new(3, chrono::Utc::now(), chrono::Utc::now());
    let backoff = StatusReport {
        exit_code: Some(3),
        last_termination: Some(ended),
        backoff_seconds: Some(10),
        ..StatusReport::new(RunnerState::BackOff)
    };
    a.status(&backoff).await.expect("back-off");
    assert_eq!(read(true).await.as_deref(), Some(&b"first\n"[..]));
    let restarted = StatusReport {
        restart_count: 1,
        ..StatusReport::new(RunnerState::Running)
    };
    a.status(&restarted).await.expect("restarted");
    a.logs(futures::stream::iter([line(1, "second")]))
        .await
        .expect("logs");
    assert_eq!(read(true).await.as_deref(), Some(&b"first\n"[..]));
    assert_eq!(read(false).await.as_deref(), Some(&b"second\n"[..]));
    // Each report reached the node, the restart too (not taken for a repeat of `Running`).
    let mut states = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let RunnerEventKind::State(report) = event.kind {
            states.push((report.state, report.restart_count));
        }
    }
    assert_eq!(
        states,
        [
            (RunnerState::Running, 0),
            (RunnerState::BackOff, 0),
            (RunnerState::Running, 1)
        ]
    );
}

#[tokio::test]
async fn session_can_be_refreshed() {
    let (server, _events) = start(config()).await;
    let token = server
        .handle()
        .register("uid-a", 1, workload("a"))
        .expect("a");
    let http = raw(&server);
    let session: TokenResponse = http
        .post(format!("{}/v1/token", url(&server)))
        .json(&serde_json::json!({ "bootstrapToken": token.expose() }))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let refreshed: TokenResponse = http
        .post(format!("{}/v1/token/refresh", url(&server)))
        .bearer_auth(&session.session_token)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_ne!(refreshed.session_token, session.session_token);
    assert_eq!(refreshed.spiffe_id, session.spiffe_id);
}

#[derive(Clone, Default)]
struct Capture(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every event of this test binary at TRACE, from every thread, captured by the one global
/// subscriber. A subscriber set for this test's thread alone lost events now and then (about one
/// run in four of the crate's tests): callsite interest is global, and the callsites this test
/// checks are hit by other tests' threads at the same time.
fn global_capture() -> Capture {
    static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            let capture = Capture::default();
            let writer = capture.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other test of this binary sets a global subscriber");
            capture
        })
        .clone()
}

#[test]
fn no_secret_appears_in_traces_errors_or_debug() {
    let capture = global_capture();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let secrets = runtime.block_on(exercise_every_path());
    let traced = String::from_utf8_lossy(&capture.0.lock()).into_owned();
    assert!(traced.contains("runner authenticated"), "{traced}");
    for secret in secrets {
        assert!(!traced.contains(&secret), "secret in traces: {traced}");
    }
}

/// Runs success and refusal paths, checks errors and Debug output, returns the secrets seen:
/// the bootstrap token, an env value, the session JWTs and the `ncr1` credential.
async fn exercise_every_path() -> Vec<String> {
    let (server, _events) = start(config()).await;
    let handle = server.handle();
    let token = handle.register("uid-a", 1, workload("a")).expect("a");
    let credential = handle.credential("uid-a", 1).expect("credential");
    let a = client(&server).with_credential(Some(credential.clone()));
    a.exchange(&token).await.expect("exchange");
    let fetched = a.workload().await.expect("workload");
    a.reauthenticate().await.expect("reauthenticate");
    let replay = client(&server).exchange(&token).await.expect_err("replay");
    let wrong = client(&server)
        .exchange(&Secret::new(format!("{}x", token.expose())))
        .await
        .expect_err("wrong");
    let forged = Secret::new(format!("{}x", credential.expose()));
    let forged = (client(&server).with_credential(Some(forged)))
        .reauthenticate()
        .await
        .expect_err("forged credential");
    let (session, refreshed) = raw_sessions(&server, &handle).await;
    let shown = format!(
        "{replay} {replay:?} {wrong} {wrong:?} {forged} {forged:?} {fetched:?} {token:?} \
         {credential:?} {a:?} {session:?} {refreshed:?}"
    );
    let session = session.session_token;
    let refreshed = refreshed.session_token;
    assert!(credential.expose().starts_with("ncr2:"), "a credential");
    assert_eq!(session.split('.').count(), 3, "a JWT");
    let secrets = [
        token.expose(),
        SECRET_ENV,
        credential.expose(),
        &session,
        &refreshed,
    ];
    for secret in secrets {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    let state = format!("{:?}", handle.0);
    for secret in secrets {
        assert!(!state.contains(secret), "{secret} in {state}");
    }
    secrets.map(str::to_owned).to_vec()
}

/// A session of binding `uid-b` exchanged, used and refreshed over plain HTTPS, as answered.
async fn raw_sessions(
    server: &CallbackServer,
    handle: &CallbackHandle,
) -> (TokenResponse, TokenResponse) {
    let token = handle.register("uid-b", 1, workload("b")).expect("b");
    let http = raw(server);
    let base = url(server);
    let answer = |response: reqwest::Response| async move {
        let response = response.error_for_status().expect("answered");
        response.json::<TokenResponse>().await.expect("json")
    };
    let body = serde_json::json!({ "bootstrapToken": token.expose() });
    let sent = http
        .post(format!("{base}/v1/token"))
        .json(&body)
        .send()
        .await;
    let session = answer(sent.expect("send")).await;
    let bearer = |request: reqwest::RequestBuilder| request.bearer_auth(&session.session_token);
    let fetched = bearer(http.get(format!("{base}/v1/workload"))).send().await;
    assert!(fetched.expect("send").status().is_success());
    let sent = bearer(http.post(format!("{base}/v1/token/refresh")))
        .send()
        .await;
    let refreshed = answer(sent.expect("send")).await;
    (session, refreshed)
}

#[tokio::test]
async fn serve_says_which_of_the_server_s_tasks_ended_and_dropping_it_stops_the_server() {
    let (server, _events) = start(config()).await;
    let runner = client(&server);
    let token = server.handle().register("uid-a", 1, workload("a")).unwrap();
    runner.exchange(&token).await.expect("serving");
    server.accepting.abort();
    let stopped = tokio::time::timeout(Duration::from_secs(5), server.serve())
        .await
        .expect("serve returns once a task ended");
    assert_eq!(
        stopped.to_string(),
        "the callback server's TLS accept loop was cancelled"
    );

    let (server, _events) = start(config()).await;
    let address = server.local_addr();
    let serving = tokio::spawn(server.serve());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!serving.is_finished(), "serve runs while the server works");
    serving.abort();
    let _ = serving.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        tokio::net::TcpStream::connect(address).await.is_err(),
        "the listener is closed once serve is dropped"
    );
}
