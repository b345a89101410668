//! Ships the workload's log records to the node in streamed requests, and sends again the
//! records of a request that failed in a way that may pass (the node restarting or failing over,
//! a refused session the client has just replaced, a busy node), so lines written while the
//! node was away are delivered once it is back. Delivery is at least once: a request cut after
//! the node stored part of it sends that part twice. The backlog is bounded; past it the oldest
//! records are dropped and counted in the runner's log.
//!
//! Not the executor that produces the records, nor the HTTP: see [`crate::executor`] and
//! [`crate::CallbackClient`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use neocloud_protocol::LogRecord;

use crate::{CallbackClient, RunnerError};

/// How long a log request stays open before the runner starts a new one (with a fresh session).
const REQUEST_SPAN: Duration = Duration::from_secs(5);
/// Records kept to send again; beyond this the oldest are dropped.
const MAX_BACKLOG: usize = 20_000;
/// Wait after a failed request, doubling up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// Records waiting to be sent again, and those the current request has taken.
#[derive(Debug, Default)]
struct Queue {
    backlog: VecDeque<LogRecord>,
    in_flight: Vec<LogRecord>,
    dropped: u64,
}

impl Queue {
    /// Puts the failed request's records back in front of the backlog, within the bound.
    fn requeue(&mut self) {
        let mut records: VecDeque<LogRecord> = self.in_flight.drain(..).collect();
        records.append(&mut self.backlog);
        let excess = records.len().saturating_sub(MAX_BACKLOG);
        records.drain(..excess);
        self.dropped += excess as u64;
        self.backlog = records;
    }
}

/// The waits after consecutive failed requests: [`FIRST_BACKOFF`] doubling up to
/// [`MAX_BACKOFF`], for as long as requests fail.
fn delays() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::new()
        .with_min_delay(FIRST_BACKOFF)
        .with_factor(2.0)
        .with_max_delay(MAX_BACKOFF)
        .without_max_times()
        .build()
}

/// Whether records of a request that failed this way are worth sending again.
fn worth_retrying(e: &RunnerError) -> bool {
    e.is_transient() || e.is_unauthorized()
}

/// Sends records until every sender is gone and nothing is left to send again.
pub(super) async fn ship(client: Arc<CallbackClient>, logs: mpsc::Receiver<LogRecord>) {
    let logs = Arc::new(tokio::sync::Mutex::new(logs));
    let queue = Arc::new(Mutex::new(Queue::default()));
    let mut backoff = delays();
    loop {
        let first = queue.lock().backlog.pop_front();
        let first = match first {
            Some(record) => record,
            None => match logs.lock().await.recv().await {
                Some(record) => record,
                None => return,
            },
        };
        queue.lock().backlog.push_front(first);
        let body = body(queue.clone(), logs.clone());
        match client.logs(body).await {
            Ok(()) => {
                queue.lock().in_flight.clear();
                backoff = delays();
            }
            Err(e) => {
                let retry = worth_retrying(&e);
                let dropped = {
                    let mut q = queue.lock();
                    if retry {
                        q.requeue();
                    } else {
                        q.dropped += q.in_flight.len() as u64;
                        q.in_flight.clear();
                    }
                    q.dropped
                };
                tracing::warn!(error = %e, retry, dropped, "runner: failed to stream logs");
                tokio::time::sleep(backoff.next().unwrap_or(MAX_BACKOFF)).await;
            }
        }
    }
}

/// One request's body: the backlog, then new records for up to [`REQUEST_SPAN`]; every record
/// taken is kept in `in_flight` until the request's outcome is known.
fn body(
    queue: Arc<Mutex<Queue>>,
    logs: Arc<tokio::sync::Mutex<mpsc::Receiver<LogRecord>>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let deadline = tokio::time::Instant::now() + REQUEST_SPAN;
    futures::stream::unfold((queue, logs), move |(queue, logs)| async move {
        let queued = queue.lock().backlog.pop_front();
        let record = match queued {
            Some(record) => record,
            None => {
                let mut rx = logs.lock().await;
                tokio::time::timeout_at(deadline, rx.recv()).await.ok()??
            }
        };
        let mut line = serde_json::to_vec(&record).unwrap_or_default();
        line.push(b'\n');
        queue.lock().in_flight.push(record);
        Some((Ok(Bytes::from(line)), (queue, logs)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use neocloud_protocol::LogStream;

    #[test]
    fn failed_requests_wait_a_quarter_second_doubling_to_four_seconds_and_no_longer() {
        let waits: Vec<u64> = delays().take(7).map(|d| d.as_millis() as u64).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 4000, 4000]);
    }

    fn record(n: usize) -> LogRecord {
        LogRecord {
            ts: chrono::Utc::now(),
            stream: LogStream::Stdout,
            line: format!("line {n}"),
            run: 0,
        }
    }

    #[test]
    fn a_failed_request_is_sent_again_before_what_came_after_it() {
        let mut q = Queue {
            in_flight: vec![record(1), record(2)],
            ..Queue::default()
        };
        q.backlog.push_back(record(3));
        q.requeue();
        let lines: Vec<_> = q.backlog.iter().map(|r| r.line.clone()).collect();
        assert_eq!(lines, ["line 1", "line 2", "line 3"]);
        assert!(q.in_flight.is_empty());
        assert_eq!(q.dropped, 0);
    }

    #[test]
    fn the_backlog_is_bounded_and_drops_the_oldest() {
        let mut q = Queue {
            in_flight: (0..MAX_BACKLOG + 5).map(record).collect(),
            ..Queue::default()
        };
        q.requeue();
        assert_eq!(q.backlog.len(), MAX_BACKLOG);
        assert_eq!(q.dropped, 5);
        assert_eq!(q.backlog.front().map(|r| r.line.as_str()), Some("line 5"));
    }

    #[test]
    fn only_failures_that_may_pass_are_sent_again() {
        let refused = |status| RunnerError::Refused {
            what: "stream logs",
            status,
            message: String::new(),
        };
        let transit = RunnerError::Http {
            what: "stream logs",
            message: "connection reset".into(),
        };
        assert!(worth_retrying(&transit));
        assert!(worth_retrying(&refused(503)));
        assert!(worth_retrying(&refused(401)));
        assert!(!worth_retrying(&refused(403)));
        assert!(!worth_retrying(&refused(413)));
    }
}
