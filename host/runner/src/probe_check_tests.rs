use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An HTTP server on loopback answering every request with `status`, sending each request's
/// head to the returned channel.
async fn http_server(status: u16) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (heads, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0; 4096];
            let n = socket.read(&mut buf).await.unwrap_or(0);
            let _ = heads.send(String::from_utf8_lossy(&buf[..n]).into_owned());
            let answer =
                format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    (port, rx)
}

/// A loopback port nothing listens on.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("addr").port()
}

fn checker() -> Checker {
    Checker::new(ExecTarget::Process {
        env: vec![("PROBE_VAR".into(), "from-the-workload".into())],
        working_dir: None,
    })
    .expect("checker")
}

fn http(port: u16, path: &str, headers: Vec<(String, String)>) -> Probe {
    Probe::new(ProbeAction::HttpGet {
        https: false,
        host: String::new(),
        port,
        path: path.into(),
        headers,
    })
}

#[tokio::test]
async fn an_http_probe_passes_below_400_sending_its_path_and_headers() {
    let (port, mut heads) = http_server(204).await;
    let headers = vec![("X-Probe".to_owned(), "yes".to_owned())];
    checker()
        .check(&http(port, "/healthz?full=1", headers))
        .await
        .expect("204 passes");
    let head = heads.recv().await.expect("request").to_lowercase();
    assert!(head.starts_with("get /healthz?full=1 http/1.1"), "{head}");
    assert!(
        head.contains("x-probe: yes") && head.contains("user-agent: kube-probe/"),
        "{head}"
    );
}

#[tokio::test]
async fn an_http_probe_fails_with_the_status_as_a_kubelet_words_it() {
    let (port, _heads) = http_server(503).await;
    let err = checker()
        .check(&http(port, "/", vec![]))
        .await
        .expect_err("503");
    assert_eq!(err, "HTTP probe failed with statuscode: 503");
}

#[tokio::test]
async fn an_http_probe_of_a_closed_port_says_the_connection_was_refused() {
    let port = closed_port().await;
    let err = checker()
        .check(&http(port, "/h", vec![]))
        .await
        .expect_err("closed");
    assert_eq!(
        err,
        format!(
            "Get \"http://127.0.0.1:{port}/h\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        )
    );
}

#[tokio::test]
async fn an_http_probe_that_gets_no_answer_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let err = checker()
        .check(&http(port, "/", vec![]))
        .await
        .expect_err("silent");
    assert!(
        err.ends_with("context deadline exceeded (Client.Timeout exceeded while awaiting headers)"),
        "{err}"
    );
    drop(listener);
}

#[tokio::test]
async fn a_tcp_probe_passes_on_a_listener_and_fails_on_a_closed_port() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let open = listener.local_addr().expect("addr").port();
    let tcp = |port| {
        Probe::new(ProbeAction::TcpSocket {
            host: String::new(),
            port,
        })
    };
    checker().check(&tcp(open)).await.expect("open");
    let port = closed_port().await;
    let err = checker().check(&tcp(port)).await.expect_err("closed");
    assert_eq!(
        err,
        format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
    );
}

#[tokio::test]
async fn an_exec_probe_runs_in_the_workload_s_environment_and_fails_with_its_output() {
    let exec = |script: &str| {
        Probe::new(ProbeAction::Exec {
            command: vec!["sh".into(), "-c".into(), script.into()],
        })
    };
    checker()
        .check(&exec("test \"$PROBE_VAR\" = from-the-workload"))
        .await
        .expect("the workload's env");
    let err = checker()
        .check(&exec("echo not ready; exit 3"))
        .await
        .expect_err("3");
    assert_eq!(err, "not ready");
    let err = checker().check(&exec("exit 2")).await.expect_err("2");
    assert!(err.ends_with("exited with 2"), "{err}");
    let err = checker().check(&exec("sleep 5")).await.expect_err("slow");
    assert!(err.ends_with("timed out"), "{err}");
    // 1 MiB of output, far past a pipe's buffer: read to the end (the command is not blocked
    // on a full pipe), and only its first KiB kept for the message.
    let mut chatty = exec("head -c 1048576 /dev/zero | tr '\\0' x; exit 1");
    chatty.timeout_seconds = 30;
    let err = checker().check(&chatty).await.expect_err("1");
    assert_eq!(err.len(), 1024, "{}", &err[..64]);
}
