//! Sessions tunnelled to runners (`kubectl exec`, `kubectl port-forward`): the offers waiting
//! for a runner's `GET /v1/sessions` long poll, the ones handed out and waiting for the runner to
//! dial back on `GET /v1/sessions/{id}`, and those two routes' handlers. An offer belongs to one
//! rental of one binding (the current one when it was made: the runner of an earlier rental
//! never sees it) and is used once; it is withdrawn when its opener gives up or times out and
//! failed when the binding is unregistered, its rental replaced, or its runner exits.
//!
//! Not the frames spoken on a session (`neocloud_protocol::session`) nor what the kubelet API
//! makes of them (the `neocloud-kubelet` crate).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, oneshot, watch};

use neocloud_protocol::session::{SESSION_POLL, SESSION_UPGRADE, SessionOffer, SessionRequest};

use super::CallbackError;
use super::server::{AppState, Authed, error, no_store};
use super::state::CallbackHandle;

/// A byte stream a session runs on.
pub trait SessionStream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> SessionStream for T {}

/// An open session with a runner: speak [`Frame`](neocloud_protocol::session::Frame)s on it;
/// dropping it closes the session.
pub type SessionIo = Box<dyn SessionStream>;

type Reply = oneshot::Sender<Result<SessionIo, CallbackError>>;

/// Every binding's offers, per rental.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    bindings: Mutex<HashMap<(String, u64), Binding>>,
}

fn key(uid: &str, rental: u64) -> (String, u64) {
    (uid.to_owned(), rental)
}

#[derive(Debug, Default)]
struct Binding {
    /// Offers not handed to the runner yet, oldest first.
    queue: VecDeque<SessionOffer>,
    /// Offers (queued or handed out) whose runner has not dialled back yet.
    pending: HashMap<String, Pending>,
    /// Wakes the runner's poll when an offer is queued.
    wake: Arc<Notify>,
    /// Sessions open or being opened.
    open: Arc<AtomicUsize>,
    /// Of those, the relay's connections, counted apart (see
    /// [`CallbackHandle::open_relayed`]).
    relayed: Arc<AtomicUsize>,
}

struct Pending {
    reply: Reply,
    taken: bool,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("taken", &self.taken)
            .finish()
    }
}

impl Sessions {
    /// Queues an offer of `request` for the runner of rental `rental` of `uid`, within `limit`
    /// sessions at once.
    fn offer(
        &self,
        uid: &str,
        rental: u64,
        request: SessionRequest,
        limit: usize,
        relayed: bool,
    ) -> Result<Offered<'_>, CallbackError> {
        let mut bindings = self.bindings.lock();
        let binding = bindings.entry(key(uid, rental)).or_default();
        let open = if relayed {
            &binding.relayed
        } else {
            &binding.open
        };
        if open.load(Ordering::SeqCst) >= limit {
            return Err(CallbackError::TooManySessions {
                uid: uid.to_owned(),
                limit,
            });
        }
        let slot = Slot::take(open);
        let id = hex::encode(rand::random::<[u8; 16]>());
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            reply,
            taken: false,
        };
        binding.pending.insert(id.clone(), pending);
        binding.queue.push_back(SessionOffer {
            id: id.clone(),
            request,
        });
        binding.wake.notify_one();
        Ok(Offered {
            sessions: self,
            uid: uid.to_owned(),
            rental,
            id,
            answer,
            slot: Some(slot),
        })
    }

    /// Removes an offer wherever it is; whether the runner had taken it, if it was there.
    fn withdraw(&self, uid: &str, rental: u64, id: &str) -> Option<bool> {
        let mut bindings = self.bindings.lock();
        let binding = bindings.get_mut(&key(uid, rental))?;
        binding.queue.retain(|offer| offer.id != id);
        binding.pending.remove(id).map(|pending| pending.taken)
    }

    /// The next offer for rental `rental` of `uid`, waiting up to `wait` (or until `closing`)
    /// for one.
    async fn next(
        &self,
        uid: &str,
        rental: u64,
        wait: Duration,
        mut closing: watch::Receiver<bool>,
    ) -> Option<SessionOffer> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let wake = {
                let mut bindings = self.bindings.lock();
                let binding = bindings.entry(key(uid, rental)).or_default();
                while let Some(offer) = binding.queue.pop_front() {
                    if let Some(pending) = binding.pending.get_mut(&offer.id) {
                        pending.taken = true;
                        return Some(offer);
                    }
                }
                binding.wake.clone()
            };
            // `notify_one` keeps a permit when nobody waits: an offer queued since the lock
            // was released still wakes this poll.
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep_until(deadline) => return None,
                _ = closing.wait_for(|closing| *closing) => return None,
            }
        }
    }

    /// The opener's reply channel of offer `id`, if it is rental `rental` of `uid`'s; the offer
    /// is used up.
    fn claim(&self, uid: &str, rental: u64, id: &str) -> Option<Reply> {
        let mut bindings = self.bindings.lock();
        let binding = bindings.get_mut(&key(uid, rental))?;
        let pending = binding.pending.remove(id)?;
        binding.queue.retain(|offer| offer.id != id);
        Some(pending.reply)
    }

    /// Fails every offer of `uid` (any rental) waiting for its runner with `error`.
    pub(crate) fn fail(&self, uid: &str, error: impl Fn() -> CallbackError) {
        let mut bindings = self.bindings.lock();
        for ((of, _), binding) in bindings.iter_mut() {
            if of != uid {
                continue;
            }
            binding.queue.clear();
            for (_, pending) in binding.pending.drain() {
                let _ = pending.reply.send(Err(error()));
            }
        }
    }

    /// Fails and forgets the offers of `uid`'s rentals other than `current` (replaced).
    pub(crate) fn retire(&self, uid: &str, current: u64, error: impl Fn() -> CallbackError) {
        let mut bindings = self.bindings.lock();
        bindings.retain(|(of, rental), binding| {
            if of != uid || *rental == current {
                return true;
            }
            for (_, pending) in binding.pending.drain() {
                let _ = pending.reply.send(Err(error()));
            }
            false
        });
    }

    /// Forgets `uid` (unregistered): its waiting openers are told so.
    pub(crate) fn forget(&self, uid: &str) {
        self.fail(uid, || CallbackError::NotRegistered(uid.to_owned()));
        self.bindings.lock().retain(|(of, _), _| of != uid);
    }
}

/// One of a binding's sessions, open or being opened; freed when dropped.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        Self(open.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A queued offer, withdrawn if it is dropped before the runner dialled back.
struct Offered<'a> {
    sessions: &'a Sessions,
    uid: String,
    rental: u64,
    id: String,
    answer: oneshot::Receiver<Result<SessionIo, CallbackError>>,
    slot: Option<Slot>,
}

impl Offered<'_> {
    async fn wait(mut self, timeout: Duration) -> Result<SessionIo, CallbackError> {
        let answer = tokio::time::timeout(timeout, &mut self.answer).await;
        let io = match answer {
            Ok(Ok(answer)) => answer?,
            Ok(Err(_)) => {
                return Err(CallbackError::SessionFailed {
                    uid: self.uid.clone(),
                    message: "the offer was dropped".into(),
                });
            }
            Err(_) => {
                let taken = self.sessions.withdraw(&self.uid, self.rental, &self.id);
                let why = if taken == Some(true) {
                    "it took the offer but did not connect back"
                } else {
                    "it is not polling for sessions (not running yet, or a runner without them)"
                };
                return Err(CallbackError::SessionTimeout {
                    uid: self.uid.clone(),
                    after: timeout,
                    why,
                });
            }
        };
        Ok(holding(io, self.slot.take()))
    }
}

impl Drop for Offered<'_> {
    fn drop(&mut self) {
        self.sessions.withdraw(&self.uid, self.rental, &self.id);
    }
}

/// `io`, holding `guard` (a session's place under a cap) until the stream is dropped.
pub fn holding<G: Send + Unpin + 'static>(io: SessionIo, guard: G) -> SessionIo {
    Box::new(Holding { io, _guard: guard })
}

/// A session's stream and what it holds while open.
struct Holding<G> {
    io: SessionIo,
    _guard: G,
}

impl<G: Unpin> AsyncRead for Holding<G> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<G: Unpin> AsyncWrite for Holding<G> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl CallbackHandle {
    /// Whether the runner of binding `uid` can be asked for a session now: the binding is
    /// registered and its runner has neither exited nor been lost. What
    /// [`open_session`](Self::open_session) checks first, without offering anything, so that
    /// a caller can refuse a request before committing to it. Read-only.
    pub fn session_ready(&self, uid: &str) -> Result<(), CallbackError> {
        self.0.can_open_session(uid).map(|_| ())
    }

    /// Asks the runner of binding `uid` to open `request`; resolves with the connection once
    /// the runner has dialled back. Fails at once when the binding is not registered, its
    /// runner has exited or was lost, or it has [`max_sessions_per_binding`] sessions; fails
    /// after [`session_open_timeout`] when the runner does not dial back (it is not polling);
    /// fails when the binding is unregistered meanwhile. Dropping the future withdraws the
    /// offer. Concurrent calls open independent sessions.
    ///
    /// [`max_sessions_per_binding`]: super::CallbackConfig::max_sessions_per_binding
    /// [`session_open_timeout`]: super::CallbackConfig::session_open_timeout
    pub async fn open_session(
        &self,
        uid: &str,
        request: SessionRequest,
    ) -> Result<SessionIo, CallbackError> {
        let limit = self.0.config.max_sessions_per_binding;
        self.offer(uid, request, limit, false).await
    }

    /// [`open_session`](Self::open_session) of a connection to `port` for the binding's relay,
    /// within [`max_relayed_per_binding`](super::CallbackConfig::max_relayed_per_binding)
    /// relayed connections at once, counted apart from the other sessions.
    pub async fn open_relayed(&self, uid: &str, port: u16) -> Result<SessionIo, CallbackError> {
        let limit = self.0.config.max_relayed_per_binding;
        self.offer(uid, SessionRequest::PortForward { port }, limit, true)
            .await
    }

    async fn offer(
        &self,
        uid: &str,
        request: SessionRequest,
        limit: usize,
        relayed: bool,
    ) -> Result<SessionIo, CallbackError> {
        let state = &self.0;
        let rental = state.can_open_session(uid)?;
        let config = &state.config;
        let offered = state.sessions.offer(uid, rental, request, limit, relayed)?;
        tracing::debug!(binding = uid, session = %offered.id, "callback: offered a session");
        offered.wait(config.session_open_timeout).await
    }
}

/// `GET /v1/sessions`: the rental's next offer, or 204 after [`SESSION_POLL`].
pub(super) async fn poll(State(state): AppState, Authed(uid, rental): Authed) -> Response {
    let closing = state.closing.subscribe();
    match state
        .sessions
        .next(&uid, rental, SESSION_POLL, closing)
        .await
    {
        Some(offer) => {
            tracing::debug!(binding = %uid, session = %offer.id, "callback: handed out a session");
            no_store(Json(offer).into_response())
        }
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// `GET /v1/sessions/{id}` with `Upgrade`: 101, and the connection goes to the opener.
pub(super) async fn dial(
    State(state): AppState,
    Authed(uid, rental): Authed,
    Path(id): Path<String>,
    mut request: Request,
) -> Response {
    let upgrade = match upgrade(&mut request, "a session") {
        Ok(upgrade) => upgrade,
        Err(refused) => return *refused,
    };
    // Another binding's session is as unknown as one that never was.
    let Some(reply) = state.sessions.claim(&uid, rental, &id) else {
        return error(StatusCode::NOT_FOUND, "no such session");
    };
    tokio::spawn(async move {
        let io = upgrade.await.map_err(|e| CallbackError::SessionFailed {
            uid: uid.clone(),
            message: format!("the upgrade failed: {e}"),
        });
        let io = io.map(|upgraded| Box::new(hyper_util::rt::TokioIo::new(upgraded)) as SessionIo);
        if reply.send(io).is_err() {
            tracing::debug!(binding = %uid, session = %id, "callback: the opener gave up");
        }
    });
    let headers = [
        (header::CONNECTION, "upgrade"),
        (header::UPGRADE, SESSION_UPGRADE),
    ];
    (StatusCode::SWITCHING_PROTOCOLS, headers).into_response()
}

/// The upgrade of a request for `what` (`a session`), or the answer refusing it: it must ask
/// for `Connection: upgrade` and `Upgrade:` [`SESSION_UPGRADE`] on a connection that can be.
pub(super) fn upgrade(
    request: &mut Request,
    what: &str,
) -> Result<hyper::upgrade::OnUpgrade, Box<Response>> {
    if !asks_for_session(request.headers()) {
        let message = format!("{what} needs Connection: upgrade and Upgrade: {SESSION_UPGRADE}");
        return Err(Box::new(error(StatusCode::UPGRADE_REQUIRED, message)));
    }
    let upgrade = request
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>();
    let cannot = || {
        error(
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded",
        )
    };
    upgrade.ok_or_else(|| Box::new(cannot()))
}

fn asks_for_session(headers: &HeaderMap) -> bool {
    let has = |name, token: &str| {
        headers.get_all(name).iter().any(|value| {
            value
                .to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, SESSION_UPGRADE)
}

#[cfg(test)]
#[path = "sessions_tests.rs"]
mod tests;
