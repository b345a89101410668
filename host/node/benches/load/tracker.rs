//! Counts a namespace's Pods and how many are Running, from one watch (not repeated lists, which
//! would load the API server and the benchmark's two cores while the nodes are measured).

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

/// Pods seen and Pods Running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub synced: bool,
    pub total: usize,
    pub running: usize,
}

/// A watch on a namespace's Pods; dropping it stops the watch.
#[derive(Debug)]
pub struct Tracker {
    rx: watch::Receiver<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    pub fn start(pods: Api<Pod>) -> Tracker {
        let (tx, rx) = watch::channel(Counts::default());
        let task = tokio::spawn(follow(pods, tx));
        Tracker { rx, task }
    }

    pub async fn wait_synced(&self) {
        let ok = self.wait(Duration::from_secs(60), |c| c.synced).await;
        assert!(ok, "the Pod watch did not sync within 60s");
    }

    pub fn counts(&self) -> Counts {
        *self.rx.borrow()
    }

    /// Waits until `done` holds; false if `within` passes first. Prints the counts every ten
    /// seconds meanwhile.
    pub async fn wait(&self, within: Duration, done: impl Fn(&Counts) -> bool) -> bool {
        let start = tokio::time::Instant::now();
        let mut rx = self.rx.clone();
        loop {
            let left = within.saturating_sub(start.elapsed());
            let step = left.min(Duration::from_secs(10));
            match tokio::time::timeout(step, rx.wait_for(|c| done(c))).await {
                Ok(r) => return r.is_ok(),
                Err(_) if left <= step => return false,
                Err(_) => {
                    let c = self.counts();
                    let t = start.elapsed().as_secs_f64();
                    eprintln!("   {t:>6.1}s: {} pods, {} Running", c.total, c.running);
                }
            }
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn follow(pods: Api<Pod>, tx: watch::Sender<Counts>) {
    let mut running: HashMap<String, bool> = HashMap::new();
    let mut init: HashMap<String, bool> = HashMap::new();
    let mut synced = false;
    let mut stream = watcher::watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                eprintln!("   pod watch error (retrying): {e}");
                continue;
            }
        };
        match event {
            Event::Apply(p) => {
                running.insert(name(&p), is_running(&p));
            }
            Event::Delete(p) => {
                running.remove(&name(&p));
            }
            Event::Init => init.clear(),
            Event::InitApply(p) => {
                init.insert(name(&p), is_running(&p));
            }
            Event::InitDone => {
                running = std::mem::take(&mut init);
                synced = true;
            }
        }
        let counts = Counts {
            synced,
            total: running.len(),
            running: running.values().filter(|r| **r).count(),
        };
        tx.send_replace(counts);
    }
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn is_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}
