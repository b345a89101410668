//! The runner callback's wire format (`neocloud_protocol::wire`): every JSON body the node's
//! callback server decodes or the runner reads, and the NDJSON log stream of `POST /v1/logs`
//! split into lines and appended to a `LogBuffer` as the server does.
//!
//! The first byte picks the shape: 0..=7 one body (Workload, TokenRequest, ReauthRequest,
//! Heartbeat, TokenResponse, StatusReport, LogRecord, ErrorBody); anything else, an NDJSON stream.
//!
//! Properties: no panic; whatever decodes re-encodes, and that encoding decodes to a value that
//! encodes the same (decode, encode, decode, encode is stable); `Debug` of a body that carries a
//! secret does not depend on the secret; the log buffer keeps every accepted line in order,
//! within its line limit, with increasing sequence numbers.
#![no_main]

use chrono::{DateTime, Utc};
use libfuzzer_sys::fuzz_target;
use neocloud_protocol::wire::{
    ErrorBody, Heartbeat, LogRecord, ReauthRequest, StatusReport, TokenRequest, TokenResponse,
    Workload,
};
use neocloud_remote::callback::{LogBuffer, LogLimits};
use serde::Serialize;
use serde::de::DeserializeOwned;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind {
        0 => workload(body),
        1 => secret::<TokenRequest>(body, |t| t.bootstrap_token.clear()),
        2 => secret::<ReauthRequest>(body, |t| t.credential.clear()),
        3 => drop(roundtrip::<Heartbeat>(body)),
        4 => secret::<TokenResponse>(body, |t| t.session_token.clear()),
        5 => drop(roundtrip::<StatusReport>(body)),
        6 => log_record(body),
        7 => drop(roundtrip::<ErrorBody>(body)),
        _ => ndjson(body),
    }
});

/// Decodes `T`, checks encode/decode is stable, and returns the value.
fn roundtrip<T: Serialize + DeserializeOwned>(body: &[u8]) -> Option<T> {
    let value: T = serde_json::from_slice(body).ok()?;
    let once = serde_json::to_string(&value).expect("a decoded body encodes");
    let back: T = serde_json::from_str(&once).expect("an encoded body decodes");
    let twice = serde_json::to_string(&back).expect("it encodes again");
    assert_eq!(once, twice, "encoding is not stable");
    Some(back)
}

fn secret<T>(body: &[u8], blank: impl Fn(&mut T))
where
    T: Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    if let Some(value) = roundtrip::<T>(body) {
        let mut blanked = value.clone();
        blank(&mut blanked);
        assert_eq!(
            format!("{value:?}"),
            format!("{blanked:?}"),
            "Debug shows a secret"
        );
    }
}

fn workload(body: &[u8]) {
    let Some(w) = roundtrip::<Workload>(body) else {
        return;
    };
    let again: Workload = serde_json::from_slice(body).expect("decodes as before");
    assert_eq!(w, again, "a workload changes through JSON");
    let mut blanked = w.clone();
    blanked.env.iter_mut().for_each(|e| e.value.clear());
    assert_eq!(
        format!("{w:?}"),
        format!("{blanked:?}"),
        "Debug shows an env value"
    );
}

fn log_record(body: &[u8]) {
    if let Some(r) = roundtrip::<LogRecord>(body) {
        let again: LogRecord = serde_json::from_slice(body).expect("decodes as before");
        assert_eq!(r, again, "a log record changes through JSON");
    }
}

/// The server's `/v1/logs` handling: split on `\n`, skip blank lines, decode each record.
fn ndjson(body: &[u8]) {
    let limits = LogLimits {
        max_bytes: 4096,
        max_lines: 8,
    };
    let buffer = LogBuffer::new(limits);
    let mut accepted: Vec<(DateTime<Utc>, String)> = Vec::new();
    for line in body.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(record) = serde_json::from_slice::<LogRecord>(line) else {
            break;
        };
        accepted.push((record.ts, record.line.clone()));
        buffer.append(record);
    }
    let kept = buffer.lines();
    assert!(kept.len() <= limits.max_lines, "{} lines kept", kept.len());
    assert!(kept.len() <= accepted.len());
    assert!(
        kept.windows(2).all(|w| w[0].seq < w[1].seq),
        "sequence out of order"
    );
    let tail = &accepted[accepted.len() - kept.len()..];
    for (line, (ts, text)) in kept.iter().zip(tail) {
        assert_eq!((&line.ts, &line.line), (ts, text), "a kept line changed");
    }
    if !accepted.is_empty() {
        assert!(!kept.is_empty(), "the newest line was dropped");
    }
}
