//! The cap on sessions (exec, forwarded connections) open at once with one Pod whose provider
//! serves them (a remote cluster's Pod), as the runner callback caps them per binding for the
//! Pods it runs. A session holds its place from the moment it is asked for until its stream is
//! dropped.
//!
//! Not the runner's cap (`CallbackConfig::max_sessions_per_binding`), and not what a session
//! carries.

use std::collections::HashMap;
use std::sync::Arc;

use neocloud_remote::callback::SessionIo;
use neocloud_remote::callback::sessions::holding;
use parking_lot::Mutex;

use super::workloads::PodRef;

/// Sessions per Pod unless configured otherwise: the runner callback's default per binding.
pub const DEFAULT_MAX_SESSIONS_PER_POD: usize = 16;

/// How many sessions each Pod has open or opening.
#[derive(Debug, Default, Clone)]
pub(crate) struct PodSessions(Arc<Mutex<HashMap<PodRef, usize>>>);

impl PodSessions {
    /// A place for one more session with `pod`; `None` when it has `limit` already.
    pub(crate) fn take(&self, pod: &PodRef, limit: usize) -> Option<Slot> {
        let mut open = self.0.lock();
        let count = open.entry(pod.clone()).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(Slot {
            sessions: self.clone(),
            pod: pod.clone(),
        })
    }

    #[cfg(test)]
    pub(crate) fn open(&self, pod: &PodRef) -> usize {
        self.0.lock().get(pod).copied().unwrap_or_default()
    }
}

/// One session's place; given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    sessions: PodSessions,
    pod: PodRef,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.sessions.0.lock();
        if let Some(count) = open.get_mut(&self.pod) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.pod);
            }
        }
    }
}

impl Slot {
    /// `io`, holding this place until it is dropped.
    pub(crate) fn hold(self, io: SessionIo) -> SessionIo {
        holding(io, self)
    }
}
