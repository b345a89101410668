//! Egress on the machine: each in-cluster destination the Pod named is served on the
//! machine's loopback, `127.0.0.1:{its port}`, and each connection the workload opens there is
//! carried to the node on a connection of its own (`GET /v1/egress/{index}`), which dials the
//! destination inside the cluster. The destination's cluster names resolve to 127.0.0.1 where
//! the runner can make them: `--add-host` for the docker executor, `/etc/hosts` for the process
//! executor when it is writable (a rented VM's runner is root); otherwise it says so.
//!
//! A port already taken on the machine is not served (the runner says so); nothing else is
//! listened on, and the node dials nothing the Pod did not name.
//!
//! Not the node's side (the callback's `egress` route) nor the relaying of bytes
//! (`neocloud_protocol::relay`).

use std::future::Future;
use std::io::Write;
use std::path::Path;

use std::sync::Arc;

use neocloud_protocol::relay::{RelayError, relay};
use neocloud_protocol::{EgressTarget, ExecutorKind};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::{CallbackClient, RunnerArgs};

/// A destination served on the loopback.
#[derive(Debug)]
pub struct Bound {
    /// Its index in the workload's list (what the node is asked for).
    pub index: usize,
    /// The destination.
    pub target: EgressTarget,
    listener: TcpListener,
}

/// Listens on `127.0.0.1:{port}` for each destination whose port is free, saying which are not.
pub async fn bind(targets: &[EgressTarget]) -> Vec<Bound> {
    let mut bound = Vec::with_capacity(targets.len());
    for (index, target) in targets.iter().enumerate() {
        match TcpListener::bind(("127.0.0.1", target.port)).await {
            Ok(listener) => {
                tracing::info!(destination = %target, "runner: serving an egress destination on 127.0.0.1:{}", target.port);
                bound.push(Bound {
                    index,
                    target: target.clone(),
                    listener,
                });
            }
            Err(e) => tracing::warn!(
                destination = %target, error = %e,
                "runner: port {} of the machine's loopback is taken: the egress destination is not served",
                target.port
            ),
        }
    }
    bound
}

/// The names that should resolve to 127.0.0.1: each served destination's cluster names.
pub fn host_names(bound: &[Bound]) -> Vec<String> {
    bound.iter().flat_map(|b| b.target.host_names()).collect()
}

/// Appends `names` to the hosts file at `path` (one `127.0.0.1` line, skipped when every name is
/// already there), or says why the names will not resolve.
pub fn write_hosts(path: &Path, names: &[String]) -> Result<(), String> {
    if names.is_empty() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let known = |n: &String| {
        text.lines()
            .any(|l| l.split_whitespace().skip(1).any(|w| w == n))
    };
    if names.iter().all(known) {
        return Ok(());
    }
    let line = format!("127.0.0.1 {} # neocloud egress\n", names.join(" "));
    let appended = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    appended.map_err(|e| {
        format!(
            "cannot append to {}: {e}; the destinations' cluster names do not resolve (the \
             workload can use 127.0.0.1 and each destination's port)",
            path.display()
        )
    })
}

/// Serves `targets` for the runner's life (abort the task to stop): binds them, makes their
/// names resolve (returning them for the docker executor's `--add-host`; writing `/etc/hosts`
/// for the process executor) and carries each connection through `client`.
pub async fn start(
    client: &Arc<CallbackClient>,
    targets: &[EgressTarget],
    args: &RunnerArgs,
) -> (tokio::task::JoinHandle<()>, Vec<String>) {
    let bound = bind(targets).await;
    let names = host_names(&bound);
    let loopback_hosts = match args.executor {
        ExecutorKind::Docker => {
            if !names.is_empty() && args.network != "host" {
                tracing::warn!(network = %args.network, "runner: egress is served on the machine's loopback, which a container off the host network does not share: the destinations are not reachable from it");
            }
            names
        }
        ExecutorKind::Process => {
            if let Err(why) = write_hosts(&args.hosts_file, &names) {
                tracing::warn!(why, "runner: egress names do not resolve");
            }
            Vec::new()
        }
    };
    let client = client.clone();
    let open = move |index| {
        let client = client.clone();
        async move { client.open_egress(index).await.map_err(|e| e.to_string()) }
    };
    (tokio::spawn(serve(bound, open)), loopback_hosts)
}

/// Serves every bound destination until dropped (aborted): each accepted connection is carried
/// over a connection `open(index)` returns; an open that fails, or an `Error` from the node,
/// closes it.
pub async fn serve<O, F, S>(bound: Vec<Bound>, open: O)
where
    O: Fn(usize) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<S, String>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut listeners = JoinSet::new();
    for b in bound {
        listeners.spawn(accept(b, open.clone()));
    }
    while listeners.join_next().await.is_some() {}
}

async fn accept<O, F, S>(b: Bound, open: O)
where
    O: Fn(usize) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<S, String>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = b.listener.accept() => match accepted {
                Ok((socket, _)) => {
                    connections.spawn(carry(socket, b.index, b.target.clone(), open.clone()));
                }
                Err(e) => {
                    tracing::warn!(destination = %b.target, error = %e, "runner: egress accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

async fn carry<O, F, S>(socket: TcpStream, index: usize, target: EgressTarget, open: O)
where
    O: Fn(usize) -> F,
    F: Future<Output = Result<S, String>>,
    S: AsyncRead + AsyncWrite,
{
    let io = match open(index).await {
        Ok(io) => io,
        Err(why) => {
            tracing::warn!(destination = %target, why, "runner: egress connection refused");
            return;
        }
    };
    match relay(socket, io, None).await {
        Ok(()) => {}
        Err(RelayError::Refused(why)) => {
            tracing::warn!(destination = %target, why, "runner: egress connection refused");
        }
        Err(e) => {
            tracing::debug!(destination = %target, error = %e, "runner: egress connection ended")
        }
    }
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
