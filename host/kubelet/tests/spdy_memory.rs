//! What a hostile SPDY client costs the node, measured: this test binary counts every heap
//! allocation of its process (`peak_alloc` as the global allocator), and each test checks the
//! peak of the heap while a client sends what would once take gigabytes or grow without end.
//! The tests run one at a time (they share the process's heap).

use bytes::BytesMut;
use neocloud_kubelet::spdy::frame::{self, Deflater, Frame, Inflater, status};
use neocloud_kubelet::spdy::{Connection, Limits, Stream};
use peak_alloc::PeakAlloc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf};

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// One measured test at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: usize = 1024 * 1024;

/// How far the heap's peak rose above where it was when `run` started.
async fn peak_growth<F: std::future::Future<Output = ()>>(run: F) -> usize {
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    run.await;
    HEAP.peak_usage().saturating_sub(before)
}

/// Decodes the server's frames from `io` until EOF.
async fn frames(mut io: ReadHalf<DuplexStream>, mut on: impl FnMut(Frame)) {
    let (mut buf, mut inflater) = (BytesMut::new(), Inflater::default());
    loop {
        while let Some(frame) = frame::decode(&mut buf, &mut inflater).expect("server frame") {
            on(frame);
        }
        if io.read_buf(&mut buf).await.expect("read") == 0 {
            return;
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_header_block_of_nul_separated_values_is_refused_without_taking_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    // One pair: a 16 KiB name and a value of 16 KiB NULs, a few hundred bytes once compressed.
    // Split on NUL with the name copied for every piece, it was 16,385 pairs of 16 KiB: 256 MiB.
    let mut raw = vec![0, 0, 0, 1];
    for part in [vec![b'n'; 16 * 1024], vec![0; 16 * 1024]] {
        raw.extend_from_slice(&(part.len() as u32).to_be_bytes());
        raw.extend_from_slice(&part);
    }
    let mut block = Vec::new();
    Deflater::default().compress(&raw, &mut block).unwrap();
    assert!(block.len() < 1024, "{} bytes compressed", block.len());
    let mut payload = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    payload.extend_from_slice(&block);
    let mut syn_stream = Vec::new();
    frame::control(&mut syn_stream, 1, 0, &payload);

    let (mut got, mut accepted) = (Vec::new(), None);
    let grew = peak_growth(async {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut conn = Connection::new(server);
        let (read, mut write) = tokio::io::split(client);
        write.write_all(&syn_stream).await.unwrap();
        accepted = conn.accept().await.map(|stream| stream.id());
        conn.close().await;
        frames(read, |f| got.push(f)).await;
    })
    .await;
    eprintln!("header block: the heap's peak grew by {} KiB", grew / 1024);
    assert!(grew < 64 * MIB, "the heap grew by {} MiB", grew / MIB);
    assert_eq!(accepted, None, "the stream was accepted");
    assert_eq!(got, [Frame::GoAway(0, frame::GOAWAY_PROTOCOL_ERROR)]);
}

#[tokio::test(flavor = "current_thread")]
async fn forty_thousand_unclosed_streams_are_refused_past_the_cap_in_flat_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    const OPENED: u32 = 40_000;
    let limits = Limits::default();
    let (mut replies, mut refused) = (0usize, 0usize);
    let grew = peak_growth(async {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut conn = Connection::with_limits(server, limits);
        let (read, mut write) = tokio::io::split(client);
        // The handler keeps every stream it is given, as a port-forward keeps a half pair,
        // until the client has gone.
        let handler = async move {
            let mut held: Vec<Stream> = Vec::new();
            while let Some(stream) = conn.accept().await {
                held.push(stream);
            }
            conn.close().await;
            held.len()
        };
        let client = async move {
            let mut deflater = Deflater::default();
            let headers = vec![("streamtype".to_owned(), "data".to_owned())];
            let mut out = Vec::new();
            for n in 0..OPENED {
                let syn = Frame::SynStream(2 * n + 1, false, headers.clone());
                syn.encode(&mut out, &mut deflater).unwrap();
                if out.len() > 32 * 1024 {
                    write.write_all(&out).await.unwrap();
                    out.clear();
                }
            }
            write.write_all(&out).await.unwrap();
            write.shutdown().await.unwrap();
        };
        let counting = frames(read, |f| match f {
            Frame::SynReply(..) => replies += 1,
            Frame::RstStream(_, status::REFUSED_STREAM) => refused += 1,
            _ => {}
        });
        let (held, (), ()) = tokio::join!(handler, client, counting);
        assert_eq!(held, limits.max_streams);
    })
    .await;
    assert_eq!(replies, limits.max_streams);
    assert_eq!(refused, OPENED as usize - limits.max_streams);
    eprintln!(
        "{OPENED} streams: the heap's peak grew by {} KiB",
        grew / 1024
    );
    assert!(grew < 16 * MIB, "the heap grew by {} MiB", grew / MIB);
}
