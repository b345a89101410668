//! SPDY/3 frames as bytes, and the zlib contexts of their header blocks (SPDY/3 draft, sections
//! 2.2 to 2.6). Pure: no IO and no stream state; the connection decides what a frame means.
//! Both directions are here so that the tests' client speaks through the same codec. Public only
//! for the fuzz target and the memory tests (`#[doc(hidden)]`).
//!
//! Every size a client controls is bounded here, before anything is allocated for it: a control
//! frame's length ([`MAX_CONTROL_LEN`]), a DATA frame's ([`MAX_DATA_FRAME`]), a header block's
//! inflated size ([`MAX_HEADER_BLOCK`]), and what a header block becomes once parsed: the bytes
//! of names and values as they are stored ([`MAX_HEADER_BYTES`], counted after NUL-separated
//! values are split into pairs that each copy the name) and the number of pairs
//! ([`MAX_HEADER_PAIRS`]). A frame past a bound is an error, which ends the connection.

use std::sync::LazyLock;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

const VERSION: u16 = 3;
const FLAG_FIN: u8 = 0x01;
const STREAM_ID_MASK: u32 = 0x7fff_ffff;
/// Control frames carry ids and header blocks; kubectl's are a few dozen bytes.
pub const MAX_CONTROL_LEN: usize = 64 * 1024;
/// The most a header block may inflate to.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// The most bytes of names and values one parsed header block may hold, counting each pair a
/// NUL-separated value becomes with its own copy of the name.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// The most pairs one parsed header block may hold (kubectl sends three or four).
pub const MAX_HEADER_PAIRS: usize = 256;
/// The longest DATA frame accepted from a client: the whole frame is buffered before it is
/// handed on, so this bounds the connection's read buffer. Go clients (kubectl) write at most
/// 32 KiB per frame.
pub const MAX_DATA_FRAME: usize = 1 << 20;
/// DATA frames have a 24-bit length.
const MAX_DATA_LEN: usize = (1 << 24) - 1;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// GOAWAY status codes.
pub const GOAWAY_OK: u32 = 0;
/// GOAWAY: the client broke the protocol (or a bound).
pub const GOAWAY_PROTOCOL_ERROR: u32 = 1;

/// RST_STREAM status codes.
pub mod status {
    /// The stream broke the protocol.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// The stream was not opened (too many streams, or the connection is going away).
    pub const REFUSED_STREAM: u32 = 3;
    /// The stream is no longer wanted.
    pub const CANCEL: u32 = 5;
}

/// Why bytes are not SPDY/3.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("spdy control frame of {0} bytes is over the {MAX_CONTROL_LEN}-byte limit")]
    TooLong(usize),
    #[error("spdy data frame of {0} bytes is over the {MAX_DATA_FRAME}-byte limit")]
    DataFrameTooLong(usize),
    #[error("unsupported spdy version {0}")]
    Version(u16),
    #[error("spdy control frame of type {0} is too short")]
    Malformed(u16),
    #[error("spdy data frame of {0} bytes is over the 24-bit length")]
    DataTooLong(usize),
    #[error("malformed spdy header block: {0}")]
    HeaderBlock(String),
}

/// Header names and values, names as sent (the server lowercases what it reads).
pub type Headers = Vec<(String, String)>;

/// One SPDY/3 frame. Unknown control types are kept only by number, to be ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Stream, FIN, payload.
    Data(u32, bool, Bytes),
    /// Stream, FIN, headers; likewise SYN_REPLY and HEADERS.
    SynStream(u32, bool, Headers),
    SynReply(u32, bool, Headers),
    Headers(u32, bool, Headers),
    /// Stream, status.
    RstStream(u32, u32),
    Settings,
    Ping(u32),
    /// Last good stream, status.
    GoAway(u32, u32),
    /// Stream, delta.
    WindowUpdate(u32, u32),
    /// The control frame type.
    Unknown(u16),
}

impl Frame {
    /// Appends the frame to `out`, compressing any header block with `deflater`.
    pub fn encode(&self, out: &mut Vec<u8>, deflater: &mut Deflater) -> Result<(), FrameError> {
        let (kind, fin, words, headers) = match self {
            Frame::Data(stream, fin, data) => return encode_data(out, *stream, *fin, data),
            Frame::SynStream(s, fin, h) => (SYN_STREAM, *fin, vec![*s, 0], Some(h)),
            Frame::SynReply(s, fin, h) => (SYN_REPLY, *fin, vec![*s], Some(h)),
            Frame::Headers(s, fin, h) => (HEADERS, *fin, vec![*s], Some(h)),
            Frame::RstStream(s, status) => (RST_STREAM, false, vec![*s, *status], None),
            Frame::Settings => (SETTINGS, false, vec![0], None),
            Frame::Ping(id) => (PING, false, vec![*id], None),
            Frame::GoAway(last, status) => (GOAWAY, false, vec![*last, *status], None),
            Frame::WindowUpdate(s, delta) => (WINDOW_UPDATE, false, vec![*s, *delta], None),
            Frame::Unknown(kind) => (*kind, false, vec![], None),
        };
        let mut p = Vec::new();
        words.iter().for_each(|word| p.put_u32(*word));
        if kind == SYN_STREAM {
            p.put_u16(0); // priority and credential slot
        }
        if let Some(headers) = headers {
            deflater.compress(&header_block(headers), &mut p)?;
        }
        control(out, kind, flags(fin), &p);
        Ok(())
    }
}

fn encode_data(out: &mut Vec<u8>, stream: u32, fin: bool, data: &[u8]) -> Result<(), FrameError> {
    if data.len() > MAX_DATA_LEN {
        return Err(FrameError::DataTooLong(data.len()));
    }
    out.put_u32(stream & STREAM_ID_MASK);
    out.put_u32(u32::from(flags(fin)) << 24 | data.len() as u32);
    out.extend_from_slice(data);
    Ok(())
}

fn flags(fin: bool) -> u8 {
    if fin { FLAG_FIN } else { 0 }
}

/// Appends a control frame of `kind` with `payload`.
pub fn control(out: &mut Vec<u8>, kind: u16, flags: u8, payload: &[u8]) {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u32(u32::from(flags) << 24 | (payload.len() as u32 & 0x00ff_ffff));
    out.extend_from_slice(payload);
}

/// Takes the next whole frame off `buf`; `Ok(None)` when more bytes are needed.
pub fn decode(buf: &mut BytesMut, inflater: &mut Inflater) -> Result<Option<Frame>, FrameError> {
    if buf.len() < 8 {
        return Ok(None);
    }
    let mut head = &buf[..8];
    let first = head.get_u32();
    let flags = head.get_u8();
    let len = (head.get_u16() as usize) << 8 | head.get_u8() as usize;
    let is_control = first & 0x8000_0000 != 0;
    if is_control && len > MAX_CONTROL_LEN {
        return Err(FrameError::TooLong(len));
    }
    if !is_control && len > MAX_DATA_FRAME {
        return Err(FrameError::DataFrameTooLong(len));
    }
    if buf.len() < 8 + len {
        buf.reserve(8 + len - buf.len());
        return Ok(None);
    }
    buf.advance(8);
    let payload = buf.split_to(len).freeze();
    let fin = flags & FLAG_FIN != 0;
    if !is_control {
        return Ok(Some(Frame::Data(first & STREAM_ID_MASK, fin, payload)));
    }
    let version = (first >> 16) as u16 & 0x7fff;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    parse_control(first as u16, fin, payload, inflater).map(Some)
}

fn parse_control(
    kind: u16,
    fin: bool,
    mut p: Bytes,
    inflater: &mut Inflater,
) -> Result<Frame, FrameError> {
    let min = match kind {
        SYN_STREAM => 10,
        SYN_REPLY | HEADERS | PING => 4,
        RST_STREAM | GOAWAY | WINDOW_UPDATE => 8,
        _ => 0,
    };
    if p.len() < min {
        return Err(FrameError::Malformed(kind));
    }
    Ok(match kind {
        SYN_STREAM => {
            let stream = p.get_u32() & STREAM_ID_MASK;
            p.advance(6);
            Frame::SynStream(stream, fin, inflater.headers(&p)?)
        }
        SYN_REPLY | HEADERS => {
            let stream = p.get_u32() & STREAM_ID_MASK;
            let headers = inflater.headers(&p)?;
            if kind == SYN_REPLY {
                Frame::SynReply(stream, fin, headers)
            } else {
                Frame::Headers(stream, fin, headers)
            }
        }
        RST_STREAM => Frame::RstStream(p.get_u32() & STREAM_ID_MASK, p.get_u32()),
        SETTINGS => Frame::Settings,
        PING => Frame::Ping(p.get_u32()),
        GOAWAY => Frame::GoAway(p.get_u32() & STREAM_ID_MASK, p.get_u32()),
        WINDOW_UPDATE => {
            Frame::WindowUpdate(p.get_u32() & STREAM_ID_MASK, p.get_u32() & STREAM_ID_MASK)
        }
        other => Frame::Unknown(other),
    })
}

/// The uncompressed name/value block: a count, then length-prefixed names and values.
fn header_block(headers: &Headers) -> Vec<u8> {
    let mut block = Vec::new();
    block.put_u32(headers.len() as u32);
    for (name, value) in headers {
        for s in [name, value] {
            block.put_u32(s.len() as u32);
            block.extend_from_slice(s.as_bytes());
        }
    }
    block
}

/// Reads a name/value block; names lowercased, NUL-separated values split into several pairs.
/// The pairs and bytes they will take are counted before anything is copied, and a block past
/// [`MAX_HEADER_PAIRS`] or [`MAX_HEADER_BYTES`] is refused.
fn parse_header_block(mut block: &[u8]) -> Result<Headers, FrameError> {
    let bad = |what: &str| FrameError::HeaderBlock(what.to_owned());
    if block.len() < 4 {
        return Err(bad("no pair count"));
    }
    let count = block.get_u32() as usize;
    if count > block.len() / 8 {
        return Err(bad(&format!("{count} pairs in {} bytes", block.len())));
    }
    let mut headers = Vec::with_capacity(count.min(MAX_HEADER_PAIRS));
    let mut stored = 0usize;
    for _ in 0..count {
        let name = field(&mut block)?;
        let value = field(&mut block)?;
        if name.is_empty() {
            return Err(bad("empty header name"));
        }
        let pieces = value.iter().filter(|b| **b == 0).count() + 1;
        if headers.len() + pieces > MAX_HEADER_PAIRS {
            let pairs = headers.len() + pieces;
            return Err(bad(&format!(
                "{pairs} pairs or more after splitting values on NUL, over {MAX_HEADER_PAIRS}"
            )));
        }
        // Counted as stored: text, where a byte that is not UTF-8 takes three.
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let values: Vec<_> = value
            .split(|b| *b == 0)
            .map(String::from_utf8_lossy)
            .collect();
        stored += pieces * name.len() + values.iter().map(|v| v.len()).sum::<usize>();
        if stored > MAX_HEADER_BYTES {
            return Err(bad(&format!(
                "{stored} bytes or more of names and values, over {MAX_HEADER_BYTES}"
            )));
        }
        headers.extend(values.into_iter().map(|v| (name.clone(), v.into_owned())));
    }
    Ok(headers)
}

/// Takes one length-prefixed name or value off `block`.
fn field<'a>(block: &mut &'a [u8]) -> Result<&'a [u8], FrameError> {
    let truncated = || FrameError::HeaderBlock("truncated pair".to_owned());
    let whole: &'a [u8] = block;
    let Some((len, rest)) = whole.split_first_chunk::<4>() else {
        return Err(truncated());
    };
    let len = u32::from_be_bytes(*len) as usize;
    let bytes = rest.get(..len).ok_or_else(truncated)?;
    *block = &rest[len..];
    Ok(bytes)
}

/// One direction's compression context, kept for the whole connection.
#[derive(Debug)]
pub struct Deflater {
    inner: Compress,
    dictionary_set: bool,
}

impl Default for Deflater {
    fn default() -> Self {
        Deflater {
            inner: Compress::new(Compression::default(), true),
            dictionary_set: false,
        }
    }
}

impl Deflater {
    /// Compresses `block` onto `out`, ending with a sync flush so the peer can inflate it now.
    pub fn compress(&mut self, block: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
        let fail = |e: flate2::CompressError| FrameError::HeaderBlock(e.to_string());
        if !self.dictionary_set {
            self.inner.set_dictionary(dictionary()).map_err(fail)?;
            self.dictionary_set = true;
        }
        let start = self.inner.total_in();
        loop {
            out.reserve(block.len() / 2 + 64);
            let used = (self.inner.total_in() - start) as usize;
            self.inner
                .compress_vec(&block[used..], out, FlushCompress::Sync)
                .map_err(fail)?;
            let used = (self.inner.total_in() - start) as usize;
            if used == block.len() && out.len() < out.capacity() {
                return Ok(());
            }
        }
    }
}

/// The other direction's context: inflates header blocks in the order they arrived.
#[derive(Debug)]
pub struct Inflater(Decompress);

impl Default for Inflater {
    fn default() -> Self {
        Inflater(Decompress::new(true))
    }
}

impl Inflater {
    /// Inflates and parses one header block (empty input is an empty block).
    pub fn headers(&mut self, compressed: &[u8]) -> Result<Headers, FrameError> {
        if compressed.is_empty() {
            return Ok(Vec::new());
        }
        parse_header_block(&self.inflate(compressed)?)
    }

    /// Inflates `input`, which must end on a sync flush; refuses output past
    /// [`MAX_HEADER_BLOCK`], checked before it returns and never holding more than one byte over.
    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, FrameError> {
        let fail = |e: flate2::DecompressError| FrameError::HeaderBlock(e.to_string());
        let start = self.0.total_in();
        let mut out = Vec::with_capacity((input.len() * 4 + 64).min(MAX_HEADER_BLOCK + 1));
        loop {
            let (used, produced) = (self.0.total_in() - start, out.len());
            let mut progressed = false;
            match self
                .0
                .decompress_vec(&input[used as usize..], &mut out, FlushDecompress::Sync)
            {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.0.set_dictionary(dictionary()).map_err(fail)?;
                    progressed = true;
                }
                Err(e) => return Err(fail(e)),
            }
            if out.len() > MAX_HEADER_BLOCK {
                return Err(FrameError::HeaderBlock(format!(
                    "inflates to over {MAX_HEADER_BLOCK} bytes"
                )));
            }
            let now_used = self.0.total_in() - start;
            if now_used as usize == input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if !progressed
                && now_used == used
                && out.len() == produced
                && out.len() < out.capacity()
            {
                return Err(FrameError::HeaderBlock("truncated zlib data".to_owned()));
            }
            // Room for at most one byte past the bound, which the check above refuses.
            let room = out.len().max(256).min(MAX_HEADER_BLOCK + 1 - out.len());
            out.reserve_exact(room);
        }
    }
}

/// The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): length-prefixed
/// words, then a run of raw text.
pub fn dictionary() -> &'static [u8] {
    static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
        let mut d = Vec::with_capacity(1423);
        for word in DICTIONARY_WORDS.split('|') {
            d.put_u32(word.len() as u32);
            d.extend_from_slice(word.as_bytes());
        }
        d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
        d
    });
    &DICTIONARY
}

/// The dictionary's words, `|`-separated.
const DICTIONARY_WORDS: &str = concat!(
    "options|head|post|put|delete|trace|accept|accept-charset|accept-encoding|",
    "accept-language|accept-ranges|age|allow|authorization|cache-control|connection|",
    "content-base|content-encoding|content-language|content-length|content-location|",
    "content-md5|content-range|content-type|date|etag|expect|expires|from|host|if-match|",
    "if-modified-since|if-none-match|if-range|if-unmodified-since|last-modified|location|",
    "max-forwards|pragma|proxy-authenticate|proxy-authorization|range|referer|retry-after|",
    "server|te|trailer|transfer-encoding|upgrade|user-agent|vary|via|warning|",
    "www-authenticate|method|get|status|200 OK|version|HTTP/1.1|url|public|set-cookie|",
    "keep-alive|origin",
);

const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);
