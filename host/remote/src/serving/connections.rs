//! Serving HTTP/1.1 on the connections a [`TlsListener`] hands over, within bounds: at most
//! [`ServeLimits::max_connections`] connections at once (one more is closed at once), request
//! headers within [`ServeLimits::header_read_timeout`] (also the longest a kept-alive
//! connection may wait silent for its next request), and request bodies within
//! [`ServeLimits::body_timeout`]. A slow-loris client, which trickles a request's headers or
//! body a byte at a time, is thus cut off after those timeouts, and a flood of them takes at
//! most the connection cap, never the node's file descriptors.
//!
//! Also [`Tasks`]: the tasks a server starts for its connections (the SPDY sessions upgraded
//! from a request), tracked so that shutdown ends every one of them.
//!
//! Not TLS (the listener, [`crate::tls`]) and not what is served (the routers).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::server::TlsStream;
use tower::ServiceExt;

use crate::tls::TlsListener;

/// The bounds of one HTTPS listener (the kubelet API's, the runner callback's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once, counted from the end of their TLS handshake until they
    /// close (an upgraded kubelet connection counts until its SPDY session ends); one more is
    /// closed at once. Handshakes in progress have their own cap in the listener.
    pub max_connections: usize,
    /// How long a client has to send a request's headers, counted from the first read (and
    /// the longest a kept-alive connection may stay silent before its next request).
    pub header_read_timeout: Duration,
    /// How long a request's body may take to arrive in full; past it the body fails, the
    /// handler answers with an error and the connection is closed.
    pub body_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
        }
    }
}

/// A connection's place under [`ServeLimits::max_connections`], in every request's extensions:
/// a handler that takes the connection over (an upgrade) keeps it for as long as it serves.
#[derive(Debug, Clone)]
pub struct ConnectionSlot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// Serves `router` on the connections of `listener` within `limits` until `stop` turns true;
/// each request carries `ConnectInfo(connect_info(stream, peer))` and the [`ConnectionSlot`].
/// Connections run as `tasks`: on `stop` they finish the request in flight and close.
pub async fn serve<C>(
    mut listener: TlsListener,
    router: Router,
    limits: ServeLimits,
    connect_info: fn(&TlsStream<TcpStream>, SocketAddr) -> C,
    mut stop: watch::Receiver<bool>,
    tasks: Tasks,
) where
    C: Clone + Send + Sync + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut shed: u64 = 0;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut stop) => return,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            if shed.is_multiple_of(1000) {
                let max = limits.max_connections;
                tracing::warn!(%peer, max, shed = shed + 1, "too many open connections; closing new ones");
            }
            shed += 1;
            continue;
        };
        let info = connect_info(&stream, peer);
        let slot = ConnectionSlot(Arc::new(permit));
        let connection = serve_one(stream, router.clone(), limits, info, slot, stop.clone());
        tasks.spawn(connection);
    }
}

async fn serve_one<C: Clone + Send + Sync + 'static>(
    stream: TlsStream<TcpStream>,
    router: Router,
    limits: ServeLimits,
    info: C,
    slot: ConnectionSlot,
    mut stop: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let mut request = request.map(|body| Body::new(Deadline::new(body, limits.body_timeout)));
        request.extensions_mut().insert(ConnectInfo(info.clone()));
        request.extensions_mut().insert(slot.clone());
        router.clone().oneshot(request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = stopped(&mut stop) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = served {
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// Returns once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// A request body that fails once it has not arrived in full within its time.
struct Deadline {
    inner: Incoming,
    timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Deadline {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        let sleep = Box::pin(tokio::time::sleep(timeout));
        Deadline {
            inner,
            timeout,
            sleep,
        }
    }
}

impl hyper::body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            let message = format!("the request body did not arrive within {:?}", self.timeout);
            return Poll::Ready(Some(Err(message.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Tasks a server started, ended together: [`Tasks::stop`] drops every one at its next poll,
/// [`Tasks::wait`] returns once none runs. A task spawned after `stop` does not run.
#[derive(Debug, Clone)]
pub struct Tasks(Arc<TasksInner>);

#[derive(Debug)]
struct TasksInner {
    stop: watch::Sender<bool>,
    running: AtomicUsize,
    idle: Notify,
}

/// Counts one running task; the last to end wakes [`Tasks::wait`].
struct Running(Arc<TasksInner>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks(Arc::new(TasksInner {
            stop: watch::Sender::new(false),
            running: AtomicUsize::new(0),
            idle: Notify::new(),
        }))
    }
}

impl Tasks {
    /// Runs `task` until it ends or [`Tasks::stop`].
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut stop = self.0.stop.subscribe();
        if *stop.borrow() {
            return;
        }
        self.0.running.fetch_add(1, Ordering::SeqCst);
        let running = Running(Arc::clone(&self.0));
        tokio::spawn(async move {
            let _running = running;
            tokio::select! {
                () = task => {}
                () = stopped(&mut stop) => {}
            }
        });
    }

    /// Ends every task at its next poll, and refuses new ones.
    pub fn stop(&self) {
        self.0.stop.send_replace(true);
    }

    /// How many tasks run.
    pub fn running(&self) -> usize {
        self.0.running.load(Ordering::SeqCst)
    }

    /// Returns once no task runs.
    pub async fn wait(&self) {
        loop {
            let idle = self.0.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.running() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Waits up to `grace` for the tasks to end by themselves, then stops the rest and waits
    /// for them to go.
    pub async fn shut_down(&self, grace: Duration) {
        if tokio::time::timeout(grace, self.wait()).await.is_err() {
            tracing::debug!(running = self.running(), "cutting the tasks still running");
        }
        self.stop();
        self.wait().await;
    }
}

#[cfg(test)]
#[path = "connections_tests.rs"]
mod tests;
