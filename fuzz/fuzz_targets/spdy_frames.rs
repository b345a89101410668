//! The kubelet API's SPDY/3 frame codec (`neocloud_kubelet::spdy::frame`), as a hostile
//! client reaches it through the API server with `pods/exec`: frames off the wire, their zlib
//! header blocks, and the name/value blocks inside.
//!
//! The first byte picks the shape: 0 wire bytes decoded whole and again fed in pieces of the
//! second byte's size (one zlib context per connection, as the server keeps it); 1 an
//! uncompressed name/value block, compressed with the SPDY dictionary and inflated; 2 raw bytes
//! given to the inflater as a compressed header block.
//!
//! Properties: no panic and bounded memory (libFuzzer's `-rss_limit_mb`); feeding the same
//! bytes in pieces decodes the same frames with the same outcome; every decoded header block
//! is within the bounds (pairs, stored bytes, lowercase non-empty names) and a DATA frame within
//! its length; a decoded frame encodes and decodes back to itself; an uncompressed block is
//! accepted exactly when an independent reading of the format says it is well formed and
//! within the bounds.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use neocloud_kubelet::spdy::frame::{
    self, Deflater, Frame, Headers, Inflater, MAX_CONTROL_LEN, MAX_DATA_FRAME, MAX_HEADER_BLOCK,
    MAX_HEADER_BYTES, MAX_HEADER_PAIRS,
};

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    match kind {
        0 => wire(rest),
        1 => block(rest),
        _ => zlib(rest),
    }
});

/// Decodes `bytes` fed `piece` bytes at a time: the frames, and whether decoding failed.
fn decode(bytes: &[u8], piece: usize) -> (Vec<Frame>, bool) {
    let (mut buf, mut inflater, mut frames) = (BytesMut::new(), Inflater::default(), Vec::new());
    for chunk in bytes.chunks(piece.max(1)) {
        buf.extend_from_slice(chunk);
        loop {
            match frame::decode(&mut buf, &mut inflater) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
        }
    }
    (frames, false)
}

fn wire(data: &[u8]) {
    let Some((&piece, bytes)) = data.split_first() else {
        return;
    };
    let (frames, failed) = decode(bytes, bytes.len());
    let (pieces, pieces_failed) = decode(bytes, usize::from(piece));
    assert_eq!(frames, pieces, "decoding depends on how the bytes arrive");
    assert_eq!(failed, pieces_failed);
    for frame in &frames {
        check(frame);
        roundtrip(frame);
    }
}

/// The bounds every decoded frame keeps.
fn check(frame: &Frame) {
    match frame {
        Frame::SynStream(_, _, h) | Frame::SynReply(_, _, h) | Frame::Headers(_, _, h) => {
            assert!(h.len() <= MAX_HEADER_PAIRS, "{} pairs", h.len());
            let stored: usize = h.iter().map(|(n, v)| n.len() + v.len()).sum();
            assert!(stored <= MAX_HEADER_BYTES, "{stored} bytes of headers");
            for (name, _) in h {
                assert!(!name.is_empty(), "an empty header name");
                assert_eq!(
                    *name,
                    name.to_ascii_lowercase(),
                    "a header name not lowercased"
                );
            }
        }
        Frame::Data(_, _, payload) => assert!(payload.len() <= MAX_DATA_FRAME),
        _ => {}
    }
}

/// A frame encodes and decodes back to itself, when its encoding is within the bounds.
fn roundtrip(frame: &Frame) {
    let headers: Option<&Headers> = match frame {
        Frame::SynStream(_, _, h) | Frame::SynReply(_, _, h) | Frame::Headers(_, _, h) => Some(h),
        _ => None,
    };
    if let Some(h) = headers {
        let raw: usize = 4 + h.iter().map(|(n, v)| 8 + n.len() + v.len()).sum::<usize>();
        let nul_free = h.iter().all(|(_, v)| !v.contains('\0'));
        if raw > MAX_HEADER_BLOCK || !nul_free {
            return;
        }
    }
    let mut out = Vec::new();
    frame
        .encode(&mut out, &mut Deflater::default())
        .expect("a decoded frame encodes");
    if out.len() > MAX_CONTROL_LEN {
        return;
    }
    let mut buf = BytesMut::from(&out[..]);
    let back = frame::decode(&mut buf, &mut Inflater::default()).expect("it decodes");
    assert_eq!(
        back.as_ref(),
        Some(frame),
        "a frame changed through its encoding"
    );
    assert!(buf.is_empty(), "bytes left after one frame");
}

/// What an independent reading of an uncompressed block says: `Some((pairs, stored bytes))`
/// once split on NUL (text bytes), or `None` when it is malformed.
fn oracle(mut b: &[u8]) -> Option<(usize, usize)> {
    let take = |b: &mut &[u8]| -> Option<Vec<u8>> {
        let len = u32::from_be_bytes(b.get(..4)?.try_into().ok()?) as usize;
        let field = b.get(4..4 + len)?.to_vec();
        *b = &b[4 + len..];
        Some(field)
    };
    let count = u32::from_be_bytes(b.get(..4)?.try_into().ok()?) as usize;
    b = &b[4..];
    if count > b.len() / 8 {
        return None;
    }
    let (mut pairs, mut stored) = (0, 0);
    for _ in 0..count {
        let name = take(&mut b)?;
        let value = take(&mut b)?;
        if name.is_empty() {
            return None;
        }
        let pieces = value.iter().filter(|c| **c == 0).count() + 1;
        pairs += pieces;
        // As text: a byte that is not UTF-8 becomes U+FFFD, three bytes.
        let text = |b: &[u8]| String::from_utf8_lossy(b).len();
        stored += pieces * text(&name) + value.split(|c| *c == 0).map(text).sum::<usize>();
    }
    Some((pairs, stored))
}

fn block(raw: &[u8]) {
    let mut compressed = Vec::new();
    Deflater::default()
        .compress(raw, &mut compressed)
        .expect("compresses");
    let parsed = Inflater::default().headers(&compressed);
    let within =
        |(pairs, stored): (usize, usize)| pairs <= MAX_HEADER_PAIRS && stored <= MAX_HEADER_BYTES;
    let expected = raw.len() <= MAX_HEADER_BLOCK && oracle(raw).is_some_and(within);
    assert_eq!(
        parsed.is_ok(),
        expected,
        "{parsed:?} for a block of {} bytes",
        raw.len()
    );
    if let (Ok(headers), Some((pairs, _))) = (&parsed, oracle(raw)) {
        assert_eq!(headers.len(), pairs);
        check(&Frame::Headers(1, false, headers.clone()));
    }
}

fn zlib(compressed: &[u8]) {
    let mut inflater = Inflater::default();
    // Twice on one context, as a connection's second header block.
    for _ in 0..2 {
        if let Ok(headers) = inflater.headers(compressed) {
            check(&Frame::Headers(1, false, headers));
        }
    }
}
