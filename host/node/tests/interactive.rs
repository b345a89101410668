//! `kubectl exec`, `exec -it`, `attach` and `port-forward` into runner Pods, end to end: the real
//! kubectl and API server, `neocloud-node run`, and the RunPod and Vast simulators running the
//! runner in their containers. The API server reaches the node's kubelet API over SPDY; the node
//! tunnels each session to the Pod's runner over the runner's own TLS connection.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod runner_bin;
mod support;
mod vm_support;
use support::free_port;
use vm_support::World;

/// A Pod on `provider` running `command`, Running.
async fn pod(world: &World, name: &str, provider: &str, command: &[&str], runner: bool) {
    world.command_pod(name, provider, command, runner).await;
    world.wait_phase(name, &["Running"]).await;
}

fn kubectl(world: &World) -> Command {
    let mut cmd = world.ctx.control_plane.kubectl();
    cmd.args(["-n", &world.ctx.namespace]);
    cmd
}

/// Runs kubectl with `args` and `stdin`, off the runtime's threads.
async fn run(world: &World, args: &[&str], stdin: &[u8]) -> Output {
    let mut cmd = kubectl(world);
    cmd.args(args);
    support::output_with_stdin(cmd, stdin).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_runs_commands_in_runner_pods_with_output_exit_codes_and_a_tty() {
    let world = World::containers("iexec").await;
    let mut node = world.spawn();
    pod(&world, "shell", "runpod", &["sleep", "3600"], true).await;

    // Output on both streams, the exit code, and an argv with spaces and quotes unchanged.
    let script = "printf '<%s>' \"$@\"; echo; echo to-stderr >&2; exit 7";
    let out = run(
        &world,
        &[
            "exec", "shell", "--", "sh", "-c", script, "sh", "a b", "c'd\"e", "",
        ],
        b"",
    )
    .await;
    assert_eq!(out.status.code(), Some(7), "{out:?}\n{}", world.node_log());
    assert_eq!(text(&out.stdout), "<a b><c'd\"e><>\n", "{out:?}");
    assert!(text(&out.stderr).contains("to-stderr"), "{out:?}");

    // Success is exit code 0; stdin reaches the command and its end ends `cat`.
    let out = run(
        &world,
        &["exec", "-i", "shell", "--", "cat"],
        b"line one\nline two\n",
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "line one\nline two\n");

    // A command that does not exist: kubectl fails and says why.
    let out = run(&world, &["exec", "shell", "--", "/no/such/program"], b"").await;
    assert!(!out.status.success(), "{out:?}");
    assert!(text(&out.stderr).contains("/no/such/program"), "{out:?}");

    // A TTY, driven through a pseudo-terminal: the size kubectl reads from its terminal is
    // the remote terminal's, and the shell's exit code is kubectl's.
    let (status, screen) = exec_tty(&world, "shell", &[("", b"stty size; tty; exit 5\n")]).await;
    assert_eq!(status, Some(5), "{screen}\n{}", world.node_log());
    assert!(screen.contains("31 97"), "{screen}");
    assert!(screen.contains("/dev/pts/"), "{screen}");

    // A Pod that runs without the runner has nothing to enter, and kubectl says so.
    pod(&world, "direct", "vast", &["sleep", "3600"], false).await;
    let out = run(&world, &["exec", "direct", "--", "true"], b"").await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("without the node's runner"),
        "{out:?}"
    );

    // Without nodes/proxy, the kubelet API refuses, by subresource.
    let (code, body) = direct_exec(&world, "shell", "nobody", &[]).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("subresource=proxy"), "{body}");
    node.start_kill().unwrap();
    let _ = node.wait().await;
}

/// `kubectl exec -it POD -- sh` on a 31x97 pseudo-terminal, typing each step of `input`; the
/// exit code and everything the terminal showed.
async fn exec_tty(
    world: &World,
    pod: &str,
    input: &'static [(&'static str, &'static [u8])],
) -> (Option<i32>, String) {
    let mut cmd = kubectl(world);
    cmd.args(["exec", "-it", pod, "--", "sh"]);
    support::on_a_terminal(cmd, input).await
}

/// An exec request straight to the node's kubelet API as `user` in `groups`; status and body.
async fn direct_exec(world: &World, pod: &str, user: &str, groups: &[&str]) -> (u16, String) {
    let url = format!(
        "https://127.0.0.1:{}/exec/{}/{pod}/main?command=true&output=1",
        world.kubelet_port, world.ctx.namespace
    );
    let response = world
        .kubelet_client(user, groups)
        .post(url)
        .header("Connection", "Upgrade")
        .header("Upgrade", "SPDY/3.1")
        .header("X-Stream-Protocol-Version", "v4.channel.k8s.io")
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// `kubectl port-forward pod/web LOCAL:REMOTE`, started.
fn port_forward(world: &World, local: u16, remote: u16) -> std::process::Child {
    kubectl(world)
        .args(["port-forward", "pod/web", &format!("{local}:{remote}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A tiny HTTP server for the workload: every `GET /NAME` is answered with NAME repeated to
/// 200 kB, so that responses of concurrent connections cannot be mistaken for one another.
const ECHO_SERVER: &str = r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.path.strip('/') * 200000)[:200000].encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn port_forward_reaches_the_workload_s_server_and_attach_follows_its_output() {
    let world = World::containers("ipfwd").await;
    let mut node = world.spawn();
    let remote = free_port();
    let remote_text = remote.to_string();
    pod(
        &world,
        "web",
        "vast",
        &["python3", "-u", "-c", ECHO_SERVER, &remote_text],
        true,
    )
    .await;

    let local = free_port();
    let mut forward = port_forward(&world, local, remote);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    // Wait until the forward serves, then run concurrent requests on separate connections.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match client
            .get(format!("http://127.0.0.1:{local}/ready"))
            .send()
            .await
        {
            Ok(response) if response.status() == 200 => break,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "port-forward never served: {other:?}\n{}",
                    world.node_log()
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    let fetch = |name: &'static str| {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        async move {
            let body = client
                .get(format!("http://127.0.0.1:{local}/{name}"))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            (name, body)
        }
    };
    let results =
        futures::future::join_all(["alpha", "bravo", "alpha", "bravo"].into_iter().map(fetch))
            .await;
    for (name, body) in results {
        assert_eq!(body.len(), 200_000, "{name}");
        let expected = name.repeat(200_000 / name.len() + 1);
        assert!(
            body == expected.as_bytes()[..200_000],
            "{name}: streams mixed ({:?}...)",
            String::from_utf8_lossy(&body[..64])
        );
    }
    forward.kill().unwrap();
    let _ = forward.wait();

    // A port nothing listens on: the forwarded connection is dropped and kubectl says why.
    let closed = free_port();
    let local = free_port();
    let mut refused = port_forward(&world, local, closed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "port-forward never listened"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let failed = client
        .get(format!("http://127.0.0.1:{local}/x"))
        .send()
        .await;
    assert!(failed.is_err(), "{failed:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    refused.kill().unwrap();
    let out = refused.wait_with_output().unwrap();
    assert!(
        text(&out.stderr).contains(&format!("error forwarding port {closed}")),
        "{}",
        text(&out.stderr)
    );

    // Attach follows the workload's output from now on.
    pod(
        &world,
        "ticker",
        "runpod",
        &[
            "sh",
            "-c",
            "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.3; done",
        ],
        true,
    )
    .await;
    let mut attach = kubectl(&world);
    attach
        .args(["attach", "ticker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut attach = attach.spawn().unwrap();
    let mut stdout = attach.stdout.take().unwrap();
    let seen = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while text(&seen).matches("tick").nth(2).is_none() {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        text(&seen)
    });
    let seen = tokio::time::timeout(Duration::from_secs(30), seen)
        .await
        .unwrap_or_else(|_| panic!("attach showed nothing\n{}", world.node_log()))
        .unwrap();
    assert!(seen.matches("tick ").count() >= 3, "{seen}");
    attach.kill().unwrap();
    let _ = attach.wait();
    node.start_kill().unwrap();
    let _ = node.wait().await;
}
