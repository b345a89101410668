//! What a runner is given and how the node takes one over: the workload it fetches (environment,
//! files, registry login, restart policy, probes, egress), whether a container provider runs a
//! Pod through it, and adopting, after a restart or a leader change, the runner of a Pod an
//! earlier process rented.
//!
//! Not booting or following runners ([`super::runners`]), nor their state (the callback's).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use neocloud_core::{ProviderId, RegistryCredential, WorkloadSpec};
use neocloud_remote::callback::{EnvVar, RegistryLogin, RestartPolicy, Workload};

use super::files::{self, PodFiles};
use super::runners::RunnerStatus;
use super::{Reconciler, env};

/// Whether a container provider can run `pod` through the runner: its container names a
/// command (the runner must know what to run; the image's entrypoint is not known here) and it
/// has not opted out with `cloud.aibrix.ai/runner: "false"`.
pub fn container_runner(pod: &Pod) -> bool {
    let opted_out = pod
        .annotations()
        .get(RUNNER_ANNOTATION)
        .is_some_and(|v| v.trim() == "false");
    let command = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.command.as_ref())
        .is_some_and(|c| !c.is_empty());
    command && !opted_out
}

/// The annotation that opts a Pod out of the runner on container providers.
pub const RUNNER_ANNOTATION: &str = "cloud.aibrix.ai/runner";

/// What the runner fetches: the workload with its environment, files and registry login
/// resolved, and the Pod's restart policy and probes (the callback gives them only to runners
/// that restart in place and run probes). The login reaches the runner only this way, over its
/// authenticated connection, never in `user_data`.
pub(super) fn workload(
    pod: &Pod,
    w: &WorkloadSpec,
    env: &[(String, String)],
    files: &PodFiles,
    login: Option<&RegistryCredential>,
) -> Workload {
    let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
    Workload {
        restart_policy: RestartPolicy::from_pod(policy),
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
        files: files.files.clone(),
        probes: super::probes::for_runner(pod),
        egress: super::egress::for_runner(pod),
        registry_login: login.map(|l| RegistryLogin {
            server: l.server.clone(),
            username: l.username.clone(),
            password: l.password.clone(),
        }),
    }
}

impl Reconciler {
    /// What the runner of a Pod placed on `provider` last reported, adopting it first (as rental
    /// `rental`, the binding's `status.runnerRental`) if this process has not followed it yet (a
    /// restart or a leader change). `None` when the provider runs no runner, or when adopting
    /// failed (the Pod's environment could not be resolved; it is tried again at the next
    /// reconcile).
    pub(super) async fn runner_status(
        &self,
        pod: &Pod,
        provider: Option<ProviderId>,
        rental: Option<u64>,
    ) -> Option<RunnerStatus> {
        let runners = self.cfg.runners.as_ref()?;
        if !provider.is_some_and(|p| runners.runs(p, pod)) {
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
            let env = match env::resolve(&self.client, &namespace, &w).await {
                Ok(env) => env,
                Err(e) => {
                    tracing::warn!(pod = %ObjectRef::from_obj(pod), error = %e, "runner: cannot adopt");
                    return None;
                }
            };
            let login = match super::pull_secrets::resolve(&self.client, pod, &w.image).await {
                Ok(login) => login,
                Err(e) => {
                    tracing::warn!(pod = %ObjectRef::from_obj(pod), error = %e, "runner: cannot adopt");
                    return None;
                }
            };
            match files::resolve_pod(&self.client, pod).await {
                Ok(files) => {
                    let rental = rental.unwrap_or(0);
                    runners.adopt(pod, rental, &w, &env, &files, login.as_ref());
                }
                Err(e) => {
                    tracing::warn!(pod = %ObjectRef::from_obj(pod), error = %e, "runner: cannot adopt");
                    return None;
                }
            }
        }
        runners.status(&uid)
    }
}
