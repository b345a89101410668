//! An exec served over SPDY with a fake runner on the other end of its session: the runner's
//! frames reach the client whole, whatever the client does meanwhile.

use bytes::BytesMut;
use neocloud_protocol::session::{ExitStatus, Frame, FrameCodec};
use neocloud_remote::callback::SessionIo;
use tokio::io::AsyncWriteExt;
use tokio_util::codec::Encoder;

use super::super::ExecOptions;
use super::{Opening, serve_exec};
use crate::spdy::test_client::{self, Client, syn_stream};

const ERROR: u32 = 1;
const STDOUT: u32 = 3;
const STDERR: u32 = 5;
const EXTRA: u32 = 7;

fn wire(frames: &[Frame]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for frame in frames {
        FrameCodec::default()
            .encode(frame.clone(), &mut out)
            .expect("encode");
    }
    out.to_vec()
}

/// What the client received, by stream.
#[derive(Default)]
struct Received {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Vec<u8>,
    status_done: bool,
    extra_reset: bool,
}

impl Received {
    async fn take(&mut self, client: &mut Client) {
        let frame = client.next().await.expect("the connection is open");
        match frame {
            test_client::Frame::Data(STDOUT, _, bytes) => self.stdout.extend_from_slice(&bytes),
            test_client::Frame::Data(STDERR, _, bytes) => self.stderr.extend_from_slice(&bytes),
            test_client::Frame::Data(ERROR, fin, bytes) => {
                self.status.extend_from_slice(&bytes);
                self.status_done |= fin;
            }
            test_client::Frame::RstStream(EXTRA, _) => self.extra_reset = true,
            _ => {}
        }
    }
}

/// Starts an exec of `sh` (stdout and stderr, no stdin) whose session's other end is returned,
/// as the runner's, and opens the client's streams.
async fn start() -> (Client, tokio::io::DuplexStream) {
    let (mut client, conn) = test_client::connect();
    // One byte in flight: a write returns only once the node has read all but the last byte.
    let (node_end, runner_end) = tokio::io::duplex(1);
    let open: Opening<SessionIo> = Box::pin(async move { Ok(Box::new(node_end) as SessionIo) });
    let options = ExecOptions {
        command: vec!["sh".into()],
        stdin: false,
        stdout: true,
        stderr: true,
        tty: false,
    };
    tokio::spawn(serve_exec(conn, open, options));
    for (id, kind) in [(ERROR, "error"), (STDOUT, "stdout"), (STDERR, "stderr")] {
        client.open(id, &[("streamtype", kind)]).await;
    }
    (client, runner_end)
}

/// The workload writes bytes that look like an `Exit` frame; the runner's frame carrying them
/// is cut at a different place each time, and the client opens another stream (which the node
/// resets) while the node holds the first part. Every byte and the real exit code arrive.
#[tokio::test]
async fn an_exec_survives_a_stream_opened_mid_output_with_no_byte_lost() {
    let lookalike = wire(&[Frame::Exit(ExitStatus {
        exit_code: Some(0),
        error: None,
    })]);
    let output = [&b"before "[..], &lookalike, b" after\n"].concat();
    let cut_frame = wire(&[Frame::Stdout(output.clone())]);
    let rest = wire(&[
        Frame::Stderr(b"err\n".to_vec()),
        Frame::Exit(ExitStatus {
            exit_code: Some(3),
            error: None,
        }),
    ]);
    for round in 0..100 {
        let (mut client, mut runner) = start().await;
        runner
            .write_all(&wire(&[Frame::Stdout(b"first\n".to_vec())]))
            .await
            .expect("write");
        let cut = 1 + round % (cut_frame.len() - 1);
        runner.write_all(&cut_frame[..cut]).await.expect("write");
        client
            .send(syn_stream(EXTRA, &[("streamtype", "extra")]))
            .await;
        let mut received = Received::default();
        while !received.extra_reset {
            received.take(&mut client).await;
        }
        // A node that lost its place may stop reading: the rest is written aside.
        let tail = [&cut_frame[cut..], &rest].concat();
        let writing = tokio::spawn(async move { runner.write_all(&tail).await });
        while !received.status_done {
            received.take(&mut client).await;
        }
        writing.abort();
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        let expected = [&b"first\n"[..], &output].concat();
        let status = text(&received.status);
        let context = format!("round {round}, cut at {cut}, status {status}");
        assert_eq!(text(&received.stdout), text(&expected), "{context}");
        assert_eq!(text(&received.stderr), "err\n", "{context}");
        let status: serde_json::Value = serde_json::from_str(&status).expect("a status");
        assert_eq!(
            (
                status["reason"].as_str(),
                status["details"]["causes"][0]["message"].as_str()
            ),
            (Some("NonZeroExitCode"), Some("3")),
            "{context}"
        );
    }
}
