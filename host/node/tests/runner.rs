//! The VM runner end to end on loopback: the callback server in-process and the real
//! `neocloud-runner` binary with the process executor. States, exit code, logs (stored,
//! followed, tailed, limited), refused tokens, and a killed runner reported `Lost`.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use neocloud_node::callback::{
    BootstrapToken, CallbackConfig, CallbackServer, EnvVar, LogOptions, LogStream, RunnerEvent,
    RunnerEventKind, RunnerState, TlsMaterial, Workload,
};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

mod runner_bin;
use runner_bin::runner_binary;

struct Rig {
    server: CallbackServer,
    events: mpsc::Receiver<RunnerEvent>,
    ca: tempfile::NamedTempFile,
}

async fn rig(config: CallbackConfig) -> Rig {
    let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
    let config = CallbackConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..config
    };
    let (server, events) = CallbackServer::start(config, &tls).await.expect("start");
    let ca = tempfile::NamedTempFile::new().expect("ca file");
    std::fs::write(ca.path(), tls.cert_pem()).expect("write ca");
    Rig { server, events, ca }
}

fn fast() -> CallbackConfig {
    CallbackConfig {
        heartbeat_timeout: Duration::from_secs(1),
        ..CallbackConfig::default()
    }
}

fn shell(script: &str) -> Workload {
    Workload {
        image: "unused".into(),
        command: vec!["sh".into(), "-c".into()],
        args: vec![script.into()],
        env: vec![EnvVar::new("GREETING", "hello")],
        ..Workload::default()
    }
}

impl Rig {
    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.server.local_addr().port())
    }

    fn runner(&self, url: &str, token: &str) -> Child {
        Command::new(runner_binary())
            .args(["--callback-url", url, "--executor", "process"])
            .arg("--ca-file")
            .arg(self.ca.path())
            .args(["--heartbeat-interval", "200ms"])
            .env("NEOCLOUD_BOOTSTRAP_TOKEN", token)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the runner")
    }

    async fn event(&mut self) -> RunnerEvent {
        tokio::time::timeout(Duration::from_secs(20), self.events.recv())
            .await
            .expect("an event in time")
            .expect("events open")
    }
}

fn state_of(event: &RunnerEvent) -> (RunnerState, Option<i32>) {
    match &event.kind {
        RunnerEventKind::State(report) => (report.state, report.exit_code),
        RunnerEventKind::Lost => panic!("unexpected Lost for {}", event.uid),
    }
}

async fn finish(child: Child) -> (i32, String) {
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("runner exits in time")
        .expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

/// Collects a follow stream, noting when each chunk arrived.
fn follow(rig: &Rig, uid: &str) -> tokio::task::JoinHandle<Vec<(Instant, String)>> {
    let options = LogOptions {
        follow: true,
        ..LogOptions::default()
    };
    let stream = rig.server.handle().read_logs(uid, options).expect("read");
    tokio::spawn(async move {
        stream
            .map(|chunk| (Instant::now(), String::from_utf8_lossy(&chunk).into_owned()))
            .collect()
            .await
    })
}

async fn read(rig: &Rig, uid: &str, options: LogOptions) -> String {
    let chunks: Vec<_> = rig
        .server
        .handle()
        .read_logs(uid, options)
        .expect("read")
        .collect()
        .await;
    String::from_utf8(chunks.concat()).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_reports_states_streams_logs_and_exits_with_the_workload_code() {
    let mut rig = rig(fast()).await;
    let script = "echo \"$GREETING\"; echo err >&2; sleep 1; exit 3";
    let token = rig
        .server
        .handle()
        .register("uid-1", 1, shell(script))
        .expect("register");
    let followed = follow(&rig, "uid-1");
    let child = rig.runner(&rig.url(), token.expose());
    assert_eq!(state_of(&rig.event().await), (RunnerState::Starting, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Running, None));
    let exited = rig.event().await;
    let exited_at = Instant::now();
    assert_eq!(state_of(&exited), (RunnerState::Exited, Some(3)));
    let (code, stderr) = finish(child).await;
    assert_eq!(code, 3, "{stderr}");

    let lines = rig.server.handle().log_lines("uid-1").expect("lines");
    let mut got: Vec<_> = lines.iter().map(|l| (l.stream, l.line.clone())).collect();
    got.sort();
    assert_eq!(
        got,
        [
            (LogStream::Stdout, "hello".to_string()),
            (LogStream::Stderr, "err".to_string())
        ]
    );

    let followed = followed.await.expect("follow task");
    let hello_at = followed
        .iter()
        .find(|(_, text)| text == "hello\n")
        .map(|(at, _)| *at)
        .expect("hello followed");
    assert!(
        exited_at.duration_since(hello_at) > Duration::from_millis(500),
        "followed lines arrive as they are written, not at exit"
    );
    assert_eq!(followed.len(), 2);

    let tail = LogOptions {
        tail_lines: Some(1),
        ..LogOptions::default()
    };
    assert_eq!(read(&rig, "uid-1", tail).await.lines().count(), 1);
    let limit = LogOptions {
        limit_bytes: Some(3),
        ..LogOptions::default()
    };
    assert_eq!(read(&rig, "uid-1", limit).await.len(), 3);
    let stamped = LogOptions {
        timestamps: true,
        ..LogOptions::default()
    };
    let text = read(&rig, "uid-1", stamped).await;
    for line in text.lines() {
        let (ts, _) = line.split_once(' ').expect("timestamp and a space");
        chrono::DateTime::parse_from_rfc3339(ts).expect("RFC 3339");
    }
}

async fn refused(rig: &Rig, token: &BootstrapToken) -> String {
    let (code, stderr) = finish(rig.runner(&rig.url(), token.expose())).await;
    assert_ne!(code, 0, "{stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_expired_and_replayed_bootstrap_tokens_are_refused() {
    let config = CallbackConfig {
        bootstrap_ttl: Duration::from_millis(300),
        ..fast()
    };
    let rig = rig(config).await;
    let handle = rig.server.handle();

    let real = handle
        .register("uid-wrong", 1, shell("true"))
        .expect("register");
    let wrong = neocloud_node::callback::Secret::new(format!("x{}", real.expose()));
    let stderr = refused(&rig, &wrong).await;
    assert!(stderr.contains("bootstrap token is not valid"), "{stderr}");
    assert!(!stderr.contains(real.expose()));

    let expired = handle
        .register("uid-expired", 1, shell("true"))
        .expect("register");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stderr = refused(&rig, &expired).await;
    assert!(stderr.contains("bootstrap token has expired"), "{stderr}");

    let once = handle
        .register("uid-once", 1, shell("true"))
        .expect("register");
    let (code, stderr) = finish(rig.runner(&rig.url(), once.expose())).await;
    assert_eq!(code, 0, "{stderr}");
    let stderr = refused(&rig, &once).await;
    assert!(stderr.contains("already used (replayed)"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_and_an_untrusted_certificate_are_refused() {
    let rig = rig(fast()).await;
    let token = rig
        .server
        .handle()
        .register("uid-1", 1, shell("true"))
        .expect("register");
    let http = rig.url().replace("https://", "http://");
    let (code, stderr) = finish(rig.runner(&http, token.expose())).await;
    assert_ne!(code, 0);
    assert!(stderr.contains("must use https"), "{stderr}");

    let other = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
    std::fs::write(rig.ca.path(), other.cert_pem()).expect("write ca");
    let (code, stderr) = finish(rig.runner(&rig.url(), token.expose())).await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("failed to exchange the bootstrap token"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_runner_is_reported_lost_after_the_heartbeat_timeout() {
    // Heartbeats every 200 ms against a 3 s timeout: fifteen must go missing before the
    // runner is called lost, so a loaded CI machine delaying a few does not end it early.
    let mut rig = rig(CallbackConfig {
        heartbeat_timeout: Duration::from_secs(3),
        ..CallbackConfig::default()
    })
    .await;
    let token = rig
        .server
        .handle()
        .register("uid-1", 1, shell("sleep 60"))
        .expect("register");
    let mut child = rig.runner(&rig.url(), token.expose());
    assert_eq!(state_of(&rig.event().await), (RunnerState::Starting, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Running, None));
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    if let Ok(event) = rig.events.try_recv() {
        panic!("heartbeats should keep it alive past the timeout, got {event:?}");
    }
    child.start_kill().expect("SIGKILL");
    let killed_at = Instant::now();
    let event = rig.event().await;
    assert_eq!(event.kind, RunnerEventKind::Lost);
    assert!(
        killed_at.elapsed() >= Duration::from_millis(2_000),
        "lost after {:?}, before the 3 s timeout could pass",
        killed_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_simulator_runs_the_runner_from_rendered_user_data() {
    use neocloud_cloudsim::{LambdaSim, SimConfig};
    use neocloud_node::callback::{ExecutorKind, UserDataOptions, render_user_data};

    let mut rig = rig(fast()).await;
    let sim = LambdaSim::start(SimConfig::fast().with_user_data_runner(runner_binary()))
        .await
        .expect("lambda sim");
    let workload = shell("echo from-lambda; sleep 5");
    let token = rig
        .server
        .handle()
        .register("uid-vm", 1, workload)
        .expect("register");
    let options = UserDataOptions {
        executor: ExecutorKind::Process,
        heartbeat_interval: Duration::from_millis(200),
        ..UserDataOptions::default()
    };
    let credential = rig
        .server
        .handle()
        .credential("uid-vm", 1)
        .expect("credential");
    let cert = rig.server.cert_pem();
    let user_data = render_user_data(&rig.url(), cert, &token, &credential, &options);
    let launch = serde_json::json!({
        "region_name": "us-east-1", "instance_type_name": "gpu_1x_a10",
        "ssh_key_names": ["sim-ssh-key"], "name": "nc-uid-vm", "user_data": user_data,
    });
    let http = reqwest::Client::new();
    let response: serde_json::Value = http
        .post(format!("{}/instance-operations/launch", sim.base_url()))
        .bearer_auth(sim.api_key())
        .json(&launch)
        .send()
        .await
        .expect("launch")
        .json()
        .await
        .expect("json");
    let id = response["data"]["instance_ids"][0]
        .as_str()
        .expect("id")
        .to_string();

    assert_eq!(state_of(&rig.event().await), (RunnerState::Starting, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Running, None));
    let options = LogOptions {
        follow: true,
        ..LogOptions::default()
    };
    let mut logs = rig
        .server
        .handle()
        .read_logs("uid-vm", options)
        .expect("logs");
    let first = tokio::time::timeout(Duration::from_secs(10), logs.next()).await;
    assert_eq!(
        first.expect("a line in time").as_deref(),
        Some(&b"from-lambda\n"[..])
    );

    http.post(format!("{}/instance-operations/terminate", sim.base_url()))
        .bearer_auth(sim.api_key())
        .json(&serde_json::json!({ "instance_ids": [id] }))
        .send()
        .await
        .expect("terminate")
        .error_for_status()
        .expect("terminated");
    assert_eq!(rig.event().await.kind, RunnerEventKind::Lost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_runner_stops_the_workload_which_still_reports_its_code() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let mut rig = rig(fast()).await;
    let script = "trap 'exit 7' TERM; while true; do sleep 0.1; done";
    let token = rig
        .server
        .handle()
        .register("uid-1", 1, shell(script))
        .expect("register");
    let child = rig.runner(&rig.url(), token.expose());
    assert_eq!(state_of(&rig.event().await), (RunnerState::Starting, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Running, None));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = i32::try_from(child.id().expect("pid")).expect("pid fits");
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(state_of(&rig.event().await), (RunnerState::Exited, Some(7)));
    let (code, stderr) = finish(child).await;
    assert_eq!(code, 7, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_boots_before_the_node_is_reachable_retries_until_it_is() {
    let mut rig = rig(fast()).await;
    let token = rig
        .server
        .handle()
        .register("uid-early", 1, shell("echo up"))
        .expect("register");
    // For 1.5 s the runner's port drops every connection, as a node (or its network path)
    // coming up late would; then it forwards to the callback server. The port stays bound
    // throughout, so no other test's server can be given it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the forwarder");
    let port = listener.local_addr().expect("addr").port();
    let child = rig.runner(&format!("https://127.0.0.1:{port}"), token.expose());
    let target = rig.server.local_addr();
    let opens_at = tokio::time::Instant::now() + Duration::from_millis(1500);
    let forwarder = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            if tokio::time::Instant::now() < opens_at {
                drop(inbound);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    assert_eq!(state_of(&rig.event().await), (RunnerState::Starting, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Running, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Exited, Some(0)));
    let (code, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("retrying"), "{stderr}");
    forwarder.abort();
}

/// The docker executor's command line as the real runner binary builds it, read by a `docker`
/// on `PATH` that writes its arguments one per line and exits 0: an image that looks like an
/// option (translation refuses it first; this is the runner's own line) stays an operand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_command_line_keeps_every_pod_value_out_of_docker_s_options() {
    use std::os::unix::fs::PermissionsExt;

    let mut rig = rig(fast()).await;
    let bin = tempfile::tempdir().expect("bin dir");
    let seen = bin.path().join("argv");
    let docker = bin.path().join("docker");
    std::fs::write(
        &docker,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {}\n",
            seen.display()
        ),
    )
    .expect("write docker");
    std::fs::set_permissions(&docker, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let workload = Workload {
        image: "--privileged".into(),
        command: vec!["--volume=/:/host".into()],
        args: vec!["ubuntu".into(), "sh".into()],
        ..Workload::default()
    };
    let token = rig
        .server
        .handle()
        .register("uid-docker", 1, workload)
        .expect("register");
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = Command::new(runner_binary())
        .args(["--callback-url", &rig.url(), "--executor", "docker"])
        .arg("--ca-file")
        .arg(rig.ca.path())
        .args(["--network", "bridge", "--heartbeat-interval", "200ms"])
        .env("NEOCLOUD_BOOTSTRAP_TOKEN", token.expose())
        .env("PATH", path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the runner");
    let (code, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stderr}");
    while rig.events.try_recv().is_ok() {}
    let argv = std::fs::read_to_string(&seen).expect("docker was run");
    let argv: Vec<&str> = argv.lines().collect();
    let end = argv
        .iter()
        .position(|a| *a == "--")
        .expect("`--` ends the options");
    assert_eq!(
        argv[end + 1..],
        ["--privileged", "ubuntu", "sh"],
        "{argv:?}"
    );
    assert!(argv[..end].contains(&"--network=bridge"), "{argv:?}");
    assert!(
        argv[..end].contains(&"--entrypoint=--volume=/:/host"),
        "{argv:?}"
    );
    assert!(!argv[..end].contains(&"--privileged"), "{argv:?}");

    let refused = Command::new(runner_binary())
        .args(["--callback-url", &rig.url(), "--executor", "docker"])
        .arg("--ca-file")
        .arg(rig.ca.path())
        .args(["--network", "host --pid=host"])
        .env("NEOCLOUD_BOOTSTRAP_TOKEN", "unused")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (code, stderr) = finish(refused).await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("\"host --pid=host\" is not a network mode"),
        "{stderr}"
    );
}

/// The runner's container executor on a real Docker engine (Debian's dockerd, started by the
/// test, without GPUs: `--gpus none`): the image's entrypoint runs the Pod's args, the
/// environment comes from the env file (never the command line), the container's exit code is
/// the workload's, and SIGTERM to the runner (a VM shutting down when its Pod is deleted) stops
/// the container, which still reports its own code. `--rm` leaves no container behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_docker_engine_runs_the_workload_and_sigterm_stops_it() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let docker = neocloud_testenv::Docker::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    docker
        .import_busybox("neocloud-test/busybox:1")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut rig = rig(fast()).await;
    let in_container = |script: &str| Workload {
        image: "neocloud-test/busybox:1".into(),
        command: vec![],
        args: vec![script.into()],
        env: vec![
            EnvVar::new("GREETING", "hello"),
            EnvVar::new("API_TOKEN", "tok_docker_never_on_argv_93"),
        ],
        ..Workload::default()
    };
    let (url, ca) = (rig.url(), rig.ca.path().to_owned());
    let runner = |token: &str| {
        Command::new(runner_binary())
            .args(["--callback-url", &url, "--executor", "docker"])
            .arg("--ca-file")
            .arg(&ca)
            .args(["--gpus", "none", "--heartbeat-interval", "200ms"])
            .env("NEOCLOUD_BOOTSTRAP_TOKEN", token)
            .env("DOCKER_HOST", docker.host())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the runner")
    };

    // The image's entrypoint (`/bin/sh -c`) runs the Pod's args with the env file's values.
    let script = "echo \"$GREETING from $(cat /proc/1/cmdline | tr '\\0' ' ')\"; \
                  test -n \"$API_TOKEN\" && echo token-set; exit 7";
    let token = rig
        .server
        .handle()
        .register("uid-docker-1", 1, in_container(script))
        .expect("register");
    let child = runner(token.expose());
    assert_eq!(state_of(&rig.event().await), (RunnerState::Starting, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Running, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Exited, Some(7)));
    let (code, stderr) = finish(child).await;
    assert_eq!(code, 7, "{stderr}\n{}", docker.log_tail(20));
    let lines = rig
        .server
        .handle()
        .log_lines("uid-docker-1")
        .expect("lines");
    let out: Vec<&str> = lines.iter().map(|l| l.line.as_str()).collect();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out[0].starts_with("hello from /bin/sh -c "), "{out:?}");
    assert_eq!(out[1], "token-set");
    assert!(
        !out[0].contains("tok_docker_never_on_argv_93"),
        "the value is not on the container's command line: {out:?}"
    );

    // SIGTERM to the runner reaches the container, which ends with its own code.
    let script = "trap 'echo stopping; exit 143' TERM; echo ready; while :; do sleep 0.1; done";
    let token = rig
        .server
        .handle()
        .register("uid-docker-2", 1, in_container(script))
        .expect("register");
    let child = runner(token.expose());
    assert_eq!(state_of(&rig.event().await), (RunnerState::Starting, None));
    assert_eq!(state_of(&rig.event().await), (RunnerState::Running, None));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !rig
        .server
        .handle()
        .log_lines("uid-docker-2")
        .is_ok_and(|l| l.iter().any(|l| l.line == "ready"))
    {
        assert!(Instant::now() < deadline, "{}", docker.log_tail(20));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = i32::try_from(child.id().expect("pid")).expect("pid fits");
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(
        state_of(&rig.event().await),
        (RunnerState::Exited, Some(143))
    );
    let (code, stderr) = finish(child).await;
    assert_eq!(code, 143, "{stderr}");
    let lines = rig
        .server
        .handle()
        .log_lines("uid-docker-2")
        .expect("lines");
    assert!(lines.iter().any(|l| l.line == "stopping"), "{lines:?}");

    let left = docker
        .command()
        .args(["ps", "--all", "--quiet"])
        .output()
        .expect("docker ps");
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "", "--rm");
}
