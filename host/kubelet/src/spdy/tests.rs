//! A small client built from the frame codec ([`super::test_client`]) drives a [`Connection`]
//! over an in-memory pipe.

use bytes::{Bytes, BytesMut};
use flate2::{Compress, Compression, FlushCompress};
use tokio::io::AsyncWriteExt;

use super::frame::{self, Deflater, Frame, Inflater, status};
use super::test_client::{connect, connect_with};
use super::*;

fn data(stream: u32, fin: bool, data: &'static [u8]) -> Option<Frame> {
    Some(Frame::Data(stream, fin, Bytes::from_static(data)))
}

#[tokio::test]
async fn opened_streams_are_answered_and_keep_their_headers_by_lowercase_name() {
    let (mut client, mut conn) = connect();
    client
        .open(
            1,
            &[
                ("StreamType", "error"),
                ("port", "8080"),
                ("x-multi", "a\0b"),
            ],
        )
        .await;
    client.open(3, &[("streamtype", "data")]).await;
    let first = conn.accept().await.unwrap();
    assert_eq!(first.id(), 1);
    assert_eq!(first.header("streamtype"), Some("error"));
    assert_eq!(first.header("STREAMTYPE"), Some("error"));
    assert_eq!(first.header("port"), Some("8080"));
    assert_eq!(first.header("x-multi"), Some("a"));
    assert_eq!(first.header("requestid"), None);
    assert_eq!(
        conn.accept().await.unwrap().header("streamtype"),
        Some("data")
    );
}

#[tokio::test]
async fn data_flows_both_ways_and_fin_half_closes_each_side() {
    let (mut client, mut conn) = connect();
    client.open(1, &[]).await;
    let (mut reader, writer) = conn.accept().await.unwrap().split();
    client.data(1, false, b"ls\n").await;
    client.data(1, true, b"").await;
    assert_eq!(reader.read().await.as_deref(), Some(&b"ls\n"[..]));
    assert_eq!(reader.read().await, None);
    writer.write(b"file\n").await.unwrap();
    writer.finish().await.unwrap();
    writer.finish().await.unwrap();
    assert_eq!(client.next().await, data(1, false, b"file\n"));
    assert_eq!(client.next().await, data(1, true, b""));
    assert!(writer.write(b"late").await.is_err());
}

#[tokio::test]
async fn large_writes_are_split_into_16_kib_frames() {
    let (mut client, mut conn) = connect();
    client.open(1, &[]).await;
    let (_reader, writer) = conn.accept().await.unwrap().split();
    writer.write(&vec![7; 40 * 1024]).await.unwrap();
    let mut sizes = Vec::new();
    for _ in 0..3 {
        let Some(Frame::Data(_, _, data)) = client.next().await else {
            panic!("not data")
        };
        sizes.push(data.len());
    }
    assert_eq!(sizes, [16 * 1024, 16 * 1024, 8 * 1024]);
}

#[tokio::test]
async fn client_pings_are_echoed_and_flow_control_frames_are_ignored() {
    let (mut client, _conn) = connect();
    let mut raw = Vec::new();
    frame::control(&mut raw, 4, 0, &[0, 0, 0, 1, 0, 0, 0, 7, 0, 1, 0, 0]); // SETTINGS window
    frame::control(&mut raw, 0x77, 0, b"unknown"); // unknown control type
    client.io.write_all(&raw).await.unwrap();
    client.send(Frame::WindowUpdate(1, 1000)).await;
    client.send(Frame::Settings).await;
    client.send(Frame::Ping(1)).await;
    client.send(Frame::Ping(2)).await; // would answer our ping: not echoed
    client.send(Frame::Ping(3)).await;
    assert_eq!(client.next().await, Some(Frame::Ping(1)));
    assert_eq!(client.next().await, Some(Frame::Ping(3)));
}

#[tokio::test]
async fn a_client_reset_ends_the_read_and_fails_writes() {
    let (mut client, mut conn) = connect();
    client.open(1, &[]).await;
    let (mut reader, writer) = conn.accept().await.unwrap().split();
    client.send(Frame::RstStream(1, status::CANCEL)).await;
    assert_eq!(reader.read().await, None);
    assert!(writer.write(b"x").await.is_err());
}

#[tokio::test]
async fn our_reset_sends_cancel_and_wakes_the_reader() {
    let (mut client, mut conn) = connect();
    client.open(1, &[]).await;
    let (mut reader, writer) = conn.accept().await.unwrap().split();
    let read = tokio::spawn(async move { reader.read().await });
    tokio::task::yield_now().await;
    writer.reset().await;
    writer.reset().await;
    assert_eq!(read.await.unwrap(), None);
    assert_eq!(
        client.next().await,
        Some(Frame::RstStream(1, status::CANCEL))
    );
}

#[tokio::test]
async fn interleaved_streams_do_not_mix_and_a_dropped_reader_blocks_nobody() {
    let (mut client, mut conn) = connect();
    for id in [1, 3, 5] {
        client.open(id, &[]).await;
    }
    let (mut one, w1) = conn.accept().await.unwrap().split();
    drop(conn.accept().await.unwrap()); // stream 3: nobody reads
    let (mut five, w5) = conn.accept().await.unwrap().split();
    for _ in 0..3 * STREAM_QUEUE {
        client.data(3, false, b"ignored").await;
    }
    client.data(5, false, b"five").await;
    client.data(1, false, b"one").await;
    client.data(5, true, b"!").await;
    assert_eq!(five.read().await.as_deref(), Some(&b"five"[..]));
    assert_eq!(five.read().await.as_deref(), Some(&b"!"[..]));
    assert_eq!(five.read().await, None);
    assert_eq!(one.read().await.as_deref(), Some(&b"one"[..]));
    let (a, b) = tokio::join!(w1.write(b"to one"), w5.write(b"to five"));
    a.unwrap();
    b.unwrap();
    let mut got = [client.next().await, client.next().await];
    got.sort_by_key(|f| format!("{f:?}"));
    assert_eq!(got, [data(1, false, b"to one"), data(5, false, b"to five")]);
}

#[tokio::test]
async fn even_and_reused_stream_ids_are_refused_with_a_protocol_error() {
    let (mut client, _conn) = connect();
    client.open(5, &[]).await;
    for stream in [2, 3] {
        client.send(Frame::SynStream(stream, false, vec![])).await;
        let reset = Frame::RstStream(stream, status::PROTOCOL_ERROR);
        assert_eq!(client.next().await, Some(reset));
    }
}

#[tokio::test]
async fn garbage_ends_the_connection_with_a_protocol_error_goaway() {
    let (mut client, mut conn) = connect();
    client.open(1, &[]).await;
    let (mut reader, _writer) = conn.accept().await.unwrap().split();
    let mut raw = Vec::new();
    frame::control(&mut raw, 1, 0, b"\0\0\0\x03\0\0\0\0\0\0not zlib at all");
    client.io.write_all(&raw).await.unwrap();
    let goaway = Frame::GoAway(1, frame::GOAWAY_PROTOCOL_ERROR);
    assert_eq!(client.next().await, Some(goaway));
    assert_eq!(client.next().await, data(1, true, b""));
    assert_eq!(client.next().await, None);
    assert!(conn.accept().await.is_none());
    assert_eq!(reader.read().await, None);
}

#[tokio::test]
async fn an_oversized_control_frame_ends_the_connection() {
    let (mut client, mut conn) = connect();
    client
        .io
        .write_all(&[0x80, 3, 0, 1, 0, 0x20, 0, 0])
        .await
        .unwrap(); // 2 MiB SYN_STREAM
    let goaway = Frame::GoAway(0, frame::GOAWAY_PROTOCOL_ERROR);
    assert_eq!(client.next().await, Some(goaway));
    assert!(conn.accept().await.is_none());
}

#[tokio::test]
async fn client_goaway_ends_accept_but_not_open_streams() {
    let (mut client, mut conn) = connect();
    client.open(1, &[]).await;
    client.send(Frame::GoAway(0, 0)).await;
    client.data(1, false, b"still here").await;
    let (mut reader, _writer) = conn.accept().await.unwrap().split();
    assert!(conn.accept().await.is_none());
    assert_eq!(reader.read().await.as_deref(), Some(&b"still here"[..]));
}

#[tokio::test]
async fn close_sends_goaway_and_finishes_open_streams() {
    let (mut client, mut conn) = connect();
    client.open(1, &[]).await;
    client.open(3, &[]).await;
    let (_r1, w1) = conn.accept().await.unwrap().split();
    let (_r3, w3) = conn.accept().await.unwrap().split();
    w1.write(b"bye").await.unwrap();
    w3.finish().await.unwrap();
    conn.close().await;
    assert_eq!(client.next().await, data(1, false, b"bye"));
    assert_eq!(client.next().await, data(3, true, b""));
    assert_eq!(client.next().await, Some(Frame::GoAway(3, 0)));
    assert_eq!(client.next().await, data(1, true, b""));
    assert_eq!(client.next().await, None);
    assert!(w1.write(b"after").await.is_err());
}

/// SYN_STREAM for stream 1 with `port: 8080`, `streamtype: data`, compressed by C zlib (through
/// Python) with the SPDY/3 dictionary: shows the dictionary and framing match other codecs.
const FOREIGN_SYN_STREAM: [u8; 54] = [
    0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x2e, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x78, 0xf9, 0xe3, 0xc6, 0xa7, 0xc2, 0x02, 0xe5, 0x0e, 0x48, 0xf9, 0x5b, 0x04, 0x4e,
    0xea, 0x16, 0x06, 0x16, 0x06, 0xe0, 0x74, 0x57, 0x52, 0x94, 0x9a, 0x98, 0x8b, 0x54, 0xb4, 0x24,
    0x02, 0x00, 0x00, 0x00, 0xff, 0xff,
];

#[test]
fn the_dictionary_is_the_spdy3_one() {
    // 0xe3c6a7c2 is the dictionary id in every SPDY/3 zlib header (bytes 2..6 after 0x78 0xf9).
    let mut c = Compress::new(Compression::default(), true);
    assert_eq!(c.set_dictionary(frame::dictionary()).unwrap(), 0xe3c6_a7c2);
    assert_eq!(frame::dictionary().len(), 1423);
}

#[test]
fn a_syn_stream_from_c_zlib_decodes() {
    let mut buf = BytesMut::from(&FOREIGN_SYN_STREAM[..]);
    let frame = frame::decode(&mut buf, &mut Inflater::default()).unwrap();
    let headers = vec![
        ("port".into(), "8080".into()),
        ("streamtype".into(), "data".into()),
    ];
    assert_eq!(frame, Some(Frame::SynStream(1, false, headers)));
}

#[test]
fn a_hand_built_block_from_a_separate_compressor_decodes_in_sequence() {
    let mut deflate = Compress::new(Compression::best(), true);
    deflate.set_dictionary(frame::dictionary()).unwrap();
    let mut inflater = Inflater::default();
    for value in ["1", "2"] {
        let block = [
            &[0, 0, 0, 1, 0, 0, 0, 9][..],
            b"requestid",
            &[0, 0, 0, 1],
            value.as_bytes(),
        ];
        let mut compressed = Vec::with_capacity(256);
        deflate
            .compress_vec(&block.concat(), &mut compressed, FlushCompress::Sync)
            .unwrap();
        let headers = inflater.headers(&compressed).unwrap();
        assert_eq!(headers, vec![("requestid".to_owned(), value.to_owned())]);
    }
}

#[test]
fn header_blocks_that_lie_about_their_counts_are_errors() {
    let mut deflater = Deflater::default();
    let mut inflater = Inflater::default();
    for block in [
        &[0, 0, 0, 9][..],
        &[0, 0, 0, 1, 0, 0, 0, 200, b'a', 0, 0, 0, 0],
    ] {
        let mut compressed = Vec::new();
        deflater.compress(block, &mut compressed).unwrap();
        assert!(inflater.headers(&compressed).is_err());
    }
}

#[tokio::test]
async fn streams_past_the_cap_are_refused_and_a_reset_from_either_side_frees_a_place() {
    let limits = Limits {
        max_streams: 3,
        ..Limits::default()
    };
    let (mut client, mut conn) = connect_with(limits, 1 << 20);
    for id in [1, 3, 5] {
        client.open(id, &[]).await;
    }
    let held: Vec<Stream> = vec![
        conn.accept().await.unwrap(),
        conn.accept().await.unwrap(),
        conn.accept().await.unwrap(),
    ];
    client.send(Frame::SynStream(7, false, vec![])).await;
    let refused = Frame::RstStream(7, status::REFUSED_STREAM);
    assert_eq!(client.next().await, Some(refused));
    // Our reset of stream 1 frees its place.
    let mut held = held.into_iter();
    let (_, one) = held.next().unwrap().split();
    one.reset().await;
    assert_eq!(
        client.next().await,
        Some(Frame::RstStream(1, status::CANCEL))
    );
    client.open(9, &[]).await;
    assert_eq!(conn.accept().await.unwrap().id(), 9);
    // So does the client's reset of stream 3, and both sides' FIN of stream 5.
    client.send(Frame::RstStream(3, status::CANCEL)).await;
    let (_, five) = held.nth(1).unwrap().split();
    client.data(5, true, b"").await;
    five.finish().await.unwrap();
    assert_eq!(client.next().await, data(5, true, b""));
    client.open(11, &[]).await;
    client.open(13, &[]).await;
    client.send(Frame::SynStream(15, false, vec![])).await;
    let refused = Frame::RstStream(15, status::REFUSED_STREAM);
    assert_eq!(client.next().await, Some(refused));
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_after_the_idle_timeout_and_a_busy_one_is_not() {
    let limits = Limits {
        idle_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let (mut client, mut conn) = connect_with(limits, 1 << 20);
    client.open(1, &[]).await;
    let (mut reader, _writer) = conn.accept().await.unwrap().split();
    // Busy: a ping every 20 s for five minutes.
    for ping in 0..15u32 {
        tokio::time::sleep(Duration::from_secs(20)).await;
        client.send(Frame::Ping(2 * ping + 1)).await;
        assert_eq!(client.next().await, Some(Frame::Ping(2 * ping + 1)));
    }
    // Then silent: GOAWAY, our FIN, and the end, within the timeout and a little.
    let ended = tokio::time::timeout(Duration::from_secs(70), async {
        let mut frames = Vec::new();
        while let Some(frame) = client.next_unbounded().await {
            frames.push(frame);
        }
        frames
    });
    let frames = ended.await.expect("the idle connection was closed");
    assert_eq!(
        frames,
        [
            Frame::GoAway(1, frame::GOAWAY_OK),
            Frame::Data(1, true, Bytes::new())
        ]
    );
    assert_eq!(reader.read().await, None);
    assert!(conn.accept().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn close_gives_up_on_a_client_that_reads_nothing() {
    let (mut client, mut conn) = connect_with(Limits::default(), 4096);
    client.open(1, &[]).await;
    let (_reader, writer) = conn.accept().await.unwrap().split();
    // Fills the pipe and the queue: the client never reads again.
    let filler = tokio::spawn(async move {
        loop {
            if writer.write(&[0; 16 * 1024]).await.is_err() {
                return;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::time::timeout(Duration::from_secs(60), conn.close())
        .await
        .expect("close returns within its timeout although the client reads nothing");
    tokio::time::timeout(Duration::from_secs(60), filler)
        .await
        .expect("writes fail once the connection is closed")
        .unwrap();
}

/// A header block of one pair: `name` and `value`, compressed with the SPDY dictionary.
fn block(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut raw = vec![0, 0, 0, 1];
    raw.extend_from_slice(&(name.len() as u32).to_be_bytes());
    raw.extend_from_slice(name);
    raw.extend_from_slice(&(value.len() as u32).to_be_bytes());
    raw.extend_from_slice(value);
    let mut compressed = Vec::new();
    Deflater::default().compress(&raw, &mut compressed).unwrap();
    compressed
}

#[test]
fn header_blocks_past_their_bounds_once_split_or_inflated_are_errors() {
    // 300 NULs: 301 pairs of a 1-byte name, over the pair bound, from a tiny block.
    let split = Inflater::default().headers(&block(b"a", &[0; 300]));
    assert!(
        split.unwrap_err().to_string().contains("pairs"),
        "pairs past the bound"
    );
    // 200 pieces of a 1 KiB name: 200 KiB stored from 1 KiB inflated.
    let copies = Inflater::default().headers(&block(&[b'n'; 1024], &[0; 199]));
    assert!(
        copies.unwrap_err().to_string().contains("bytes"),
        "stored bytes past the bound"
    );
    // A 48 KiB name and 48 KiB of NULs inflate past 64 KiB.
    let inflated = Inflater::default().headers(&block(&[b'n'; 48 * 1024], &[0; 48 * 1024]));
    assert!(
        inflated
            .unwrap_err()
            .to_string()
            .contains("inflates to over")
    );
    // Within the bounds: 255 pairs.
    let fine = Inflater::default()
        .headers(&block(b"x", &[0; 254]))
        .unwrap();
    assert_eq!(fine.len(), 255);
}
