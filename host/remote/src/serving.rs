//! Watching a server's own tasks: a server is several tasks (the HTTP service, the TLS accept
//! loop, for the callback the heartbeat monitor) and stops doing its work when any one of them
//! ends. [`first_to_end`] says which ended first, and how, so the node's supervisor can stop the
//! process instead of leading without the server. The connections themselves are served, within
//! their bounds, by [`connections`].

mod connections;

pub use connections::ServeLimits;
pub use connections::{ConnectionSlot, Tasks, serve};

use futures::future::select_all;
use tokio::task::JoinHandle;

/// A server task that ended by itself: each is meant to run until the server is dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {server} server's {task} {how}")]
pub struct ServerStopped {
    /// The server ("callback", "kubelet").
    pub server: &'static str,
    /// Its task that ended ("HTTP service", "TLS accept loop", "heartbeat monitor").
    pub task: &'static str,
    /// How: "ended", "panicked: ...", "was cancelled".
    pub how: String,
}

/// Waits until the first of `tasks` ends and says how. Never returns for an empty list.
pub async fn first_to_end(
    server: &'static str,
    tasks: Vec<(&'static str, &mut JoinHandle<()>)>,
) -> ServerStopped {
    if tasks.is_empty() {
        return std::future::pending().await;
    }
    let (names, handles): (Vec<_>, Vec<_>) = tasks.into_iter().unzip();
    let (joined, index, _) = select_all(handles).await;
    let how = match joined {
        Ok(()) => "ended".to_owned(),
        Err(e) if e.is_panic() => format!("panicked: {}", panic_message(&*e.into_panic())),
        Err(_) => "was cancelled".to_owned(),
    };
    let stopped = ServerStopped {
        server,
        task: names[index],
        how,
    };
    tracing::error!(error = %stopped, "a server stopped serving");
    stopped
}

/// A panic's message, from its payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_task_to_end_is_named_with_how_it_ended() {
        let mut forever = tokio::spawn(std::future::pending::<()>());
        let mut panics = tokio::spawn(async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            panic!("the listener broke");
        });
        let stopped = first_to_end(
            "kubelet",
            vec![
                ("HTTP service", &mut forever),
                ("TLS accept loop", &mut panics),
            ],
        )
        .await;
        assert_eq!(stopped.task, "TLS accept loop");
        assert_eq!(
            stopped.to_string(),
            "the kubelet server's TLS accept loop panicked: the listener broke"
        );

        let mut ends = tokio::spawn(async {});
        let stopped = first_to_end(
            "callback",
            vec![
                ("HTTP service", &mut forever),
                ("heartbeat monitor", &mut ends),
            ],
        )
        .await;
        assert_eq!(
            stopped.to_string(),
            "the callback server's heartbeat monitor ended"
        );
        forever.abort();
        let stopped = first_to_end("callback", vec![("HTTP service", &mut forever)]).await;
        assert_eq!(stopped.how, "was cancelled");
    }
}
