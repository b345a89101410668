//! Turns to reconcile, granted first come, first served, without keeping a waiting Pod's
//! reconcile alive.
//!
//! kube-runtime's own concurrency limit parks the reconciles it holds back in a hash set and
//! takes them in hash order, so under sustained load the same Pods win every turn. Waiting
//! inside the reconcile instead (an async semaphore) is fair, but every waiting reconcile is a
//! running one to kube-runtime, whose runner polls each of its running reconciles on every wake:
//! with a thousand Pods due at once that was a thousand polls per wake, about a tenth of the
//! node's CPU. Here a Pod that finds no free turn is queued and its reconcile returns at once;
//! when a turn ends it is handed to the Pod at the head of the queue, which is triggered to
//! reconcile again and finds the turn granted to it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

/// How long a turn handed to a Pod waits for the Pod's reconcile before it goes to the next in
/// line (the Pod may have been deleted between the hand-over and its reconcile).
const GRANT_TTL: Duration = Duration::from_secs(5);

/// Who waits for a turn.
enum Waiter {
    /// A Pod, triggered to reconcile again when its turn comes.
    Pod(ObjectRef<Pod>),
    /// A reconcile that waits in place (the binding controller's, rare), handed the turn.
    Task(oneshot::Sender<Turn>),
}

struct State {
    free: usize,
    waiting: VecDeque<Waiter>,
    /// The Pods in `waiting`, so that a Pod waits once however often it is triggered.
    queued: HashSet<ObjectRef<Pod>>,
    /// Turns handed to Pods whose reconcile has not come for them yet, and since when.
    granted: HashMap<ObjectRef<Pod>, Instant>,
}

/// The node's reconcile turns.
pub(crate) struct Turns {
    state: Mutex<State>,
    /// Set when the controllers start.
    connection: Mutex<Option<Connection>>,
}

/// How turns reach Pods once the controllers run.
#[derive(Clone)]
struct Connection {
    /// Where a Pod whose turn came is sent to be reconciled.
    trigger: mpsc::UnboundedSender<ObjectRef<Pod>>,
    /// The Pod cache: a Pod no longer in it is skipped rather than handed a turn.
    pods: Store<Pod>,
}

/// A turn to reconcile; it ends (and goes to the next in line) when dropped.
pub(crate) struct Turn {
    turns: Option<Arc<Turns>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(turns) = self.turns.take() {
            turns.release();
        }
    }
}

impl Turns {
    /// `count` turns (at least one).
    pub(crate) fn new(count: usize) -> Arc<Turns> {
        Arc::new(Turns {
            state: Mutex::new(State {
                free: count.max(1),
                waiting: VecDeque::new(),
                queued: HashSet::new(),
                granted: HashMap::new(),
            }),
            connection: Mutex::new(None),
        })
    }

    /// Starts handing turns to Pods through `trigger`, skipping Pods no longer in `pods`.
    pub(crate) fn connect(&self, trigger: mpsc::UnboundedSender<ObjectRef<Pod>>, pods: Store<Pod>) {
        *self.connection.lock() = Some(Connection { trigger, pods });
    }

    /// The turn of `pod` if one is free and nobody waits, or if its turn came; otherwise `pod`
    /// joins the queue (once) and `None` is returned: its reconcile should end, and it is
    /// triggered again when its turn comes. Before the controllers run (no trigger), it waits
    /// in place instead.
    pub(crate) async fn pod(self: &Arc<Self>, pod: &ObjectRef<Pod>) -> Option<Turn> {
        if self.connection.lock().is_none() {
            return Some(self.wait().await);
        }
        let (takes, expired) = {
            let mut s = self.state.lock();
            let expired = s.expired(Instant::now());
            let granted = s.granted.remove(pod).is_some();
            let takes = granted || (s.free > 0 && s.waiting.is_empty());
            if !takes && s.queued.insert(pod.clone()) {
                s.waiting.push_back(Waiter::Pod(pod.clone()));
            }
            if takes && !granted {
                s.free -= 1;
            }
            (takes, expired)
        };
        self.hand_over(expired);
        takes.then(|| self.turn())
    }

    /// Waits in line for a turn.
    pub(crate) async fn wait(self: &Arc<Self>) -> Turn {
        let rx = {
            let mut s = self.state.lock();
            if s.free > 0 && s.waiting.is_empty() {
                s.free -= 1;
                return self.turn();
            }
            let (tx, rx) = oneshot::channel();
            s.waiting.push_back(Waiter::Task(tx));
            rx
        };
        // The sender lives in the queue until the turn is sent: it is never dropped unsent
        // (`release` skips only closed ones, whose receiver is gone).
        match rx.await {
            Ok(turn) => turn,
            Err(_) => self.turn(),
        }
    }

    fn turn(self: &Arc<Self>) -> Turn {
        Turn {
            turns: Some(Arc::clone(self)),
        }
    }

    /// Ends a turn: it goes to the first in line who can take it, or becomes free.
    fn release(self: &Arc<Self>) {
        self.hand_over(1);
    }

    /// Hands `count` ended turns on.
    fn hand_over(self: &Arc<Self>, count: usize) {
        for _ in 0..count {
            self.hand_over_one();
        }
    }

    fn hand_over_one(self: &Arc<Self>) {
        let connection = self.connection.lock().clone();
        let mut s = self.state.lock();
        loop {
            match s.waiting.pop_front() {
                None => {
                    s.free += 1;
                    return;
                }
                Some(Waiter::Pod(pod)) => {
                    s.queued.remove(&pod);
                    let Some(c) = &connection else { continue };
                    if c.pods.get(&pod).is_none() {
                        continue;
                    }
                    if c.trigger.send(pod.clone()).is_ok() {
                        s.granted.insert(pod, Instant::now());
                        return;
                    }
                }
                Some(Waiter::Task(tx)) => {
                    if tx.is_closed() {
                        continue;
                    }
                    match tx.send(self.turn()) {
                        Ok(()) => return,
                        // Its receiver went away since: this turn was never taken.
                        Err(mut unsent) => {
                            unsent.turns = None;
                        }
                    }
                }
            }
        }
    }
}

impl State {
    /// Takes back turns handed to Pods that never came for them; returns how many.
    fn expired(&mut self, now: Instant) -> usize {
        let before = self.granted.len();
        self.granted
            .retain(|_, since| now.duration_since(*since) < GRANT_TTL);
        before - self.granted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> ObjectRef<Pod> {
        ObjectRef::new(name).within("ns")
    }

    /// `count` turns connected to a Pod cache holding `cached` (in namespace `ns`), and the
    /// triggers they send.
    fn connected(
        count: usize,
        cached: &[&str],
    ) -> (Arc<Turns>, mpsc::UnboundedReceiver<ObjectRef<Pod>>) {
        let turns = Turns::new(count);
        let (tx, rx) = mpsc::unbounded_channel();
        let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
        for name in cached {
            let mut p = Pod::default();
            p.metadata.name = Some((*name).to_owned());
            p.metadata.namespace = Some("ns".into());
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(p));
        }
        turns.connect(tx, store);
        (turns, rx)
    }

    #[tokio::test]
    async fn pods_beyond_the_free_turns_wait_in_order_and_are_triggered_in_order() {
        let (turns, mut rx) = connected(2, &["a", "b", "c", "d", "e"]);
        let a = turns.pod(&pod("a")).await.expect("a free turn");
        let b = turns.pod(&pod("b")).await.expect("a free turn");
        assert!(turns.pod(&pod("c")).await.is_none());
        assert!(turns.pod(&pod("d")).await.is_none());
        // Triggered again while waiting: it keeps its place, once.
        assert!(turns.pod(&pod("c")).await.is_none());
        assert_eq!(turns.state.lock().waiting.len(), 2);
        drop(b);
        assert_eq!(rx.recv().await, Some(pod("c")));
        // A newcomer does not take the turn handed to c.
        assert!(turns.pod(&pod("e")).await.is_none());
        let c = turns.pod(&pod("c")).await.expect("c's turn came");
        drop(a);
        assert_eq!(rx.recv().await, Some(pod("d")));
        drop(c);
        assert_eq!(rx.recv().await, Some(pod("e")));
        let d = turns.pod(&pod("d")).await.expect("d's turn came");
        let e = turns.pod(&pod("e")).await.expect("e's turn came");
        drop((d, e));
        let s = turns.state.lock();
        assert_eq!((s.free, s.waiting.len(), s.granted.len()), (2, 0, 0));
    }

    #[tokio::test]
    async fn a_pod_gone_from_the_cache_is_skipped() {
        let (turns, mut rx) = connected(1, &["first", "live"]);
        let held = turns.pod(&pod("first")).await.expect("a free turn");
        assert!(turns.pod(&pod("gone")).await.is_none());
        assert!(turns.pod(&pod("live")).await.is_none());
        drop(held);
        assert_eq!(rx.recv().await, Some(pod("live")));
    }

    #[tokio::test]
    async fn a_turn_handed_to_a_pod_that_never_comes_is_taken_back() {
        let (turns, mut rx) = connected(1, &["a", "b", "c", "z"]);
        let held = turns.pod(&pod("a")).await.expect("a free turn");
        assert!(turns.pod(&pod("b")).await.is_none());
        assert!(turns.pod(&pod("c")).await.is_none());
        drop(held);
        assert_eq!(rx.recv().await, Some(pod("b")));
        // b never reconciles; past the grant's lifetime, the next reconcile hands b's turn on.
        turns
            .state
            .lock()
            .granted
            .insert(pod("b"), Instant::now() - GRANT_TTL);
        assert!(turns.pod(&pod("z")).await.is_none());
        assert_eq!(rx.recv().await, Some(pod("c")));
    }

    #[tokio::test]
    async fn a_waiting_task_gets_its_turn_in_line_and_a_cancelled_one_passes_it_on() {
        let (turns, mut rx) = connected(1, &["a", "b"]);
        let held = turns.pod(&pod("a")).await.expect("a free turn");
        let cancelled = tokio::spawn({
            let turns = Arc::clone(&turns);
            async move { turns.wait().await }
        });
        let waiting = tokio::spawn({
            let turns = Arc::clone(&turns);
            async move { turns.wait().await }
        });
        while turns.state.lock().waiting.len() < 2 {
            tokio::task::yield_now().await;
        }
        assert!(turns.pod(&pod("b")).await.is_none());
        cancelled.abort();
        let _ = cancelled.await;
        drop(held);
        let turn = waiting.await.unwrap();
        assert!(
            rx.try_recv().is_err(),
            "b was triggered before the task ahead of it"
        );
        drop(turn);
        assert_eq!(rx.recv().await, Some(pod("b")));
    }
}
