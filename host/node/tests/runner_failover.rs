//! The real `neocloud-runner` binary across a node restart or leader change, on loopback:
//! two callback servers sharing one runner identity (keys and certificate) stand for the old
//! and the new leader. A running runner carries on with the new one (heartbeats, logs, exit
//! code, no `Lost`); a runner that boots after the change gets in with its credential; a
//! forged credential is refused.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use neocloud_node::callback::{
    CallbackConfig, CallbackServer, CredentialKind, LogOptions, RunnerEvent, RunnerEventKind,
    RunnerKeys, RunnerState, Secret, TlsMaterial, Workload,
};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

mod runner_bin;
use runner_bin::runner_binary;

/// One leader's callback server.
struct Leader {
    server: CallbackServer,
    events: mpsc::Receiver<RunnerEvent>,
}

/// The identity every leader shares, and where runners find it.
struct Cluster {
    keys: RunnerKeys,
    tls: TlsMaterial,
    ca: tempfile::NamedTempFile,
}

impl Cluster {
    fn new() -> Self {
        let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
        let ca = tempfile::NamedTempFile::new().expect("ca file");
        std::fs::write(ca.path(), tls.cert_pem()).expect("write ca");
        Self {
            keys: RunnerKeys::random(),
            tls,
            ca,
        }
    }

    /// A leader listening on `port` (0: any).
    async fn lead(&self, port: u16) -> Leader {
        let config = CallbackConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            heartbeat_timeout: Duration::from_secs(2),
            keys: self.keys.clone(),
            adoption_window: Duration::from_secs(60),
            ..CallbackConfig::default()
        };
        let (server, events) = CallbackServer::start(config, &self.tls)
            .await
            .expect("start");
        Leader { server, events }
    }

    fn runner(&self, port: u16, token: &Secret, credential: &Secret) -> Child {
        Command::new(runner_binary())
            .args(["--executor", "process"])
            .args(["--callback-url", &format!("https://127.0.0.1:{port}")])
            .arg("--ca-file")
            .arg(self.ca.path())
            .args(["--heartbeat-interval", "200ms"])
            .env("NEOCLOUD_BOOTSTRAP_TOKEN", token.expose())
            .env("NEOCLOUD_RUNNER_CREDENTIAL", credential.expose())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the runner")
    }
}

impl Leader {
    fn port(&self) -> u16 {
        self.server.local_addr().port()
    }

    async fn event(&mut self) -> RunnerEvent {
        tokio::time::timeout(Duration::from_secs(20), self.events.recv())
            .await
            .expect("an event in time")
            .expect("events open")
    }

    async fn state(&mut self) -> (RunnerState, Option<i32>) {
        match self.event().await.kind {
            RunnerEventKind::State(report) => (report.state, report.exit_code),
            RunnerEventKind::Lost => panic!("the runner was declared lost"),
        }
    }
}

fn shell(script: &str) -> Workload {
    Workload {
        image: "unused".into(),
        command: vec!["sh".into(), "-c".into()],
        args: vec![script.into()],
        ..Workload::default()
    }
}

async fn finish(child: Child) -> (i32, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("runner exits in time")
        .expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_runner_carries_on_with_the_next_leader_without_being_lost() {
    let cluster = Cluster::new();
    let mut old = cluster.lead(0).await;
    let port = old.port();
    let script = "i=0; while [ $i -lt 25 ]; do i=$((i+1)); echo tick $i; sleep 0.2; done; exit 4";
    let handle = old.server.handle();
    let token = handle
        .register("uid-1", 1, shell(script))
        .expect("register");
    let credential = handle.credential("uid-1", 1).expect("credential");
    let child = cluster.runner(port, &token, &credential);
    assert_eq!(old.state().await, (RunnerState::Starting, None));
    assert_eq!(old.state().await, (RunnerState::Running, None));
    old.server.shutdown().await;
    drop(old.events);

    // The next leader comes up on the same address a second later, knowing nothing but the
    // shared identity; it adopts the binding as running.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut new = cluster.lead(port).await;
    let handle = new.server.handle();
    handle.adopt("uid-1", 1, shell(script), Some(RunnerState::Running), None);
    assert_eq!(
        new.state().await,
        (RunnerState::Exited, Some(4)),
        "no Lost first"
    );
    let (code, stderr) = finish(child).await;
    assert_eq!(code, 4, "{stderr}");
    let lines = handle.log_lines("uid-1").expect("lines");
    let last = lines.last().map(|l| l.line.clone());
    assert_eq!(last.as_deref(), Some("tick 25"), "{lines:?}\n{stderr}");
    assert!(
        lines.len() >= 5,
        "lines after the change reach the new leader: {lines:?}\n{stderr}"
    );
    let all = handle
        .read_logs("uid-1", LogOptions::default())
        .expect("logs");
    drop(all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_boots_after_the_leader_changed_gets_in_with_its_credential() {
    let cluster = Cluster::new();
    let old = cluster.lead(0).await;
    let token = old
        .server
        .handle()
        .register("uid-2", 1, shell("echo up"))
        .unwrap();
    let credential = old.server.handle().credential("uid-2", 1).unwrap();
    old.server.shutdown().await;

    let mut new = cluster.lead(0).await;
    new.server
        .handle()
        .adopt("uid-2", 1, shell("echo up"), None, None);
    let child = cluster.runner(new.port(), &token, &credential);
    assert_eq!(new.state().await, (RunnerState::Starting, None));
    assert_eq!(new.state().await, (RunnerState::Running, None));
    assert_eq!(new.state().await, (RunnerState::Exited, Some(0)));
    let (code, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("using the credential"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_with_a_forged_or_rotated_away_credential_is_refused() {
    let cluster = Cluster::new();
    let node = cluster.lead(0).await;
    let handle = node.server.handle();
    let token = handle.register("uid-3", 1, shell("echo never")).unwrap();
    let domain = neocloud_node::callback::DEFAULT_TRUST_DOMAIN;
    let until = neocloud_protocol::unix_now() + 600;
    let rotated = RunnerKeys::random()
        .credential(domain, "uid-3", 1, CredentialKind::Boot, until)
        .unwrap();
    let real = handle.credential("uid-3", 1).unwrap();
    let forged = Secret::new(real.expose().replace(":uid-3:", ":uid-4:"));
    let stale = Secret::new("x");
    for (credential, why) in [
        (&rotated, "rotated-away key"),
        (&forged, "credential is not valid"),
        (&stale, "malformed"),
    ] {
        let spent = Secret::new(format!("{}-not-the-token", token.expose()));
        let (code, stderr) = finish(cluster.runner(node.port(), &spent, credential)).await;
        assert_ne!(code, 0, "{stderr}");
        assert!(stderr.contains(why), "{why}: {stderr}");
        assert!(
            !stderr.contains(real.expose()),
            "no credential in the runner's errors"
        );
    }
}
