//! The reconciler's side of the VM runner: for a provider that rents bare VMs (Lambda Cloud),
//! the Pod's workload is registered with the callback server before each rental, the VM's
//! `user_data` carries the runner and its one-time bootstrap token, and the Pod follows what the
//! runner reports (starting, running, exited with a code, or lost when its heartbeats stop)
//! rather than the VM's state alone.
//!
//! After a restart or a leader change, a Pod whose instance an earlier process rented is
//! adopted the first time it is mirrored: its workload is registered again (for a runner that
//! has not fetched it yet) and its runner is given time from now to call in: the heartbeat
//! timeout if the Pod shows it was running, the boot timeout otherwise. Until it calls in, the
//! Pod keeps what it showed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use neocloud_core::{ProviderId, WorkloadSpec};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::{Reconciler, env};
use crate::callback::{
    CallbackError, CallbackHandle, EnvVar, RunnerEvent, RunnerEventKind, RunnerState, Workload,
};
use crate::callback::{UserDataOptions, render_user_data};

/// What the node knows of a binding's runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerStatus {
    /// Registered; the runner has not reported yet (the VM is booting).
    Booting,
    /// The runner has the workload and is starting it.
    Starting,
    /// The workload runs.
    Running,
    /// The workload ended with this code.
    Exited(i32),
    /// The runner authenticated, then stopped sending heartbeats.
    Lost,
    /// The runner never called back within the boot timeout (its bootstrap token expired).
    NeverCalled,
}

#[derive(Debug, Clone)]
struct Entry {
    pod: ObjectRef<Pod>,
    status: RunnerStatus,
    /// When the reconciler first saw the instance this registration boots.
    launched: Option<Instant>,
}

/// The callback server's handle plus what the reconciler needs to boot runners and follow them.
pub struct Runners {
    handle: CallbackHandle,
    callback_url: String,
    cert_pem: String,
    options: UserDataOptions,
    providers: Vec<ProviderId>,
    boot_timeout: Duration,
    state: Mutex<HashMap<String, Entry>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Pod>>,
    triggers: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<Pod>>>>,
}

impl std::fmt::Debug for Runners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runners")
            .field("callback_url", &self.callback_url)
            .field("providers", &self.providers)
            .field("bindings", &self.state.lock().len())
            .finish_non_exhaustive()
    }
}

impl Runners {
    /// Runners for `providers` (the ones that rent VMs), reaching the node at `callback_url`
    /// and trusting `cert_pem`. A runner that has not called back `boot_timeout` after its
    /// instance appeared is given up (keep the callback's bootstrap tokens valid longer).
    pub fn new(
        handle: CallbackHandle,
        callback_url: impl Into<String>,
        cert_pem: impl Into<String>,
        options: UserDataOptions,
        providers: Vec<ProviderId>,
        boot_timeout: Duration,
    ) -> Arc<Runners> {
        let (trigger, triggers) = mpsc::unbounded_channel();
        Arc::new(Runners {
            handle,
            callback_url: callback_url.into(),
            cert_pem: cert_pem.into(),
            options,
            providers,
            boot_timeout,
            state: Mutex::new(HashMap::new()),
            trigger,
            triggers: Mutex::new(Some(triggers)),
        })
    }

    /// Whether instances of `provider` are run by the runner.
    pub fn runs_on(&self, provider: ProviderId) -> bool {
        self.providers.contains(&provider)
    }

    /// The providers whose instances the runner runs.
    pub fn providers(&self) -> &[ProviderId] {
        &self.providers
    }

    /// The callback handle (for logs).
    pub fn handle(&self) -> &CallbackHandle {
        &self.handle
    }

    /// Registers the Pod's workload (replacing an earlier registration, whose token stops
    /// working) and renders the `user_data` that boots its runner.
    pub fn boot(
        &self,
        pod: &Pod,
        w: &WorkloadSpec,
        env: &[(String, String)],
    ) -> Result<String, CallbackError> {
        let uid = pod.uid().unwrap_or_default();
        let token = self.handle.register(&uid, workload(w, env))?;
        let credential = self.handle.credential(&uid)?;
        let entry = Entry {
            pod: ObjectRef::from_obj(pod),
            status: RunnerStatus::Booting,
            launched: None,
        };
        self.state.lock().insert(uid, entry);
        Ok(render_user_data(
            &self.callback_url,
            &self.cert_pem,
            &token,
            &credential,
            &self.options,
        ))
    }

    /// Takes over the runner of a Pod whose instance an earlier process rented (see the module
    /// doc). Does nothing for a Pod this process already follows.
    pub fn adopt(&self, pod: &Pod, w: &WorkloadSpec, env: &[(String, String)]) {
        let uid = pod.uid().unwrap_or_default();
        if self.state.lock().contains_key(&uid) {
            return;
        }
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let known = running.then_some(RunnerState::Running);
        self.handle.adopt(&uid, workload(w, env), known);
        let entry = Entry {
            pod: ObjectRef::from_obj(pod),
            status: if running {
                RunnerStatus::Running
            } else {
                RunnerStatus::Booting
            },
            launched: Some(Instant::now()),
        };
        self.state.lock().entry(uid).or_insert(entry);
    }

    /// What the runner of the Pod with this uid last reported, asked once its instance exists
    /// (the boot timeout counts from the first ask, or from adoption); `None` when this process
    /// neither booted nor adopted it (see [`Reconciler::runner_status`], which adopts).
    pub fn status(&self, uid: &str) -> Option<RunnerStatus> {
        let mut state = self.state.lock();
        let entry = state.get_mut(uid)?;
        let launched = *entry.launched.get_or_insert_with(Instant::now);
        Some(match entry.status {
            RunnerStatus::Booting if launched.elapsed() > self.boot_timeout => {
                RunnerStatus::NeverCalled
            }
            other => other,
        })
    }

    /// Whether this process follows the runner of the Pod with this uid.
    pub fn follows(&self, uid: &str) -> bool {
        self.state.lock().contains_key(uid)
    }

    /// How long a runner has to call back.
    pub fn boot_timeout(&self) -> Duration {
        self.boot_timeout
    }

    /// Forgets a binding: its tokens stop working and its log readers finish.
    pub fn forget(&self, uid: &str) {
        self.handle.unregister(uid);
        self.state.lock().remove(uid);
    }

    /// The Pods to reconcile because their runner reported; taken once, by the controller.
    pub(super) fn take_triggers(&self) -> Option<mpsc::UnboundedReceiver<ObjectRef<Pod>>> {
        self.triggers.lock().take()
    }

    /// Applies the callback server's events until the channel closes.
    pub async fn follow(self: Arc<Self>, mut events: mpsc::Receiver<RunnerEvent>) {
        while let Some(event) = events.recv().await {
            self.apply(&event);
        }
    }

    fn apply(&self, event: &RunnerEvent) {
        let status = match &event.kind {
            RunnerEventKind::Lost => RunnerStatus::Lost,
            RunnerEventKind::State(report) => match report.state {
                RunnerState::Starting => RunnerStatus::Starting,
                RunnerState::Running => RunnerStatus::Running,
                RunnerState::Exited => RunnerStatus::Exited(report.exit_code.unwrap_or(1)),
            },
        };
        let pod = {
            let mut state = self.state.lock();
            let Some(entry) = state.get_mut(&event.uid) else {
                return;
            };
            entry.status = status;
            entry.pod.clone()
        };
        tracing::info!(pod = %pod, ?status, "runner reported");
        let _ = self.trigger.send(pod);
    }
}

/// What the runner fetches: the workload with its environment resolved.
fn workload(w: &WorkloadSpec, env: &[(String, String)]) -> Workload {
    Workload {
        image: w.image.clone(),
        command: w.command.clone(),
        args: w.args.clone(),
        env: env
            .iter()
            .map(|(name, value)| EnvVar {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        working_dir: None,
    }
}

impl Reconciler {
    /// What the runner of a Pod placed on `provider` last reported, adopting it first if this
    /// process has not followed it yet (a restart or a leader change). `None` when the provider
    /// runs no runner, or when adopting failed (the Pod's environment could not be resolved; it
    /// is tried again at the next reconcile).
    pub(super) async fn runner_status(
        &self,
        pod: &Pod,
        provider: Option<ProviderId>,
    ) -> Option<RunnerStatus> {
        let runners = self.cfg.runners.as_ref()?;
        if !provider.is_some_and(|p| runners.runs_on(p)) {
            return None;
        }
        let uid = pod.uid().unwrap_or_default();
        if !runners.follows(&uid) {
            let w = match self.workload(pod) {
                Ok((w, _)) => w,
                Err(e) => {
                    tracing::warn!(pod = %ObjectRef::from_obj(pod), error = %e, "runner: cannot adopt");
                    return None;
                }
            };
            let namespace = pod.namespace().unwrap_or_default();
            match env::resolve(&self.client, &namespace, &w).await {
                Ok(env) => runners.adopt(pod, &w, &env),
                Err(e) => {
                    tracing::warn!(pod = %ObjectRef::from_obj(pod), error = %e, "runner: cannot adopt");
                    return None;
                }
            }
        }
        runners.status(&uid)
    }
}
