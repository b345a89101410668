//! A binding's log: a bounded ring of lines a runner appended, and readers with the kubelet's
//! `/containerLogs` options (`follow`, `tailLines`, `limitBytes`, `sinceSeconds`, `timestamps`).
//!
//! Each line gets a sequence number; followers wait on a `watch` of the next number and read
//! what they have not seen, so a slow reader never blocks the writer and never sees a line twice.
//! Lines evicted before a follower reads them are skipped.
//!
//! A workload the runner restarts in place has runs (0, 1, ...; each record names its own): a
//! reader gets the current run's lines, or with `previous` the last run that ended before a
//! restart, as a kubelet keeps the current and the last terminated container's logs. All runs
//! share the one bound. A follower of a run finishes when the run ends or a later one starts.
//!
//! What a runner sends comes in through [`ingest`]: its NDJSON body is split into lines by
//! tokio-util's `LinesCodec`, linear in the body's size and bounded at [`MAX_LOG_RECORD`] bytes
//! a line.
//!
//! Not the HTTP of either side: the callback server appends, the kubelet API (the
//! `neocloud-kubelet` crate) reads.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::io::StreamReader;

use super::{LogRecord, LogStream};

/// How much of a binding's log is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Total bytes of line text kept (oldest lines are dropped first).
    pub max_bytes: usize,
    /// Lines kept.
    pub max_lines: usize,
}

impl Default for LogLimits {
    fn default() -> Self {
        Self {
            max_bytes: 10 * 1024 * 1024,
            max_lines: 100_000,
        }
    }
}

/// The kubelet's `/containerLogs` query options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep streaming new lines until the workload exits.
    pub follow: bool,
    /// Only the last N lines present when reading starts.
    pub tail_lines: Option<usize>,
    /// Stop after this many bytes of output (may cut a line).
    pub limit_bytes: Option<usize>,
    /// Only lines from the last N seconds.
    pub since_seconds: Option<u64>,
    /// Prefix each line with its RFC 3339 time (nanoseconds) and a space.
    pub timestamps: bool,
    /// The last run that ended before a restart in place, not the current one.
    pub previous: bool,
}

/// One stored line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Sequence number within the binding's log.
    pub seq: u64,
    /// When the runner read it.
    pub ts: DateTime<Utc>,
    /// Which stream.
    pub stream: LogStream,
    /// Text without the newline.
    pub line: String,
    /// The run of the workload that wrote it.
    pub run: u32,
}

#[derive(Debug)]
struct Ring {
    lines: VecDeque<LogLine>,
    bytes: usize,
    next_seq: u64,
    closed: bool,
    /// The current run (the latest one a record or report named).
    run: u32,
    /// The current run ended and waits for its restart.
    ended: bool,
}

impl Ring {
    /// The run a reader asks for: the current one, or the last one that ended before a
    /// restart (`None` when no run has).
    fn wanted(&self, previous: bool) -> Option<u32> {
        match (previous, self.ended) {
            (false, _) | (true, true) => Some(self.run),
            (true, false) => self.run.checked_sub(1),
        }
    }

    /// Moves on to run `run` if it is later than the current one.
    fn advance(&mut self, run: u32) {
        if run > self.run {
            self.run = run;
            self.ended = false;
        }
    }
}

/// One binding's bounded log.
#[derive(Debug)]
pub struct LogBuffer {
    limits: LogLimits,
    ring: Mutex<Ring>,
    next: watch::Sender<u64>,
}

impl LogBuffer {
    /// An empty log.
    pub fn new(limits: LogLimits) -> Self {
        let ring = Ring {
            lines: VecDeque::new(),
            bytes: 0,
            next_seq: 0,
            closed: false,
            run: 0,
            ended: false,
        };
        Self {
            limits,
            ring: Mutex::new(ring),
            next: watch::Sender::new(0),
        }
    }

    /// Appends a line, dropping the oldest beyond the limits. Ignored once closed.
    pub fn append(&self, record: LogRecord) {
        let mut ring = self.ring.lock();
        if ring.closed {
            return;
        }
        let seq = ring.next_seq;
        ring.next_seq += 1;
        ring.bytes += record.line.len();
        ring.advance(record.run);
        ring.lines.push_back(LogLine {
            seq,
            ts: record.ts,
            stream: record.stream,
            line: record.line,
            run: record.run,
        });
        while ring.lines.len() > self.limits.max_lines
            || (ring.bytes > self.limits.max_bytes && ring.lines.len() > 1)
        {
            if let Some(old) = ring.lines.pop_front() {
                ring.bytes -= old.line.len();
            }
        }
        self.next.send_replace(ring.next_seq);
    }

    /// Run `run` of the workload started (a restart in place): it is the current run, and the
    /// one before it the previous. Followers of earlier runs finish.
    pub fn start_run(&self, run: u32) {
        let mut ring = self.ring.lock();
        ring.advance(run);
        if ring.run == run {
            ring.ended = false;
        }
        drop(ring);
        self.next.send_modify(|_| {});
    }

    /// Run `run` ended and the workload waits to be restarted: that run is now the previous
    /// one (and still the current one until the restart). Its followers finish.
    pub fn end_run(&self, run: u32) {
        let mut ring = self.ring.lock();
        ring.advance(run);
        if ring.run == run {
            ring.ended = true;
        }
        drop(ring);
        self.next.send_modify(|_| {});
    }

    /// Ends the log: followers finish once they have read everything. Idempotent.
    pub fn close(&self) {
        self.ring.lock().closed = true;
        self.next.send_modify(|_| {});
    }

    /// Every stored line, oldest first.
    pub fn lines(&self) -> Vec<LogLine> {
        self.ring.lock().lines.iter().cloned().collect()
    }

    /// The log as the kubelet would serve it, one chunk per line: the current run's, or the
    /// previous run's with `options.previous` (`None` when there is no previous run). A
    /// previous run has ended, so following it returns what there is.
    pub fn read(self: &Arc<Self>, options: LogOptions) -> Option<BoxStream<'static, Bytes>> {
        let first = self.initial(&options)?;
        let reader = Reader {
            log: self.clone(),
            options: LogOptions {
                follow: options.follow && !options.previous,
                ..options
            },
            wake: self.next.subscribe(),
            after: first.after,
            pending: first.lines.into(),
            budget: options.limit_bytes,
            run: first.run,
        };
        Some(
            futures::stream::unfold(reader, |mut reader| async move {
                let chunk = reader.next_chunk().await?;
                Some((chunk, reader))
            })
            .boxed(),
        )
    }

    fn initial(&self, options: &LogOptions) -> Option<Initial> {
        let ring = self.ring.lock();
        let run = ring.wanted(options.previous)?;
        // A start before the earliest time chrono knows keeps every line.
        let since = options.since_seconds.and_then(|s| {
            let back = chrono::Duration::try_seconds(i64::try_from(s).ok()?)?;
            Utc::now().checked_sub_signed(back)
        });
        let mut lines: Vec<LogLine> = ring
            .lines
            .iter()
            .filter(|l| l.run == run && since.is_none_or(|since| l.ts >= since))
            .cloned()
            .collect();
        if let Some(tail) = options.tail_lines {
            lines.drain(..lines.len().saturating_sub(tail));
        }
        Some(Initial {
            lines,
            after: ring.next_seq,
            run,
        })
    }

    /// Lines of run `run` with `seq >= from`, and whether that run's log is over (the log is
    /// closed, the run ended, or a later one started).
    fn since(&self, from: u64, run: u32) -> (Vec<LogLine>, u64, bool) {
        let ring = self.ring.lock();
        let lines = ring
            .lines
            .iter()
            .filter(|l| l.seq >= from && l.run == run)
            .cloned()
            .collect();
        let over = ring.closed || ring.run > run || ring.ended;
        (lines, ring.next_seq, over)
    }
}

struct Initial {
    lines: Vec<LogLine>,
    after: u64,
    run: u32,
}

struct Reader {
    log: Arc<LogBuffer>,
    options: LogOptions,
    wake: watch::Receiver<u64>,
    /// The first sequence number not yet taken from the ring.
    after: u64,
    pending: VecDeque<LogLine>,
    budget: Option<usize>,
    /// The run read.
    run: u32,
}

impl Reader {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.budget == Some(0) {
            return None;
        }
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(self.render(&line));
            }
            if !self.options.follow {
                return None;
            }
            let (lines, next, over) = self.log.since(self.after, self.run);
            self.after = next;
            if lines.is_empty() {
                if over {
                    return None;
                }
                self.wake.changed().await.ok()?;
                continue;
            }
            self.pending.extend(lines);
        }
    }

    fn render(&mut self, line: &LogLine) -> Bytes {
        let mut out = String::with_capacity(line.line.len() + 40);
        if self.options.timestamps {
            out.push_str(&line.ts.to_rfc3339_opts(SecondsFormat::Nanos, true));
            out.push(' ');
        }
        out.push_str(&line.line);
        out.push('\n');
        let mut bytes = out.into_bytes();
        if let Some(budget) = self.budget.as_mut() {
            bytes.truncate(*budget);
            *budget -= bytes.len();
        }
        Bytes::from(bytes)
    }
}

/// The longest accepted log record (one NDJSON line), in bytes.
pub const MAX_LOG_RECORD: usize = 256 * 1024;

/// Why a runner's NDJSON log body was not taken whole; the records before it were.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IngestError {
    /// A line longer than the limit.
    #[error("log record {record} is longer than {max} bytes")]
    TooLong {
        /// Its number, from 1.
        record: usize,
        /// The limit.
        max: usize,
    },
    /// A line that is no [`LogRecord`] (or no UTF-8).
    #[error("log record {record} is not valid: {message}")]
    Invalid {
        /// Its number, from 1.
        record: usize,
        /// What is wrong.
        message: String,
    },
    /// The body could not be read.
    #[error("failed to read the log stream: {0}")]
    Read(std::io::Error),
    /// The log refused a record (its binding is gone).
    #[error("{0}")]
    Refused(String),
}

/// Gives each record of the NDJSON `body` to `append`, in order, and returns how many there
/// were; blank lines are skipped, a last line without a newline counts. Stops at the first line
/// longer than `max_line` bytes (without reading more than that line's first `max_line` bytes
/// and a chunk), or that is not a record, or that `append` refuses. The work is linear in the
/// body, and dropping the future loses no record already given to `append`.
pub(crate) async fn ingest<S, E>(
    body: S,
    max_line: usize,
    mut append: impl FnMut(LogRecord) -> Result<(), String>,
) -> Result<usize, IngestError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    let reader = StreamReader::new(body.map_err(std::io::Error::other));
    let mut lines = FramedRead::new(reader, LinesCodec::new_with_max_length(max_line));
    let mut accepted = 0;
    while let Some(line) = lines.next().await {
        let record = accepted + 1;
        let line = match line {
            Ok(line) => line,
            Err(LinesCodecError::MaxLineLengthExceeded) => {
                return Err(IngestError::TooLong {
                    record,
                    max: max_line,
                });
            }
            Err(LinesCodecError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                let message = format!("it is not UTF-8: {e}");
                return Err(IngestError::Invalid { record, message });
            }
            Err(LinesCodecError::Io(e)) => return Err(IngestError::Read(e)),
        };
        if line.trim().is_empty() {
            continue;
        }
        let parsed: LogRecord = serde_json::from_str(&line).map_err(|e| IngestError::Invalid {
            record,
            message: e.to_string(),
        })?;
        append(parsed).map_err(IngestError::Refused)?;
        accepted = record;
    }
    Ok(accepted)
}

#[cfg(test)]
#[path = "logs_tests.rs"]
mod tests;
