use futures::{SinkExt, StreamExt};
use neocloud_protocol::session::{ExitStatus, FrameReader, TerminalSize, split_frames};
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

use super::*;

fn process() -> ExecTarget {
    ExecTarget::Process {
        env: vec![("GREETING".into(), "hello there".into())],
        working_dir: Some("/".into()),
    }
}

fn exec(command: &[&str], tty: bool, stdin: bool) -> SessionRequest {
    SessionRequest::Exec {
        command: command.iter().map(|s| s.to_string()).collect(),
        tty,
        stdin,
    }
}

/// The node's end of a session: frames both ways.
struct Node {
    reader: FrameReader<ReadHalf<DuplexStream>>,
    writer: FrameWriter<WriteHalf<DuplexStream>>,
}

impl Node {
    async fn send(&mut self, frame: Frame) {
        self.writer.send(frame).await.expect("send a frame");
    }
}

/// Serves `request` on one end of a pipe; the test speaks on the other.
fn start(request: SessionRequest, target: ExecTarget) -> Node {
    let (node, runner) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move { serve_session(runner, request, &target).await });
    let (reader, writer) = split_frames(node);
    Node { reader, writer }
}

/// Every frame until the runner closes the connection (at most 10 s).
async fn read_all(node: &mut Node) -> Vec<Frame> {
    let mut frames = Vec::new();
    let read = async {
        while let Some(frame) = node.reader.next().await {
            frames.push(frame.expect("frame"));
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the session ends");
    frames
}

fn joined(frames: &[Frame], pick: fn(&Frame) -> Option<&Vec<u8>>) -> String {
    let bytes: Vec<u8> = frames.iter().filter_map(pick).flatten().copied().collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn stdout(frame: &Frame) -> Option<&Vec<u8>> {
    match frame {
        Frame::Stdout(b) => Some(b),
        _ => None,
    }
}

fn stderr(frame: &Frame) -> Option<&Vec<u8>> {
    match frame {
        Frame::Stderr(b) => Some(b),
        _ => None,
    }
}

fn exit(code: i32) -> Frame {
    Frame::Exit(ExitStatus {
        exit_code: Some(code),
        error: None,
    })
}

#[tokio::test]
async fn exec_sends_both_streams_then_the_exit_code_last() {
    let script = "echo out $GREETING; pwd; echo err >&2; exit 3";
    let mut node = start(exec(&["sh", "-c", script], false, false), process());
    let frames = read_all(&mut node).await;
    assert_eq!(joined(&frames, stdout), "out hello there\n/\n");
    assert_eq!(joined(&frames, stderr), "err\n");
    assert_eq!(frames.last(), Some(&exit(3)));
}

#[tokio::test]
async fn a_command_killed_by_a_signal_exits_with_128_plus_the_signal() {
    let mut node = start(exec(&["sh", "-c", "kill -9 $$"], false, false), process());
    assert_eq!(read_all(&mut node).await.last(), Some(&exit(137)));
}

#[tokio::test]
async fn a_command_that_cannot_start_says_why_without_an_exit_code() {
    let mut node = start(exec(&["/no/such/program"], false, false), process());
    let frames = read_all(&mut node).await;
    let [Frame::Exit(status)] = frames.as_slice() else {
        panic!("{frames:?}");
    };
    assert_eq!(status.exit_code, None);
    let error = status.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with("failed to start \"/no/such/program\":"),
        "{error}"
    );
}

#[tokio::test]
async fn stdin_reaches_the_command_until_it_is_closed() {
    let mut node = start(exec(&["cat"], false, true), process());
    node.send(Frame::Stdin(b"one\n".to_vec())).await;
    node.send(Frame::Stdin(b"two\n".to_vec())).await;
    node.send(Frame::StdinEnd).await;
    let frames = read_all(&mut node).await;
    assert_eq!(joined(&frames, stdout), "one\ntwo\n");
    assert_eq!(frames.last(), Some(&exit(0)));
}

#[tokio::test]
async fn a_dropped_connection_kills_the_command() {
    let dir = tempfile_dir();
    let pid_file = dir.join("pid");
    let script = format!("echo $$ > {}; sleep 30", pid_file.display());
    let node = start(exec(&["sh", "-c", &script], false, false), process());
    let pid = eventually("the command writes its pid", || {
        let text = std::fs::read_to_string(&pid_file).ok()?;
        text.trim().parse::<u32>().ok()
    })
    .await;
    assert!(is_alive(pid), "the command {pid} runs before the drop");
    drop(node);
    eventually("the command is killed", || (!is_alive(pid)).then_some(())).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether process `pid` runs: it is in /proc and not a zombie waiting to be reaped.
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) state ...`: the state follows the last `)` (comm may hold one).
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !state.is_some_and(|rest| rest.starts_with('Z') || rest.starts_with('X'))
}

/// Polls `check` until it gives a value, failing after 10 s.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("neocloud-session-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

#[tokio::test]
async fn a_tty_command_runs_on_a_terminal_of_the_size_sent() {
    let command = ["sh", "-c", "read go; tty; stty size"];
    let mut node = start(exec(&command, true, true), process());
    let size = TerminalSize {
        width: 101,
        height: 33,
    };
    node.send(Frame::Resize(size)).await;
    node.send(Frame::Stdin(b"go\n".to_vec())).await;
    let frames = read_all(&mut node).await;
    let out = joined(&frames, stdout);
    assert!(out.contains("/dev/pts/"), "{out:?}");
    assert!(out.contains("33 101"), "{out:?}");
    assert_eq!(joined(&frames, stderr), "");
    assert_eq!(frames.last(), Some(&exit(0)));
}

#[tokio::test]
async fn a_port_is_forwarded_both_ways_with_half_closes() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut got = Vec::new();
        socket.read_to_end(&mut got).await.expect("read");
        socket.write_all(b"echo: ").await.expect("write");
        socket.write_all(&got).await.expect("write");
    });
    let mut node = start(SessionRequest::PortForward { port }, process());
    node.send(Frame::Data(b"ping".to_vec())).await;
    node.send(Frame::DataEnd).await;
    let frames = read_all(&mut node).await;
    let data: Vec<u8> = (frames.iter())
        .filter_map(|f| match f {
            Frame::Data(b) => Some(b.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(data, b"echo: ping");
    assert_eq!(frames.last(), Some(&Frame::DataEnd));
}

#[tokio::test]
async fn a_refused_port_is_an_error_frame_in_go_s_words() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let mut node = start(SessionRequest::PortForward { port }, process());
    let frames = read_all(&mut node).await;
    let message = format!("dial tcp 127.0.0.1:{port}: connection refused");
    assert_eq!(frames, [Frame::Error(message)]);
}

#[test]
fn docker_exec_names_the_container_and_passes_argv_untouched() {
    let target = ExecTarget::Docker {
        container: "neocloud-uid-1".into(),
    };
    let argv = ["--privileged".to_string(), "a b".into(), "'c'".into()];
    let command = target.command(&argv, true, true).expect("command");
    let args: Vec<_> = command.as_std().get_args().collect();
    assert_eq!(command.as_std().get_program(), "docker");
    assert_eq!(
        args,
        [
            "exec",
            "--interactive",
            "--tty",
            "neocloud-uid-1",
            "--privileged",
            "a b",
            "'c'"
        ]
    );
    let plain = target.command(&argv[..1], false, false).expect("command");
    let args: Vec<_> = plain.as_std().get_args().collect();
    assert_eq!(args, ["exec", "neocloud-uid-1", "--privileged"]);
}
