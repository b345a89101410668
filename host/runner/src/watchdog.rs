//! A watchdog for a request whose body is streamed (the log stream). No total timeout fits a
//! body that lasts as long as its records take to send, so the request fails instead when the
//! node stops taking the body (the HTTP client does not ask for the next chunk within the limit
//! of getting the last one) or does not answer within the limit once the body has ended. While
//! the body itself waits for records, the node is not to blame and nothing runs out.
//!
//! Not the body's content nor the retries: see [`crate::shipper`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::RunnerError;

/// When the request fails unless the node makes progress; `None` while the body waits.
type Deadline = Arc<Mutex<Option<Instant>>>;

/// `body`, watched: send the first through the request, and the request through the second.
pub(crate) fn watch<S>(body: S, limit: Duration) -> (Watched<S>, Watchdog) {
    let deadline: Deadline = Arc::new(Mutex::new(Some(Instant::now() + limit)));
    let watched = Watched {
        body: Box::pin(body),
        deadline: deadline.clone(),
        limit,
    };
    (watched, Watchdog { deadline, limit })
}

/// A body that notes when the HTTP client takes its chunks.
pub(crate) struct Watched<S> {
    body: Pin<Box<S>>,
    deadline: Deadline,
    limit: Duration,
}

impl<S: Stream> Stream for Watched<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        // Asked for more: the node took what came before (or the client buffered it).
        *self.deadline.lock() = None;
        let polled = self.body.as_mut().poll_next(cx);
        if polled.is_ready() {
            *self.deadline.lock() = Some(Instant::now() + self.limit);
        }
        polled
    }
}

/// Fails a watched request that stops making progress.
#[derive(Debug)]
pub(crate) struct Watchdog {
    deadline: Deadline,
    limit: Duration,
}

impl Watchdog {
    /// `request`'s outcome, or a timeout error (transient: the records are sent again) once the
    /// node has made no progress for the limit.
    pub(crate) async fn guard<T>(
        self,
        what: &'static str,
        request: impl Future<Output = Result<T, RunnerError>>,
    ) -> Result<T, RunnerError> {
        let mut request = std::pin::pin!(request);
        loop {
            let wake = (*self.deadline.lock()).unwrap_or_else(|| Instant::now() + self.limit);
            tokio::select! {
                result = &mut request => return result,
                () = tokio::time::sleep_until(wake) => {
                    if self.deadline.lock().is_some_and(|d| d <= Instant::now()) {
                        return Err(RunnerError::Http {
                            what,
                            message: format!(
                                "timed out: the node neither took the stream nor answered for {:?}",
                                self.limit
                            ),
                        });
                    }
                }
            }
        }
    }
}
