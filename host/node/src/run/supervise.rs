//! The node's long-running tasks, supervised: each runs until the node stops, so one that
//! returns, fails or panics means the node no longer does its work. The first such end turns
//! `/readyz` to 503 and is handed to `run`, which stops the process with an error naming the
//! task ("task sweeper panicked: ..."), so Kubernetes restarts it and a standby leads.
//!
//! Tests trigger such an end with `NEOCLOUD_TEST_FAULT` (see [`Fault`]), read only in builds
//! with debug assertions (`cargo build`, `cargo test`), never in a release build.
//!
//! Not here: what the tasks do, and leadership.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{Id, JoinError, JoinSet};

/// The variable that injects a fault into a named task, in debug builds only.
pub const FAULT_VAR: &str = "NEOCLOUD_TEST_FAULT";

/// How a supervised task ended. Each is a failure: the tasks are meant to run forever.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskEnded {
    /// It returned without an error.
    #[error("task {task} ended; it should run as long as the node")]
    Returned {
        /// The task.
        task: &'static str,
    },
    /// It returned an error.
    #[error("task {task} failed: {error}")]
    Failed {
        /// The task.
        task: &'static str,
        /// The error, with its causes.
        error: String,
    },
    /// It panicked.
    #[error("task {task} panicked: {message}")]
    Panicked {
        /// The task.
        task: &'static str,
        /// The panic's message.
        message: String,
    },
}

/// What a task's output says about how it ended.
pub trait Outcome {
    /// `Ok` for a plain return, the error's text otherwise.
    fn into_result(self) -> Result<(), String>;
}

impl Outcome for () {
    fn into_result(self) -> Result<(), String> {
        Ok(())
    }
}

/// A server serves until one of its own tasks ends, which is always a failure.
impl Outcome for neocloud_remote::serving::ServerStopped {
    fn into_result(self) -> Result<(), String> {
        Err(self.to_string())
    }
}

impl<E: std::fmt::Display> Outcome for Result<(), E> {
    fn into_result(self) -> Result<(), String> {
        self.map_err(|e| format!("{e:#}"))
    }
}

/// The supervised tasks. Dropping it aborts every one.
pub struct Supervisor {
    tasks: JoinSet<Result<(), String>>,
    names: HashMap<Id, &'static str>,
    ready: watch::Sender<bool>,
    fault: Option<Fault>,
}

impl Supervisor {
    /// Supervises tasks; `ready` is what `/readyz` reports, set false once one ends. Fails on a
    /// malformed [`FAULT_VAR`] in debug builds.
    pub fn new(ready: watch::Sender<bool>) -> anyhow::Result<Supervisor> {
        Ok(Supervisor {
            tasks: JoinSet::new(),
            names: HashMap::new(),
            ready,
            fault: Fault::from_env()?,
        })
    }

    /// Runs `task` as `name` until the supervisor is dropped.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future + Send + 'static,
        F::Output: Outcome,
    {
        let run = async move { task.await.into_result() };
        let handle = match self.fault.as_ref().filter(|f| f.task == name) {
            Some(fault) => self.tasks.spawn(fault.clone().inject(run)),
            None => self.tasks.spawn(run),
        };
        self.names.insert(handle.id(), name);
    }

    /// Waits for the first task to end, marks the node not ready and says how it ended. Never
    /// returns while every task runs (nor when there is none).
    pub async fn ended(&mut self) -> TaskEnded {
        let Some(joined) = self.tasks.join_next_with_id().await else {
            return std::future::pending().await;
        };
        self.ready.send_replace(false);
        let ended = match joined {
            Ok((id, Ok(()))) => TaskEnded::Returned {
                task: self.name(id),
            },
            Ok((id, Err(error))) => TaskEnded::Failed {
                task: self.name(id),
                error,
            },
            Err(e) => self.join_error(e),
        };
        tracing::error!(error = %ended, "a supervised task ended; stopping the node");
        ended
    }

    /// Aborts every task and waits until each has stopped, so nothing it does overlaps the next
    /// leader.
    pub async fn stop(mut self) {
        self.tasks.shutdown().await;
    }

    fn join_error(&self, e: JoinError) -> TaskEnded {
        let task = self.name(e.id());
        if !e.is_panic() {
            // Only `abort` cancels, and only `Drop` aborts.
            return TaskEnded::Returned { task };
        }
        let message = neocloud_remote::serving::panic_message(&*e.into_panic());
        TaskEnded::Panicked { task, message }
    }

    fn name(&self, id: Id) -> &'static str {
        self.names.get(&id).copied().unwrap_or("unnamed")
    }
}

/// A fault injected into one task for tests: `NEOCLOUD_TEST_FAULT=<kind>:<task>[:<ms>]`, where
/// `kind` is `panic-task` (the task panics) or `end-task` (it returns), `ms` milliseconds after
/// it starts (default 0). For example `panic-task:sweeper:3000`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The task it hits.
    pub task: String,
    /// Panic (true) or return (false).
    pub panic: bool,
    /// How long the task runs first.
    pub after: Duration,
}

impl Fault {
    /// The fault in [`FAULT_VAR`]; always `None` in release builds, which never read it.
    fn from_env() -> anyhow::Result<Option<Fault>> {
        if !cfg!(debug_assertions) {
            return Ok(None);
        }
        match std::env::var(FAULT_VAR) {
            Ok(value) if !value.is_empty() => {
                let fault = Fault::parse(&value)?;
                tracing::warn!(?fault, "{FAULT_VAR} is set: injecting a fault");
                Ok(Some(fault))
            }
            _ => Ok(None),
        }
    }

    /// Parses `<kind>:<task>[:<ms>]`.
    pub fn parse(value: &str) -> anyhow::Result<Fault> {
        let bad = |why: &str| anyhow::anyhow!("{FAULT_VAR}: {value:?} {why}");
        let mut parts = value.split(':');
        let panic = match parts.next() {
            Some("panic-task") => true,
            Some("end-task") => false,
            _ => return Err(bad("does not start with panic-task: or end-task:")),
        };
        let task = match parts.next() {
            Some(task) if !task.is_empty() => task.to_owned(),
            _ => return Err(bad("names no task")),
        };
        let after = match parts.next() {
            None => Duration::ZERO,
            Some(ms) => Duration::from_millis(
                ms.parse()
                    .map_err(|_| bad("has a delay that is not a number of milliseconds"))?,
            ),
        };
        if parts.next().is_some() {
            return Err(bad("has more than three parts"));
        }
        Ok(Fault { task, panic, after })
    }

    async fn inject(self, task: impl Future<Output = Result<(), String>>) -> Result<(), String> {
        tokio::select! {
            ended = task => ended,
            () = tokio::time::sleep(self.after) => {
                if self.panic {
                    panic!("injected by {FAULT_VAR}");
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supervisor() -> (Supervisor, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(true);
        (Supervisor::new(tx).unwrap(), rx)
    }

    async fn forever() {
        std::future::pending::<()>().await
    }

    #[tokio::test]
    async fn a_panicking_task_is_named_with_its_message_and_turns_readiness_off() {
        let (mut s, ready) = supervisor();
        s.spawn("reconciler", forever());
        s.spawn("sweeper", async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if true {
                panic!("boom at {}", 42);
            }
        });
        let ended = s.ended().await;
        assert_eq!(
            ended.to_string(),
            "task sweeper panicked: boom at 42",
            "{ended:?}"
        );
        assert!(!*ready.borrow());
    }

    #[tokio::test]
    async fn a_task_that_returns_or_fails_ends_the_supervision_by_name() {
        let (mut s, ready) = supervisor();
        s.spawn("heartbeat", async {});
        assert_eq!(s.ended().await, TaskEnded::Returned { task: "heartbeat" });
        assert!(!*ready.borrow());
        s.spawn("metrics", async {
            Err::<(), _>(anyhow::anyhow!("address in use").context("failed to serve"))
        });
        let ended = s.ended().await.to_string();
        assert_eq!(
            ended,
            "task metrics failed: failed to serve: address in use"
        );
    }

    #[tokio::test]
    async fn a_server_that_stops_serving_fails_its_task_naming_what_stopped() {
        let (mut s, ready) = supervisor();
        s.spawn("callback", async {
            neocloud_remote::serving::ServerStopped {
                server: "callback",
                task: "TLS accept loop",
                how: "panicked: boom".into(),
            }
        });
        assert_eq!(
            s.ended().await.to_string(),
            "task callback failed: the callback server's TLS accept loop panicked: boom"
        );
        assert!(!*ready.borrow());
    }

    #[tokio::test]
    async fn tasks_that_keep_running_end_nothing() {
        let (mut s, ready) = supervisor();
        s.spawn("gauges", forever());
        let waited = tokio::time::timeout(Duration::from_millis(50), s.ended()).await;
        assert!(waited.is_err(), "{waited:?}");
        assert!(*ready.borrow());
    }

    #[tokio::test]
    async fn an_injected_fault_hits_only_its_task_after_its_delay() {
        let (mut s, _ready) = supervisor();
        s.fault = Some(Fault::parse("panic-task:sweeper:30").unwrap());
        s.spawn("reconciler", forever());
        s.spawn("sweeper", forever());
        let started = tokio::time::Instant::now();
        let ended = s.ended().await;
        assert_eq!(
            ended.to_string(),
            format!("task sweeper panicked: injected by {FAULT_VAR}")
        );
        assert!(started.elapsed() >= Duration::from_millis(30));
        s.fault = Some(Fault::parse("end-task:health").unwrap());
        s.spawn("health", forever());
        assert_eq!(s.ended().await, TaskEnded::Returned { task: "health" });
    }

    #[test]
    fn faults_parse_and_bad_ones_are_refused_by_value() {
        assert_eq!(
            Fault::parse("end-task:gauges").unwrap(),
            Fault {
                task: "gauges".into(),
                panic: false,
                after: Duration::ZERO
            }
        );
        for (value, why) in [
            ("crash:sweeper", "does not start with"),
            ("panic-task:", "names no task"),
            ("panic-task:sweeper:soon", "not a number"),
            ("panic-task:sweeper:1:2", "more than three"),
        ] {
            let e = Fault::parse(value).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{FAULT_VAR}: {value:?}")), "{e}");
            assert!(e.contains(why), "{e}");
        }
    }
}
