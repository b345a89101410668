use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use neocloud_protocol::session::{Frame, split_frames};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

use super::*;

fn target(port: u16) -> EgressTarget {
    EgressTarget {
        service: "registry".into(),
        namespace: "ml".into(),
        port,
    }
}

/// A free loopback port (bound and released).
async fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// The connections the fake callback opened: the index asked for and the node's end.
type Opened = mpsc::UnboundedReceiver<(usize, DuplexStream)>;

/// A fake callback: each open hands the node's end of a pipe, with the index asked for, to
/// the test.
fn fake_node() -> (
    impl Fn(usize) -> std::future::Ready<Result<DuplexStream, String>> + Clone + Send + Sync,
    Opened,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let tx = Arc::new(tx);
    let open = move |index| {
        let (node, runner) = tokio::io::duplex(1 << 16);
        let _ = tx.send((index, node));
        std::future::ready(Ok(runner))
    };
    (open, rx)
}

#[tokio::test]
async fn a_loopback_connection_is_carried_to_the_node_both_ways() {
    let port = free_port().await;
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let bound = bind(&[target(taken_port), target(port)]).await;
    // The taken port is not served (and said so); the other is.
    assert_eq!(bound.iter().map(|b| b.index).collect::<Vec<_>>(), [1]);
    let (open, mut opened) = fake_node();
    let serving = tokio::spawn(serve(bound, open));
    let mut app = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    app.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let (index, node) = tokio::time::timeout(Duration::from_secs(5), opened.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(index, 1);
    let (mut from_runner, mut to_runner) = split_frames(node);
    let frame = from_runner.next().await.unwrap().unwrap();
    assert_eq!(frame, Frame::Data(b"GET / HTTP/1.0\r\n\r\n".to_vec()));
    to_runner
        .send(Frame::Data(b"HTTP/1.0 200 OK\r\n\r\nhi".to_vec()))
        .await
        .unwrap();
    to_runner.send(Frame::DataEnd).await.unwrap();
    let mut got = String::new();
    app.read_to_string(&mut got).await.unwrap();
    assert_eq!(got, "HTTP/1.0 200 OK\r\n\r\nhi");
    serving.abort();
}

#[tokio::test]
async fn an_error_from_the_node_closes_the_workloads_connection() {
    let port = free_port().await;
    let (open, mut opened) = fake_node();
    let serving = tokio::spawn(serve(bind(&[target(port)]).await, open));
    let mut app = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (_, node) = opened.recv().await.unwrap();
    let (_, mut to_runner) = split_frames(node);
    to_runner
        .send(Frame::Error("connection refused".into()))
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), app.read_to_end(&mut got));
    let _ = read.await.expect("the connection is closed");
    assert!(got.is_empty(), "{got:?}");
    serving.abort();
}

#[test]
fn hosts_entries_are_appended_once_and_an_unwritable_file_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    let names: Vec<String> = target(80).host_names().into();
    write_hosts(&hosts, &names).unwrap();
    write_hosts(&hosts, &names).unwrap();
    let text = std::fs::read_to_string(&hosts).unwrap();
    assert_eq!(
        text,
        "127.0.0.1 localhost\n127.0.0.1 registry.ml.svc.cluster.local registry.ml.svc \
         registry.ml # neocloud egress\n"
    );
    let missing = dir.path().join("no/such/hosts");
    let err = write_hosts(&missing, &names).unwrap_err();
    assert!(
        err.contains("the destinations' cluster names do not resolve"),
        "{err}"
    );
}
