//! Sessions end to end, over real HTTPS: the callback server, the runner's own session loop
//! (process executor) and [`CallbackHandle::open_session`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use neocloud_protocol::session::{ExitStatus, Frame, TerminalSize, frame_reader, frame_writer};
use neocloud_runner::{CallbackClient, ExecTarget, serve_sessions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use super::*;
use crate::callback::{
    CallbackConfig, CallbackServer, RunnerEvent, RunnerState, StatusReport, TlsMaterial, Workload,
};

struct Rig {
    server: CallbackServer,
    handle: CallbackHandle,
    _events: tokio::sync::mpsc::Receiver<RunnerEvent>,
}

struct Runner {
    client: Arc<CallbackClient>,
    sessions: Option<JoinHandle<()>>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(task) = &self.sessions {
            task.abort();
        }
    }
}

async fn rig_with(config: CallbackConfig) -> Rig {
    let tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).expect("cert");
    let config = CallbackConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..config
    };
    let (server, events) = CallbackServer::start(config, &tls).await.expect("start");
    let handle = server.handle();
    Rig {
        server,
        handle,
        _events: events,
    }
}

async fn rig() -> Rig {
    rig_with(CallbackConfig {
        session_open_timeout: Duration::from_secs(2),
        ..CallbackConfig::default()
    })
    .await
}

impl Rig {
    /// Registers `uid` and authenticates its runner; with `polling`, runs its session loop.
    async fn runner(&self, uid: &str, polling: bool) -> Runner {
        let token = self
            .handle
            .register(uid, 1, Workload::default())
            .expect("register");
        let url = format!("https://127.0.0.1:{}", self.server.local_addr().port());
        let client = CallbackClient::new(&url, self.server.cert_pem().as_bytes()).expect("client");
        client.exchange(&token).await.expect("exchange");
        let client = Arc::new(client);
        let target = Arc::new(ExecTarget::Process {
            env: vec![("GREETING".into(), "hi".into())],
            working_dir: None,
        });
        let sessions = polling.then(|| tokio::spawn(serve_sessions(client.clone(), target)));
        Runner { client, sessions }
    }
}

fn exec(command: &[&str], tty: bool, stdin: bool) -> SessionRequest {
    SessionRequest::Exec {
        command: command.iter().map(|s| s.to_string()).collect(),
        tty,
        stdin,
    }
}

/// Sends `frame` on the session.
async fn send(io: &mut SessionIo, frame: Frame) {
    frame_writer(io).send(frame).await.expect("send a frame");
}

/// Every frame until the runner closes the session (at most 10 s).
async fn read_all(io: &mut SessionIo) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut reader = frame_reader(io);
    let read = async {
        while let Some(frame) = reader.next().await {
            frames.push(frame.expect("frame"));
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the session ends");
    frames
}

/// The bytes of the frames `pick` chooses, as text.
fn text(frames: &[Frame], pick: impl Fn(&Frame) -> Option<&Vec<u8>>) -> String {
    let bytes: Vec<u8> = frames.iter().filter_map(pick).flatten().copied().collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn stdout(frames: &[Frame]) -> String {
    text(frames, |f| match f {
        Frame::Stdout(b) => Some(b),
        _ => None,
    })
}

fn stderr(frames: &[Frame]) -> String {
    text(frames, |f| match f {
        Frame::Stderr(b) => Some(b),
        _ => None,
    })
}

fn exited(code: i32) -> Frame {
    Frame::Exit(ExitStatus {
        exit_code: Some(code),
        error: None,
    })
}

#[tokio::test]
async fn exec_sends_stdout_stderr_and_the_exit_code() {
    let rig = rig().await;
    let _runner = rig.runner("uid-a", true).await;
    let script = "echo out $GREETING; echo err >&2; exit 3";
    let request = exec(&["sh", "-c", script], false, false);
    let mut io = rig
        .handle
        .open_session("uid-a", request)
        .await
        .expect("open");
    let frames = read_all(&mut io).await;
    assert_eq!(stdout(&frames), "out hi\n");
    assert_eq!(stderr(&frames), "err\n");
    assert_eq!(frames.last(), Some(&exited(3)));
}

#[tokio::test]
async fn exec_with_stdin_echoes_what_is_sent_and_ends_on_stdin_end() {
    let rig = rig().await;
    let _runner = rig.runner("uid-a", true).await;
    let request = exec(&["cat"], false, true);
    let mut io = rig
        .handle
        .open_session("uid-a", request)
        .await
        .expect("open");
    send(&mut io, Frame::Stdin(b"hello\n".to_vec())).await;
    send(&mut io, Frame::Stdin(vec![b'x'; 300_000])).await;
    send(&mut io, Frame::StdinEnd).await;
    let frames = read_all(&mut io).await;
    assert_eq!(stdout(&frames), format!("hello\n{}", "x".repeat(300_000)));
    assert_eq!(frames.last(), Some(&exited(0)));
}

#[tokio::test]
async fn an_argv_with_spaces_and_quotes_arrives_unchanged() {
    let rig = rig().await;
    let _runner = rig.runner("uid-a", true).await;
    let argv = [
        "printf", "[%s]", "a b", "'c'", "\"d\"", "$HOME", "; echo x", "",
    ];
    let mut io = (rig
        .handle
        .open_session("uid-a", exec(&argv, false, false))
        .await)
        .expect("open");
    let frames = read_all(&mut io).await;
    assert_eq!(stdout(&frames), "[a b]['c'][\"d\"][$HOME][; echo x][]");
    assert_eq!(frames.last(), Some(&exited(0)));
}

#[tokio::test]
async fn exec_with_a_tty_runs_on_a_terminal_of_the_size_sent() {
    let rig = rig().await;
    let _runner = rig.runner("uid-a", true).await;
    // The command waits for a line, so the resize before it is applied first.
    let request = exec(&["sh", "-c", "read go; tty; stty size"], true, true);
    let mut io = rig
        .handle
        .open_session("uid-a", request)
        .await
        .expect("open");
    let size = TerminalSize {
        width: 101,
        height: 33,
    };
    send(&mut io, Frame::Resize(size)).await;
    send(&mut io, Frame::Stdin(b"go\r".to_vec())).await;
    let frames = read_all(&mut io).await;
    let out = stdout(&frames);
    assert!(out.contains("/dev/pts/"), "{out:?}");
    assert!(out.contains("33 101"), "{out:?}");
    assert_eq!(stderr(&frames), "", "a terminal has one stream");
    assert_eq!(frames.last(), Some(&exited(0)));
}

/// A server that answers each connection with what it read, prefixed, once the client is done.
async fn echo_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                socket.read_to_end(&mut got).await.expect("read");
                socket.write_all(b"echo:").await.expect("write");
                socket.write_all(&got).await.expect("write");
            });
        }
    });
    port
}

async fn forward(handle: &CallbackHandle, port: u16, payload: Vec<u8>) -> Vec<u8> {
    let request = SessionRequest::PortForward { port };
    let mut io = handle.open_session("uid-a", request).await.expect("open");
    for chunk in payload.chunks(50_000) {
        send(&mut io, Frame::Data(chunk.to_vec())).await;
    }
    send(&mut io, Frame::DataEnd).await;
    let frames = read_all(&mut io).await;
    assert_eq!(frames.last(), Some(&Frame::DataEnd));
    (frames.iter())
        .filter_map(|f| match f {
            Frame::Data(b) => Some(b.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[tokio::test]
async fn concurrent_port_forwards_do_not_mix() {
    let rig = rig().await;
    let _runner = rig.runner("uid-a", true).await;
    let port = echo_server().await;
    let (a, b) = tokio::join!(
        forward(&rig.handle, port, vec![b'a'; 200_000]),
        forward(&rig.handle, port, vec![b'b'; 150_000]),
    );
    assert_eq!(a, [b"echo:".as_slice(), &[b'a'; 200_000]].concat());
    assert_eq!(b, [b"echo:".as_slice(), &[b'b'; 150_000]].concat());
}

#[tokio::test]
async fn a_refused_port_gives_an_error_frame() {
    let rig = rig().await;
    let _runner = rig.runner("uid-a", true).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let request = SessionRequest::PortForward { port };
    let mut io = rig
        .handle
        .open_session("uid-a", request)
        .await
        .expect("open");
    let message = format!("dial tcp 127.0.0.1:{port}: connection refused");
    assert_eq!(read_all(&mut io).await, [Frame::Error(message)]);
}

#[tokio::test]
async fn an_unknown_binding_is_not_registered() {
    let rig = rig().await;
    let err = (rig
        .handle
        .open_session("nobody", exec(&["true"], false, false))
        .await)
        .err()
        .expect("unknown");
    assert!(matches!(err, CallbackError::NotRegistered(_)), "{err}");
    assert!(rig.handle.0.sessions.bindings.lock().is_empty());
}

#[tokio::test]
async fn a_binding_whose_runner_does_not_poll_times_out_clearly_and_leaves_nothing() {
    let rig = rig_with(CallbackConfig {
        session_open_timeout: Duration::from_millis(300),
        ..CallbackConfig::default()
    })
    .await;
    let _runner = rig.runner("uid-a", false).await;
    let err = (rig
        .handle
        .open_session("uid-a", exec(&["true"], false, false))
        .await)
        .err()
        .expect("times out");
    assert!(matches!(err, CallbackError::SessionTimeout { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.starts_with("the runner of binding uid-a did not open the session within 300ms"),
        "{message}"
    );
    assert!(message.contains("not polling for sessions"), "{message}");
    let bindings = rig.handle.0.sessions.bindings.lock();
    let binding = bindings.get(&("uid-a".to_owned(), 1)).expect("binding");
    assert!(binding.queue.is_empty() && binding.pending.is_empty());
    assert_eq!(binding.open.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_opener_that_gives_up_withdraws_its_offer() {
    let rig = rig().await;
    let _runner = rig.runner("uid-a", false).await;
    let open = rig
        .handle
        .open_session("uid-a", exec(&["true"], false, false));
    let gave_up = tokio::time::timeout(Duration::from_millis(100), open).await;
    assert!(gave_up.is_err());
    let bindings = rig.handle.0.sessions.bindings.lock();
    let binding = bindings.get(&("uid-a".to_owned(), 1)).expect("binding");
    assert!(binding.queue.is_empty() && binding.pending.is_empty());
    assert_eq!(binding.open.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn unregistering_fails_the_waiting_opener_and_forgets_the_binding() {
    let rig = rig().await;
    let _runner = rig.runner("uid-a", false).await;
    let handle = rig.handle.clone();
    let open = tokio::spawn(async move {
        let request = exec(&["true"], false, false);
        handle.open_session("uid-a", request).await.err()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    rig.handle.unregister("uid-a");
    let err = open.await.expect("join").expect("fails");
    assert!(matches!(err, CallbackError::NotRegistered(_)), "{err}");
    assert!(rig.handle.0.sessions.bindings.lock().is_empty());
}

#[tokio::test]
async fn no_session_opens_once_the_runner_has_exited() {
    let rig = rig().await;
    let runner = rig.runner("uid-a", true).await;
    let report = StatusReport {
        exit_code: Some(0),
        ..StatusReport::new(RunnerState::Exited)
    };
    runner.client.status(&report).await.expect("report");
    let err = (rig
        .handle
        .open_session("uid-a", exec(&["true"], false, false))
        .await)
        .err()
        .expect("exited");
    assert_eq!(
        err.to_string(),
        "the runner of binding uid-a has exited: no session can be opened"
    );
}

#[tokio::test]
async fn a_binding_has_a_limit_of_open_sessions() {
    let rig = rig_with(CallbackConfig {
        max_sessions_per_binding: 2,
        ..CallbackConfig::default()
    })
    .await;
    let _runner = rig.runner("uid-a", true).await;
    let cat = || exec(&["cat"], false, true);
    let first = rig.handle.open_session("uid-a", cat()).await.expect("1");
    let _second = rig.handle.open_session("uid-a", cat()).await.expect("2");
    let err = (rig.handle.open_session("uid-a", cat()).await)
        .err()
        .expect("3");
    assert!(
        matches!(err, CallbackError::TooManySessions { limit: 2, .. }),
        "{err}"
    );
    drop(first);
    let mut third = rig
        .handle
        .open_session("uid-a", cat())
        .await
        .expect("3 after 1");
    send(&mut third, Frame::StdinEnd).await;
    assert_eq!(read_all(&mut third).await.last(), Some(&exited(0)));
}

#[tokio::test]
async fn a_relay_s_connections_are_counted_apart_from_the_other_sessions() {
    let rig = rig_with(CallbackConfig {
        max_sessions_per_binding: 1,
        max_relayed_per_binding: 2,
        ..CallbackConfig::default()
    })
    .await;
    let _runner = rig.runner("uid-a", true).await;
    let _exec = (rig.handle)
        .open_session("uid-a", exec(&["cat"], false, true))
        .await
        .expect("the one exec");
    // The relay's two connections open beside the exec, and a third is refused with its own
    // limit; the exec limit is untouched by them.
    let _one = rig
        .handle
        .open_relayed("uid-a", 1)
        .await
        .expect("relayed 1");
    let _two = rig
        .handle
        .open_relayed("uid-a", 1)
        .await
        .expect("relayed 2");
    let err = (rig.handle.open_relayed("uid-a", 1).await)
        .err()
        .expect("relayed 3");
    assert!(
        matches!(err, CallbackError::TooManySessions { limit: 2, .. }),
        "{err}"
    );
    let err = (rig.handle)
        .open_session("uid-a", exec(&["cat"], false, true))
        .await
        .err()
        .expect("a second exec");
    assert!(
        matches!(err, CallbackError::TooManySessions { limit: 1, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_runner_cannot_take_another_binding_s_offer() {
    let rig = rig().await;
    let a = rig.runner("uid-a", false).await;
    let b = rig.runner("uid-b", false).await;
    let handle = rig.handle.clone();
    let open = tokio::spawn(async move {
        let request = SessionRequest::PortForward { port: 1 };
        handle.open_session("uid-a", request).await.is_ok()
    });
    let offer = a.client.next_session().await.expect("poll").expect("offer");
    let err = b.client.open_session(&offer.id).await.expect_err("b");
    assert_eq!(err.status(), Some(404), "{err}");
    let _io = a
        .client
        .open_session(&offer.id)
        .await
        .expect("a takes its own");
    assert!(open.await.expect("join"), "the opener gets a's connection");
    let err = a.client.open_session(&offer.id).await.expect_err("again");
    assert_eq!(err.status(), Some(404), "single use: {err}");
}
