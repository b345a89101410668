//! The requests an adapter sent again within one provider call (a 429, a 5xx, a timeout), kept so
//! that the caller can put them on the record: an attempt that succeeded after two 429s is not
//! the same attempt as one that succeeded at once, and its owner should be able to see it.
//!
//! The HTTP layer notes each retry in a task-local list that [`recording`] opens around a call;
//! outside such a scope nothing is kept. Not for deciding whether to retry (`http` does that) and
//! not for reporting (the broker and the node do that).

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

/// The most retries kept per scope; a call retries at most `maxAttempts - 1` times, so this only
/// bounds a misconfigured budget.
const MAX_KEPT: usize = 32;

/// One request sent again, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// The HTTP status that was answered (429, 503...), `None` for a transport failure.
    pub status: Option<u16>,
    /// The transport failure (`timeout`, `connect`, `transport`), when there was no answer.
    pub error: Option<&'static str>,
    /// The wait the provider asked for in `Retry-After`, if it did.
    pub asked: Option<Duration>,
    /// The wait taken before the request was sent again.
    pub waited: Duration,
}

impl Retry {
    /// `429`, `503` or `timeout`.
    pub fn cause(&self) -> String {
        match (self.status, self.error) {
            (Some(status), _) => status.to_string(),
            (None, Some(error)) => error.to_owned(),
            (None, None) => "error".to_owned(),
        }
    }
}

tokio::task_local! {
    static RETRIES: RefCell<Vec<Retry>>;
}

/// Runs `call`, returning its output and the retries its HTTP requests made.
pub async fn recording<F: Future>(call: F) -> (F::Output, Vec<Retry>) {
    RETRIES
        .scope(RefCell::new(Vec::new()), async {
            let output = call.await;
            let retries = RETRIES.with(|r| r.take());
            (output, retries)
        })
        .await
}

/// Notes a retry in the current scope; nothing when there is none.
pub(crate) fn note(retry: Retry) {
    let _ = RETRIES.try_with(|r| {
        let mut r = r.borrow_mut();
        if r.len() < MAX_KEPT {
            r.push(retry);
        }
    });
}

/// `1.5s`, `30s`.
pub fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if (s - s.round()).abs() < 0.05 {
        format!("{}s", s.round() as u64)
    } else {
        format!("{s:.1}s")
    }
}

/// `2 retries (429, 429; asked 2s, 2s; waited 2s, 2s)`: what a list of retries was, in a line.
pub fn summary(retries: &[Retry]) -> String {
    let causes: Vec<String> = retries.iter().map(Retry::cause).collect();
    let asked: Vec<String> = retries
        .iter()
        .filter_map(|r| r.asked.map(seconds))
        .collect();
    let waited: Vec<String> = retries.iter().map(|r| seconds(r.waited)).collect();
    let noun = if retries.len() == 1 {
        "retry"
    } else {
        "retries"
    };
    let mut out = format!("{} {noun} ({}", retries.len(), causes.join(", "));
    if !asked.is_empty() {
        out.push_str(&format!("; Retry-After asked {}", asked.join(", ")));
    }
    out.push_str(&format!("; waited {})", waited.join(", ")));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(status: u16) -> Retry {
        Retry {
            status: Some(status),
            error: None,
            asked: Some(Duration::from_secs(2)),
            waited: Duration::from_secs(2),
        }
    }

    #[tokio::test]
    async fn retries_noted_inside_a_scope_come_back_with_its_output_and_none_leak_outside() {
        note(retry(500));
        let (out, retries) = recording(async {
            note(retry(429));
            note(retry(503));
            7
        })
        .await;
        assert_eq!(out, 7);
        assert_eq!(retries, vec![retry(429), retry(503)]);
        let (_, again) = recording(async {}).await;
        assert!(again.is_empty(), "{again:?}");
    }

    #[tokio::test]
    async fn a_scope_keeps_a_bounded_number_of_retries() {
        let (_, retries) = recording(async {
            for _ in 0..1000 {
                note(retry(429));
            }
        })
        .await;
        assert_eq!(retries.len(), MAX_KEPT);
    }

    #[test]
    fn a_summary_counts_the_retries_with_their_causes_and_waits() {
        let mut second = retry(429);
        second.asked = None;
        second.waited = Duration::from_millis(500);
        assert_eq!(
            summary(&[retry(429), second]),
            "2 retries (429, 429; Retry-After asked 2s; waited 2s, 0.5s)"
        );
    }

    #[test]
    fn a_retry_names_its_status_or_its_transport_failure() {
        assert_eq!(retry(429).cause(), "429");
        let timeout = Retry {
            status: None,
            error: Some("timeout"),
            asked: None,
            waited: Duration::ZERO,
        };
        assert_eq!(timeout.cause(), "timeout");
    }
}
