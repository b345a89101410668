//! A background thread that advances the engine's epoch at a fixed tick while a policy runs, so
//! every store's epoch deadline turns into a wall-clock deadline.
//!
//! It ticks only while a call holds a [`Ticking`] guard and sleeps on a condition variable
//! otherwise: a 1 ms tick that never stopped woke the node a thousand times a second whether or
//! not any policy ran (a tenth of its CPU under load, and nearly all of it when idle). Epoch
//! deadlines count ticks from when a store sets them, and no store runs while it sleeps.
//!
//! Not for anything else; it stops when dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::Engine;

/// Calls in flight, and whether the ticker should stop.
#[derive(Debug, Default)]
struct State {
    active: usize,
    stop: bool,
    /// Whether the thread waits for a call (and so cannot tick until one comes).
    asleep: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Ticks so far.
    ticks: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Owns the ticker thread; dropping it stops and joins the thread.
#[derive(Debug)]
pub(crate) struct EpochTicker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Keeps the epoch advancing while held (one per call in flight).
#[derive(Debug)]
pub(crate) struct Ticking {
    shared: Arc<Shared>,
}

impl Drop for Ticking {
    fn drop(&mut self) {
        self.shared.lock().active -= 1;
    }
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine, tick: Duration) -> Self {
        let shared = Arc::new(Shared::default());
        let ours = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                loop {
                    {
                        let mut state = ours.lock();
                        while state.active == 0 && !state.stop {
                            state.asleep = true;
                            state = ours
                                .wake
                                .wait(state)
                                .unwrap_or_else(PoisonError::into_inner);
                        }
                        state.asleep = false;
                        if state.stop {
                            return;
                        }
                    }
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                    ours.ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
            .expect("spawning the epoch ticker thread");
        Self {
            shared,
            thread: Some(thread),
        }
    }

    /// Starts (or keeps) the epoch advancing until the returned guard is dropped.
    pub(crate) fn ticking(&self) -> Ticking {
        let mut state = self.shared.lock();
        state.active += 1;
        if state.active == 1 {
            self.shared.wake.notify_one();
        }
        Ticking {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Whether no call is in flight.
    #[cfg(test)]
    fn idle(&self) -> bool {
        self.shared.lock().active == 0
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many ticks `wait` saw.
    fn ticks_over(ticker: &EpochTicker, wait: Duration) -> u64 {
        let before = ticker.shared.ticks.load(Ordering::Relaxed);
        std::thread::sleep(wait);
        ticker.shared.ticks.load(Ordering::Relaxed) - before
    }

    /// Waits until the thread has ticked `n` more times (on a loaded machine it may be
    /// scheduled late, so the bound is loose); whether it did within 10 s.
    fn ticks(ticker: &EpochTicker, n: u64) -> bool {
        let before = ticker.shared.ticks.load(Ordering::Relaxed);
        (0..10_000).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            ticker.shared.ticks.load(Ordering::Relaxed) - before >= n
        })
    }

    /// Waits until the thread waits for a call (a tick in progress when the last call ended
    /// may still land before it does); whether it did within 10 s.
    fn falls_asleep(ticker: &EpochTicker) -> bool {
        (0..10_000).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            ticker.shared.lock().asleep
        })
    }

    #[test]
    fn the_epoch_advances_only_while_a_call_holds_the_ticker() {
        let ticker = EpochTicker::start(Engine::default(), Duration::from_millis(1));
        assert!(ticker.idle());
        assert!(falls_asleep(&ticker));
        assert_eq!(ticks_over(&ticker, Duration::from_millis(50)), 0);
        let held = ticker.ticking();
        let also = ticker.ticking();
        assert!(ticks(&ticker, 5), "no ticks while two calls hold it");
        drop(held);
        assert!(ticks(&ticker, 5), "no ticks while one call holds it");
        drop(also);
        assert!(ticker.idle());
        assert!(falls_asleep(&ticker), "it ticks on with no call");
        assert_eq!(ticks_over(&ticker, Duration::from_millis(50)), 0);
        // A call after the sleep wakes it again.
        let again = ticker.ticking();
        assert!(ticks(&ticker, 1), "no ticks after waking");
        drop(again);
        drop(ticker);
    }
}
