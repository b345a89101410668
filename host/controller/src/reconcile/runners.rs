//! The reconciler's side of the runner: the Pod's workload is registered with the callback
//! server before each rental, and the rental carries the runner with its one-time bootstrap
//! token: in a VM's `user_data` (Lambda Cloud), or as a container's start command (RunPod,
//! Vast.ai; for a Pod with an explicit command that has not opted out with
//! `cloud.aibrix.ai/runner: "false"`, since the runner must know what to run and an image's own
//! entrypoint is not known here). The Pod then follows what the runner reports (starting,
//! running, exited with a code, or lost when its heartbeats stop) rather than the instance's
//! state alone.
//!
//! Each boot is a new rental of the binding: it takes the next number (the binding's
//! `status.runnerRental`, written before the instance is rented) and the callback believes only
//! that rental's runner from then on, so the runner of a replaced or lost machine that comes back
//! cannot end, log into, or take sessions of its successor; events of any other rental are
//! ignored here too.
//!
//! After a restart or a leader change, a Pod whose instance an earlier process rented is
//! adopted the first time it is mirrored, with the rental its binding names: its workload is
//! registered again (for a runner that has not fetched it yet) and its runner is given time
//! from now to call in: the heartbeat
//! timeout if the Pod shows it was running, the boot timeout otherwise. Until it calls in, the
//! Pod keeps what it showed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use neocloud_core::{ProviderId, RegistryCredential, WorkloadSpec};
use neocloud_providers::{Boot, ContainerBoot};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::files::{self, PodFiles};
use super::runner_workload::{container_runner, workload};
use neocloud_protocol::ProbeStatus;
use neocloud_remote::callback::{
    CallbackError, CallbackHandle, RunnerEvent, RunnerEventKind, RunnerState, Termination,
};
use neocloud_remote::callback::{UserDataOptions, render_container_start, render_user_data};

/// What the node knows of a binding's runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerStatus {
    /// Registered; the runner has not reported yet (the VM is booting).
    Booting,
    /// The runner has the workload and is starting it.
    Starting,
    /// The workload runs.
    Running,
    /// The workload ended with this code, and the node applies the restart policy (an older
    /// runner, which does not restart in place).
    Exited(i32),
    /// The workload ended with this code for good: the runner applied the restart policy
    /// itself and does not run it again.
    Finished(i32),
    /// The workload ended and the runner restarts it in place after a back-off
    /// ([`Runners::in_place`] says how it ended and how long the wait is).
    BackOff,
    /// The runner authenticated, then stopped sending heartbeats.
    Lost,
    /// The runner never called back within the boot timeout (its bootstrap token expired).
    NeverCalled,
}

#[derive(Debug, Clone)]
struct Entry {
    pod: ObjectRef<Pod>,
    /// The rental followed: events of another are stale.
    rental: u64,
    status: RunnerStatus,
    /// When the reconciler first saw the instance this registration boots.
    launched: Option<Instant>,
    /// The Pod's file mounts, read again while it runs (see `refresh_files`).
    mounts: Vec<neocloud_core::files::FileMount>,
    /// What the runner last said of restarts in place.
    in_place: InPlace,
    /// What its probes last said (`None` from a runner that runs none).
    probes: Option<ProbeStatus>,
    /// The notes of failed checks not yet published as `Unhealthy` events.
    unhealthy: Vec<String>,
}

/// A runner's restarts of the workload on its machine, as it last reported them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InPlace {
    /// How many times it restarted the workload.
    pub restart_count: u32,
    /// When the current run started.
    pub started_at: Option<DateTime<Utc>>,
    /// How the last run that ended did.
    pub last: Option<Termination>,
    /// The wait before the next restart, while backing off.
    pub backoff_seconds: Option<u64>,
}

/// The callback server's handle plus what the reconciler needs to boot runners and follow them.
pub struct Runners {
    handle: CallbackHandle,
    callback_url: String,
    cert_pem: String,
    options: UserDataOptions,
    providers: Vec<ProviderId>,
    containers: Vec<ProviderId>,
    boot_timeout: Duration,
    state: Mutex<HashMap<String, Entry>>,
    /// The Pod controller's one trigger, set when it starts (see `Reconciler::run`). Before
    /// that, a report triggers nothing: the controller's first list reconciles every Pod.
    trigger: Mutex<Option<mpsc::UnboundedSender<ObjectRef<Pod>>>>,
}

impl std::fmt::Debug for Runners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runners")
            .field("callback_url", &self.callback_url)
            .field("providers", &self.providers)
            .field("containers", &self.containers)
            .field("bindings", &self.state.lock().len())
            .finish_non_exhaustive()
    }
}

impl Runners {
    /// Runners for `providers` (the ones that rent VMs) and `containers` (container providers,
    /// for the Pods that can be run so), reaching the node at `callback_url` and trusting
    /// `cert_pem`. A runner that has not called back `boot_timeout` after its instance appeared
    /// is given up (keep the callback's bootstrap tokens valid longer).
    pub fn new(
        handle: CallbackHandle,
        callback_url: impl Into<String>,
        cert_pem: impl Into<String>,
        options: UserDataOptions,
        providers: Vec<ProviderId>,
        containers: Vec<ProviderId>,
        boot_timeout: Duration,
    ) -> Arc<Runners> {
        Arc::new(Runners {
            handle,
            callback_url: callback_url.into(),
            cert_pem: cert_pem.into(),
            options,
            providers,
            containers,
            boot_timeout,
            state: Mutex::new(HashMap::new()),
            trigger: Mutex::new(None),
        })
    }

    /// Whether `pod`, on `provider`, is run by the runner.
    pub fn runs(&self, provider: ProviderId, pod: &Pod) -> bool {
        self.providers.contains(&provider)
            || (self.containers.contains(&provider) && container_runner(pod))
    }

    /// The container providers, which run a Pod through the runner only when it can be.
    pub fn containers(&self) -> &[ProviderId] {
        &self.containers
    }

    /// The providers whose instances the runner runs whatever the Pod.
    pub fn providers(&self) -> &[ProviderId] {
        &self.providers
    }

    /// The callback handle (for logs).
    pub fn handle(&self) -> &CallbackHandle {
        &self.handle
    }

    /// Registers rental `rental` of the Pod's workload (replacing an earlier registration,
    /// whose token, credentials and sessions stop working) and renders what boots its runner: a
    /// VM's `user_data`, and for a Pod a container provider can run through the runner, the
    /// container's start command.
    pub fn boot(
        &self,
        pod: &Pod,
        rental: u64,
        w: &WorkloadSpec,
        env: &[(String, String)],
        files: &PodFiles,
        login: Option<&RegistryCredential>,
    ) -> Result<Boot, CallbackError> {
        let uid = pod.uid().unwrap_or_default();
        let token = self
            .handle
            .register(&uid, rental, workload(pod, w, env, files, login))?;
        let credential = self.handle.credential(&uid, rental)?;
        let entry = Entry {
            pod: ObjectRef::from_obj(pod),
            rental,
            status: RunnerStatus::Booting,
            launched: None,
            mounts: files.mounts.clone(),
            in_place: InPlace::default(),
            probes: None,
            unhealthy: Vec::new(),
        };
        self.state.lock().insert(uid, entry);
        let user_data = render_user_data(
            &self.callback_url,
            &self.cert_pem,
            &token,
            &credential,
            &self.options,
        );
        let container = (!self.containers.is_empty() && container_runner(pod)).then(|| {
            let (command, env) = render_container_start(
                &self.callback_url,
                &self.cert_pem,
                &token,
                &credential,
                &self.options,
            );
            ContainerBoot { command, env }
        });
        Ok(Boot {
            user_data,
            container,
        })
    }

    /// Takes over the runner of rental `rental` of a Pod whose instance an earlier process
    /// rented (see the module doc). Does nothing for a Pod this process already follows.
    pub fn adopt(
        &self,
        pod: &Pod,
        rental: u64,
        w: &WorkloadSpec,
        env: &[(String, String)],
        files: &PodFiles,
        login: Option<&RegistryCredential>,
    ) {
        let uid = pod.uid().unwrap_or_default();
        if self.state.lock().contains_key(&uid) {
            return;
        }
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let known = running.then_some(RunnerState::Running);
        self.handle
            .adopt(&uid, rental, workload(pod, w, env, files, login), known);
        let entry = Entry {
            pod: ObjectRef::from_obj(pod),
            rental,
            status: if running {
                RunnerStatus::Running
            } else {
                RunnerStatus::Booting
            },
            launched: Some(Instant::now()),
            mounts: files.mounts.clone(),
            in_place: InPlace::default(),
            // Until its runner says, a probed Pod keeps the readiness it showed.
            probes: super::probes::for_runner(pod).and(shown_probes(pod)),
            unhealthy: Vec::new(),
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

    /// What the runner of the Pod with this uid last said of its restarts in place.
    pub fn in_place(&self, uid: &str) -> InPlace {
        self.state
            .lock()
            .get(uid)
            .map(|e| e.in_place.clone())
            .unwrap_or_default()
    }

    /// What the probes of the Pod with this uid last said (its container's `ready` and
    /// `started`); `None` when its runner runs no probes or has not said yet.
    pub fn probes(&self, uid: &str) -> Option<ProbeStatus> {
        self.state.lock().get(uid).and_then(|e| e.probes.clone())
    }

    /// The notes of the failed checks of the Pod with this uid since the last call, for its
    /// `Unhealthy` events.
    pub fn take_unhealthy(&self, uid: &str) -> Vec<String> {
        (self.state.lock().get_mut(uid))
            .map(|e| std::mem::take(&mut e.unhealthy))
            .unwrap_or_default()
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

    /// Reads the files of every followed Pod with file volumes again every
    /// [`files::FILES_REFRESH`] and hands a change to the callback, where its runner fetches
    /// it (see `files`). A Pod whose objects cannot be read keeps the files its runner has, as
    /// a kubelet keeps a volume's last content. Runs until the task is dropped.
    pub async fn refresh_files(self: Arc<Self>, client: kube::Client) {
        loop {
            tokio::time::sleep(files::FILES_REFRESH).await;
            let watched: Vec<_> = self
                .state
                .lock()
                .iter()
                .filter(|(_, e)| !e.mounts.is_empty())
                .map(|(uid, e)| (uid.clone(), e.rental, e.pod.clone(), e.mounts.clone()))
                .collect();
            for (uid, rental, pod_ref, mounts) in watched {
                self.refresh_one(&client, &uid, rental, &pod_ref, &mounts)
                    .await;
            }
        }
    }

    async fn refresh_one(
        &self,
        client: &kube::Client,
        uid: &str,
        rental: u64,
        pod_ref: &ObjectRef<Pod>,
        mounts: &[neocloud_core::files::FileMount],
    ) {
        let namespace = pod_ref.namespace.clone().unwrap_or_default();
        let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &namespace);
        let pod = match pods.get_opt(&pod_ref.name).await {
            Ok(Some(pod)) if pod.uid().as_deref() == Some(uid) => pod,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(pod = %pod_ref, error = %e, "runner: cannot read the Pod to refresh its files");
                return;
            }
        };
        match files::resolve(client, &pod, mounts).await {
            Ok(resolved) => {
                if self.handle.set_files(uid, rental, resolved) {
                    tracing::info!(pod = %pod_ref, "runner: the Pod's files changed; its runner fetches them");
                }
            }
            Err(e) => {
                tracing::warn!(pod = %pod_ref, error = %e, "runner: keeping the files the runner has");
            }
        }
    }

    /// Sends the Pods whose runner reported to `trigger`, the Pod controller's.
    pub(super) fn connect(&self, trigger: mpsc::UnboundedSender<ObjectRef<Pod>>) {
        *self.trigger.lock() = Some(trigger);
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
                RunnerState::Exited if report.restarts_in_place => {
                    RunnerStatus::Finished(report.exit_code.unwrap_or(1))
                }
                RunnerState::Exited => RunnerStatus::Exited(report.exit_code.unwrap_or(1)),
                RunnerState::BackOff => RunnerStatus::BackOff,
            },
        };
        let in_place = match &event.kind {
            RunnerEventKind::State(report) => Some(InPlace {
                restart_count: report.restart_count,
                started_at: report.started_at,
                last: report.last_termination.clone(),
                backoff_seconds: report.backoff_seconds,
            }),
            RunnerEventKind::Lost => None,
        };
        let pod = {
            let mut state = self.state.lock();
            let Some(entry) = state.get_mut(&event.uid) else {
                return;
            };
            if entry.rental != event.rental {
                tracing::info!(binding = %event.uid, rental = event.rental, current = entry.rental, "runner: ignored an event of a rental that is no longer current");
                return;
            }
            entry.status = status;
            if let RunnerEventKind::State(report) = &event.kind {
                record_probes(entry, report);
            }
            // A heartbeat's news (no restart count) keeps what the reports said.
            if let Some(news) = in_place.filter(|n| n.restart_count > 0 || n.last.is_some()) {
                entry.in_place = news;
            } else if status == RunnerStatus::Running {
                entry.in_place.backoff_seconds = None;
            }
            entry.pod.clone()
        };
        tracing::info!(pod = %pod, ?status, "runner reported");
        if let Some(trigger) = self.trigger.lock().as_ref() {
            let _ = trigger.send(pod);
        }
    }
}

/// The `ready` and `started` a running Pod shows, as an earlier process wrote them.
fn shown_probes(pod: &Pod) -> Option<ProbeStatus> {
    let c = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    Some(ProbeStatus {
        ready: c.ready,
        started: c.started.unwrap_or(c.ready),
        failure: None,
    })
}

/// Keeps what a report says of the probes (a runner that runs them says so with each report of
/// a run, a new run included); a run's end clears them, and a failed check waits for its
/// event.
fn record_probes(entry: &mut Entry, report: &neocloud_protocol::StatusReport) {
    match &report.probes {
        Some(said) => {
            let mut said = said.clone();
            if let Some(failure) = said.failure.take() {
                // Bounded: the events go out at the next reconcile, which a report triggers.
                if entry.unhealthy.len() < 16 {
                    entry.unhealthy.push(failure.note());
                }
            }
            entry.probes = Some(said);
        }
        None if report.state == RunnerState::Running => {}
        None => entry.probes = None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_login_reaches_the_runner_in_its_workload_and_debug_hides_it() {
        let login = RegistryCredential {
            server: "registry.example.com".into(),
            username: "bot".into(),
            password: "hunter2".into(),
        };
        let w = neocloud_fixtures::workload();
        let files = PodFiles::default();
        let with = workload(&Pod::default(), &w, &[], &files, Some(&login));
        let sent = with.registry_login.clone().expect("the login is sent");
        assert_eq!(
            (sent.server.as_str(), sent.password.as_str()),
            ("registry.example.com", "hunter2")
        );
        assert!(!format!("{with:?}").contains("hunter2"));
        let without = workload(&Pod::default(), &w, &[], &files, None);
        assert!(without.registry_login.is_none());
        // A public image's workload has no such field, for runners from before private images.
        assert!(
            !serde_json::to_string(&without)
                .unwrap()
                .contains("registryLogin")
        );
    }
}
