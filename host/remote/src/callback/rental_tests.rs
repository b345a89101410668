//! Rentals over real HTTPS: the runner of a rental that was replaced (a partitioned machine that
//! comes back) holds a valid session and credentials, and is refused on every route without
//! changing anything of its successor; boot credentials expire and are spent, renewal
//! credentials let the current runner back in.

use std::time::Duration;

use neocloud_protocol::session::SessionRequest;

use super::*;
use crate::callback::{
    CredentialKind, DEFAULT_TRUST_DOMAIN, RunnerEventKind, RunnerKeys, RunnerState, Workload,
};

fn config(keys: &RunnerKeys) -> CallbackConfig {
    CallbackConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        keys: keys.clone(),
        session_open_timeout: Duration::from_secs(3),
        ..CallbackConfig::default()
    }
}

struct Rig {
    server: CallbackServer,
    events: mpsc::Receiver<RunnerEvent>,
    http: reqwest::Client,
}

async fn rig(keys: &RunnerKeys) -> Rig {
    rig_with(config(keys)).await
}

async fn rig_with(config: CallbackConfig) -> Rig {
    let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
    let (server, events) = CallbackServer::start(config, &tls).await.expect("start");
    let cert = reqwest::Certificate::from_pem(tls.cert_pem().as_bytes()).expect("pem");
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(cert)
        .build()
        .expect("client");
    Rig {
        server,
        events,
        http,
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    body: serde_json::Value,
}

impl Answer {
    fn code(&self) -> Option<&str> {
        self.body["code"].as_str()
    }
}

/// What a runner of one rental holds: its session and both credentials.
struct Held {
    session: String,
    renewal: String,
    boot: String,
}

impl Rig {
    fn url(&self, path: &str) -> String {
        let port = self.server.local_addr().port();
        format!("https://127.0.0.1:{port}/v1/{path}")
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        Answer { status, body }
    }

    async fn post(&self, path: &str, bearer: &str, body: String) -> Answer {
        let request = self
            .http
            .post(self.url(path))
            .bearer_auth(bearer)
            .body(body);
        self.send(request).await
    }

    async fn get(&self, path: &str, bearer: &str) -> Answer {
        self.send(self.http.get(self.url(path)).bearer_auth(bearer))
            .await
    }

    async fn reauth(&self, credential: &str) -> Answer {
        let body = serde_json::json!({ "credential": credential });
        self.send(self.http.post(self.url("token/reauth")).json(&body))
            .await
    }

    /// Exchanges a bootstrap token for a session.
    async fn exchange(&self, token: &str) -> Answer {
        let body = serde_json::json!({ "bootstrapToken": token });
        self.send(self.http.post(self.url("token")).json(&body))
            .await
    }

    /// Registers rental `rental` of `uid` and authenticates its runner, which fetches its
    /// workload (it has called in).
    async fn rent(&self, uid: &str, rental: u64) -> Held {
        let handle = self.server.handle();
        let token = handle.register(uid, rental, workload()).expect("register");
        let boot = handle.credential(uid, rental).expect("credential");
        let body = serde_json::json!({ "bootstrapToken": token.expose() });
        let answer = self
            .send(self.http.post(self.url("token")).json(&body))
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        let session = answer.body["sessionToken"].as_str().unwrap().to_owned();
        let renewal = answer.body["credential"].as_str().unwrap().to_owned();
        assert!(renewal.starts_with("ncr2:"), "{renewal}");
        assert_eq!(self.get("workload", &session).await.status, 200);
        Held {
            session,
            renewal,
            boot: boot.expose().to_owned(),
        }
    }
}

fn workload() -> Workload {
    Workload {
        image: "example/train".into(),
        command: vec!["train".into()],
        ..Workload::default()
    }
}

fn assert_not_current(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 403, "{what}: {answer:?}");
    assert_eq!(
        answer.code(),
        Some("RentalNotCurrent"),
        "{what}: {answer:?}"
    );
    let message = answer.body["error"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("rental no longer current: rental 1 of binding uid-a"),
        "{what}: {message}"
    );
}

#[tokio::test]
async fn the_runner_of_a_replaced_rental_is_refused_everywhere_and_changes_nothing() {
    let keys = RunnerKeys::random();
    let mut rig = rig(&keys).await;
    let handle = rig.server.handle();
    let old = rig.rent("uid-a", 1).await;
    // The machine is cut off; the node replaces it with rental 2, whose runner runs.
    let new = rig.rent("uid-a", 2).await;
    let running = r#"{"state":"Running"}"#.to_owned();
    assert_eq!(rig.post("status", &new.session, running).await.status, 204);
    let event = rig.events.recv().await.expect("event");
    assert_eq!((event.uid.as_str(), event.rental), ("uid-a", 2));
    let line = r#"{"ts":"2026-12-04T00:00:00Z","stream":"stdout","line":"new"}"#;
    let logged = rig.post("logs", &new.session, line.to_owned()).await;
    assert_eq!(logged.status, 200, "{logged:?}");
    // Someone asks for `kubectl exec` on the Pod: the offer is the new rental's.
    let opener = handle.clone();
    let exec = SessionRequest::Exec {
        command: vec!["sh".into()],
        tty: false,
        stdin: false,
    };
    let opening = tokio::spawn(async move { opener.open_session("uid-a", exec).await });

    // The old machine comes back with its valid session and credentials.
    let exited = r#"{"state":"Exited","exitCode":0}"#.to_owned();
    assert_not_current(&rig.post("status", &old.session, exited).await, "status");
    let record = r#"{"ts":"2026-12-04T00:00:01Z","stream":"stdout","line":"old"}"#;
    let logs = rig.post("logs", &old.session, record.to_owned()).await;
    assert_not_current(&logs, "logs");
    assert_not_current(&rig.get("sessions", &old.session).await, "sessions");
    let beat = r#"{"state":"Exited"}"#.to_owned();
    assert_not_current(
        &rig.post("heartbeat", &old.session, beat).await,
        "heartbeat",
    );
    let stats = r#"{"time":"2026-12-04T00:00:01Z"}"#.to_owned();
    assert_not_current(&rig.post("stats", &old.session, stats).await, "stats");
    assert_not_current(&rig.get("workload", &old.session).await, "workload");
    let refresh = rig.post("token/refresh", &old.session, String::new()).await;
    assert_not_current(&refresh, "refresh");
    assert_not_current(&rig.reauth(&old.renewal).await, "renewal credential");
    assert_not_current(&rig.reauth(&old.boot).await, "boot credential");

    // The new rental is untouched: no event, its log as it was, no usage, and its runner
    // still gets the exec offer nobody else took.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(rig.events.try_recv().is_err(), "no event of the old rental");
    let lines: Vec<String> = handle
        .log_lines("uid-a")
        .unwrap()
        .into_iter()
        .map(|l| l.line)
        .collect();
    assert_eq!(lines, ["new"]);
    assert_eq!(handle.stats("uid-a"), None);
    let offer = rig.get("sessions", &new.session).await;
    assert_eq!(
        offer.status, 200,
        "the offer waits for the new runner: {offer:?}"
    );
    assert_eq!(offer.body["request"]["kind"], "exec");
    opening.abort();
    let beat = r#"{"state":"Running"}"#.to_owned();
    assert_eq!(rig.post("heartbeat", &new.session, beat).await.status, 204);
}

#[tokio::test]
async fn a_boot_credential_is_refused_once_expired_or_spent_and_an_ncr1_one_always() {
    let keys = RunnerKeys::random();
    let rig = rig(&keys).await;
    let handle = rig.server.handle();
    handle.register("uid-b", 1, workload()).expect("register");
    let domain = DEFAULT_TRUST_DOMAIN;
    let now = neocloud_protocol::unix_now();
    let expired = keys
        .credential(domain, "uid-b", 1, CredentialKind::Boot, now - 60)
        .unwrap();
    let answer = rig.reauth(expired.expose()).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(
        answer.body["error"].as_str().unwrap().contains("expired"),
        "{answer:?}"
    );
    let ncr1 = format!("ncr1:{}:uid-b:bWFj", keys.key_id());
    let answer = rig.reauth(&ncr1).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(
        answer.body["error"].as_str().unwrap().contains("ncr1"),
        "{answer:?}"
    );

    // Until the runner calls in, its boot credential gets it in (a lost answer can be asked
    // again); once it has, the credential read from user_data is spent.
    let boot = handle.credential("uid-b", 1).unwrap();
    for _ in 0..2 {
        assert_eq!(rig.reauth(boot.expose()).await.status, 200);
    }
    let answer = rig.reauth(boot.expose()).await;
    let session = answer.body["sessionToken"].as_str().unwrap().to_owned();
    let renewal = answer.body["credential"].as_str().unwrap().to_owned();
    assert_eq!(rig.get("workload", &session).await.status, 200);
    let spent = rig.reauth(boot.expose()).await;
    assert_eq!(spent.status, 401, "{spent:?}");
    assert!(
        spent.body["error"].as_str().unwrap().contains("spent"),
        "{spent:?}"
    );
    // The runner itself renews with what it was handed, as often as it needs.
    for _ in 0..2 {
        assert_eq!(rig.reauth(&renewal).await.status, 200);
    }
}

#[tokio::test]
async fn after_a_failover_the_running_runner_renews_but_user_data_is_spent() {
    let keys = RunnerKeys::random();
    let old = rig(&keys).await;
    let held = old.rent("uid-c", 4).await;
    old.server.shutdown().await;

    let new = rig(&keys).await;
    let handle = new.server.handle();
    // The Pod shows the runner ran: its boot credential was used.
    assert!(handle.adopt("uid-c", 4, workload(), Some(RunnerState::Running), None));
    let spent = new.reauth(&held.boot).await;
    assert_eq!(spent.status, 401, "{spent:?}");
    let renewed = new.reauth(&held.renewal).await;
    assert_eq!(renewed.status, 200, "{renewed:?}");
    let beat = r#"{"state":"Running"}"#.to_owned();
    assert_eq!(new.post("heartbeat", &held.session, beat).await.status, 204);
    // A node whose binding has moved on to rental 5 refuses rental 4's runner.
    let stale = rig(&keys).await;
    stale
        .server
        .handle()
        .adopt("uid-c", 5, workload(), Some(RunnerState::Running), None);
    let answer = stale.reauth(&held.renewal).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(answer.code(), Some("RentalNotCurrent"));
}

#[tokio::test]
async fn new_files_reach_the_current_rental_s_workload_and_never_another_rental_s() {
    let rig = rig(&RunnerKeys::random()).await;
    let held = rig.rent("uid-f", 2).await;
    let files = |text: &str| {
        vec![crate::callback::FileMount {
            mount_path: "/etc/vllm".into(),
            files: vec![crate::callback::File {
                path: "chat.jinja".into(),
                mode: 0o644,
                data: text.as_bytes().to_vec(),
            }],
        }]
    };
    let handle = rig.server.handle();
    assert!(handle.set_files("uid-f", 2, files("v2")));
    assert!(!handle.set_files("uid-f", 2, files("v2")), "no change");
    assert!(!handle.set_files("uid-f", 1, files("v1")), "another rental");
    assert!(!handle.set_files("uid-unknown", 2, files("v1")));
    let answer = rig.get("workload", &held.session).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    // "v2", base64.
    assert_eq!(answer.body["files"][0]["files"][0]["data"], "djI=");
}

/// The session of a held machine `uid`'s runner (rental 1), which has called in.
async fn held_session(rig: &Rig, uid: &str) -> String {
    let token = rig.server.handle().register_held(uid, 1).expect("held");
    let answer = rig.exchange(token.expose()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body["sessionToken"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_held_machine_has_no_workload_until_a_pod_takes_it_and_then_runs_as_that_pod() {
    let rig = rig(&RunnerKeys::random()).await;
    let handle = rig.server.handle();
    let session = held_session(&rig, "held-1").await;

    // No workload: the runner is told to wait, and each poll says nothing has come.
    let none = rig.get("workload", &session).await;
    assert_eq!(
        (none.status, none.code()),
        (409, Some("HeldForAPod")),
        "{none:?}"
    );
    let message = none.body["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("binding held-1 is a machine held for a Pod"),
        "{message}"
    );
    let waiting = rig.get("handover", &session).await;
    assert_eq!(waiting.status, 200, "{waiting:?}");
    assert_eq!(waiting.body, serde_json::json!({}));
    let seen = handle.held("held-1").expect("held");
    assert!(seen.called_in && !seen.lost && !seen.handed, "{seen:?}");

    // What cannot be handed over registers nothing.
    let running = rig.rent("pod-running", 1).await;
    let not_held = handle.hand_over("pod-running", "pod-x", 1, workload());
    assert!(
        matches!(&not_held, Err(CallbackError::NotHeld { uid, why }) if uid == "pod-running" && why.contains("not a machine held")),
        "{not_held:?}"
    );
    let unknown = handle.hand_over("held-none", "pod-x", 1, workload());
    assert!(
        matches!(unknown, Err(CallbackError::NotRegistered(_))),
        "{unknown:?}"
    );
    assert!(!handle.is_registered("pod-x"));
    let asked = rig.get("handover", &running.session).await;
    assert_eq!((asked.status, asked.code()), (409, None), "{asked:?}");

    // A Pod takes it: the runner's next poll gets the Pod's secrets, and with them it is the
    // Pod's runner.
    handle
        .hand_over("held-1", "pod-a", 1, workload())
        .expect("hand over");
    let given = rig.get("handover", &session).await;
    assert_eq!(given.status, 200, "{given:?}");
    let token = given.body["bootstrapToken"].as_str().expect("token");
    let boot = given.body["credential"].as_str().expect("credential");
    assert!(handle.held("held-1").expect("held").handed);
    let pods = rig.exchange(token).await;
    assert_eq!(pods.status, 200, "{pods:?}");
    let spiffe_id = pods.body["spiffeId"].as_str().unwrap_or_default();
    assert!(spiffe_id.ends_with("/pod-a"), "{spiffe_id}");
    let pod_session = pods.body["sessionToken"].as_str().unwrap().to_owned();
    let fetched = rig.get("workload", &pod_session).await;
    assert_eq!(fetched.status, 200, "{fetched:?}");
    assert_eq!(fetched.body["image"], "example/train");
    // Its boot credential is spent now that it called in as the Pod's.
    assert_eq!(rig.reauth(boot).await.status, 401);

    // Another Pod cannot take it; the same Pod again (a new leader) gets fresh secrets.
    let other = handle.hand_over("held-1", "pod-b", 1, workload());
    assert!(
        matches!(&other, Err(CallbackError::NotHeld { why, .. }) if why.contains("another Pod took it")),
        "{other:?}"
    );
    assert!(!handle.is_registered("pod-b"));
    handle
        .hand_over("held-1", "pod-a", 1, workload())
        .expect("again");
    let again = rig.get("handover", &session).await;
    assert_ne!(again.body["bootstrapToken"].as_str(), Some(token));
    let shown = format!(
        "{:?}",
        neocloud_protocol::Handover {
            bootstrap_token: Some(token.to_owned()),
            credential: Some(boot.to_owned()),
        }
    );
    assert!(!shown.contains(token) && !shown.contains(boot), "{shown}");
}

#[tokio::test]
async fn a_held_machine_whose_runner_goes_silent_is_lost_and_no_pod_can_take_it() {
    let config = CallbackConfig {
        heartbeat_timeout: Duration::from_millis(400),
        ..config(&RunnerKeys::random())
    };
    let mut rig = rig_with(config).await;
    let handle = rig.server.handle();
    let session = held_session(&rig, "held-2").await;
    assert_eq!(rig.get("handover", &session).await.status, 200);
    // Its polls keep it alive; then they stop (the spot machine was reclaimed).
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(rig.get("handover", &session).await.status, 200);
    }
    assert!(!handle.held("held-2").expect("held").lost);
    let event = tokio::time::timeout(Duration::from_secs(5), rig.events.recv())
        .await
        .expect("lost in time")
        .expect("events");
    assert_eq!(event.uid, "held-2");
    assert!(matches!(event.kind, RunnerEventKind::Lost), "{event:?}");
    assert!(handle.held("held-2").expect("held").lost);
    let taken = handle.hand_over("held-2", "pod-c", 1, workload());
    assert!(
        matches!(&taken, Err(CallbackError::NotHeld { why, .. }) if why.contains("lost")),
        "{taken:?}"
    );
    assert!(!handle.is_registered("pod-c"));
    let late = rig.get("handover", &session).await;
    assert_eq!(
        (late.status, late.code()),
        (403, Some("RentalNotCurrent")),
        "{late:?}"
    );
    assert_eq!(handle.held("pod-c"), None);
}
