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
//! cannot end, log into, or take sessions of its successor.
//!
//! What a runner said is kept in one place, the callback's table (`neocloud_remote::callback`,
//! module `runner`), which its calls write and [`Runners::status`] reads; the callback's events
//! only trigger the Pod's reconcile. This module keeps which Pod a binding is and what it mounts.
//!
//! After a restart or a leader change, a Pod whose instance an earlier process rented is
//! adopted the first time it is mirrored, with the rental its binding names: its workload is
//! registered again (for a runner that has not fetched it yet) and its runner is given time
//! from now to call in: the heartbeat
//! timeout if the Pod shows it was running, the boot timeout otherwise. Until it calls in, the
//! Pod keeps what it showed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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
    CallbackError, CallbackHandle, RunnerEvent, RunnerEventKind, RunnerState,
};
pub use neocloud_remote::callback::{InPlace, RunnerStatus};
use neocloud_remote::callback::{UserDataOptions, render_container_start, render_user_data};

/// Which Pod a followed binding is and what it mounts: for the reports' triggers and the files'
/// refresh. What its runner said is kept in the callback (`CallbackHandle::runner_status`).
#[derive(Debug, Clone)]
struct Followed {
    pod: ObjectRef<Pod>,
    /// The rental whose workload carries the mounts' files.
    rental: u64,
    /// The Pod's file mounts, read again while it runs (see `refresh_files`).
    mounts: Vec<neocloud_core::files::FileMount>,
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
    followed: Mutex<HashMap<String, Followed>>,
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
            .field("bindings", &self.followed.lock().len())
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
            followed: Mutex::new(HashMap::new()),
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
        self.followed
            .lock()
            .insert(uid, followed(pod, rental, files));
        Ok(self.render(&token, &credential, container_runner(pod)))
    }

    /// Registers the machine `slot` (a held binding's `spec.podUid`) rented ahead of its Pod,
    /// and renders what boots its runner, which waits for a Pod (see `hand_over`): a VM's
    /// `user_data`, and with `container` (the Pod can be run through the runner on a container
    /// provider) the container's start command.
    pub fn boot_held(&self, slot: &str, container: bool) -> Result<Boot, CallbackError> {
        let token = self.handle.register_held(slot, 1)?;
        let credential = self.handle.credential(slot, 1)?;
        Ok(self.render(&token, &credential, container))
    }

    fn render(
        &self,
        token: &neocloud_remote::callback::BootstrapToken,
        credential: &neocloud_remote::callback::Secret,
        container: bool,
    ) -> Boot {
        let user_data = render_user_data(
            &self.callback_url,
            &self.cert_pem,
            token,
            credential,
            &self.options,
        );
        let container = (!self.containers.is_empty() && container).then(|| {
            let (command, env) = render_container_start(
                &self.callback_url,
                &self.cert_pem,
                token,
                credential,
                &self.options,
            );
            ContainerBoot { command, env }
        });
        Boot {
            user_data,
            container,
        }
    }

    /// Gives the held machine `slot` to `pod` as rental `rental` of its binding: the Pod's
    /// workload is registered, and the machine's runner, at its next poll, authenticates as the
    /// Pod's runner and runs it. From then on the Pod is followed as one this process booted.
    #[allow(clippy::too_many_arguments)] // what `boot` takes, and the machine
    pub fn hand_over(
        &self,
        pod: &Pod,
        slot: &str,
        rental: u64,
        w: &WorkloadSpec,
        env: &[(String, String)],
        files: &PodFiles,
        login: Option<&RegistryCredential>,
    ) -> Result<(), CallbackError> {
        let uid = pod.uid().unwrap_or_default();
        let workload = workload(pod, w, env, files, login);
        self.handle.hand_over(slot, &uid, rental, workload)?;
        self.followed
            .lock()
            .insert(uid, followed(pod, rental, files));
        Ok(())
    }

    /// What the runner of the held machine `slot` has done; `None` when it is not one here.
    pub fn held(&self, slot: &str) -> Option<neocloud_remote::callback::HeldRunner> {
        self.handle.held(slot)
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
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let known = running.then_some(RunnerState::Running);
        // Until its runner says, a probed Pod keeps the readiness it showed.
        let shown = super::probes::for_runner(pod).and(shown_probes(pod));
        let workload = workload(pod, w, env, files, login);
        if self.handle.adopt(&uid, rental, workload, known, shown) {
            self.followed
                .lock()
                .insert(uid, followed(pod, rental, files));
        }
    }

    /// What the runner of the Pod with this uid last reported, asked once its instance exists
    /// (the boot timeout counts from the first ask, or from adoption); `None` when this process
    /// neither booted nor adopted it (see [`Reconciler::runner_status`], which adopts).
    pub fn status(&self, uid: &str) -> Option<RunnerStatus> {
        self.handle.runner_status(uid, self.boot_timeout)
    }

    /// What the runner of the Pod with this uid last said of its restarts in place.
    pub fn in_place(&self, uid: &str) -> InPlace {
        self.handle.in_place(uid)
    }

    /// What the probes of the Pod with this uid last said (its container's `ready` and
    /// `started`); `None` when its runner runs no probes or has not said yet.
    pub fn probes(&self, uid: &str) -> Option<ProbeStatus> {
        self.handle.probes(uid)
    }

    /// The notes of the failed checks of the Pod with this uid since the last call, for its
    /// `Unhealthy` events.
    pub fn take_unhealthy(&self, uid: &str) -> Vec<String> {
        self.handle.take_unhealthy(uid)
    }

    /// Whether this process follows the runner of the Pod with this uid.
    pub fn follows(&self, uid: &str) -> bool {
        self.handle.is_registered(uid)
    }

    /// How long a runner has to call back.
    pub fn boot_timeout(&self) -> Duration {
        self.boot_timeout
    }

    /// Forgets a binding: its tokens stop working and its log readers finish.
    pub fn forget(&self, uid: &str) {
        self.handle.unregister(uid);
        self.followed.lock().remove(uid);
    }

    /// Reads the files of every followed Pod with file volumes again every
    /// [`files::FILES_REFRESH`] and hands a change to the callback, where its runner fetches
    /// it (see `files`). A Pod whose objects cannot be read keeps the files its runner has, as
    /// a kubelet keeps a volume's last content. Runs until the task is dropped.
    pub async fn refresh_files(self: Arc<Self>, client: kube::Client) {
        loop {
            tokio::time::sleep(files::FILES_REFRESH).await;
            let watched: Vec<_> = self
                .followed
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

    /// Triggers the Pod of each of the callback server's events (the callback keeps what the
    /// runner said, see [`Runners::status`]) until the channel closes.
    pub async fn follow(self: Arc<Self>, mut events: mpsc::Receiver<RunnerEvent>) {
        while let Some(event) = events.recv().await {
            self.notify(&event);
        }
    }

    fn notify(&self, event: &RunnerEvent) {
        let Some(pod) = (self.followed.lock().get(&event.uid)).map(|f| f.pod.clone()) else {
            return;
        };
        match &event.kind {
            RunnerEventKind::Lost => {
                tracing::info!(pod = %pod, rental = event.rental, "runner lost")
            }
            RunnerEventKind::State(report) => {
                tracing::info!(pod = %pod, rental = event.rental, state = ?report.state, exit_code = ?report.exit_code, "runner reported")
            }
        }
        if let Some(trigger) = self.trigger.lock().as_ref() {
            let _ = trigger.send(pod);
        }
    }
}

fn followed(pod: &Pod, rental: u64, files: &PodFiles) -> Followed {
    Followed {
        pod: ObjectRef::from_obj(pod),
        rental,
        mounts: files.mounts.clone(),
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
