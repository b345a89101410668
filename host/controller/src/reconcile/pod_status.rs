//! The Pod status the node reports, computed from what it knows (no IO): phase, reason and
//! message, the `Initialized`, `ContainersReady` and `Ready` conditions, the
//! `cloud.aibrix.ai/Preempted` condition once a spot instance of the Pod was reclaimed, and the
//! one container's status. Written with server-side apply, so the scheduler's `PodScheduled` stays untouched.
//!
//! A status is only written when it differs from the Pod's (phase, reason, message, readiness,
//! container state), and transition times and start times are kept from the Pod, so a
//! steady Pod costs no writes.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};
use serde_json::{Value, json};

/// What the Pod should say.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPod {
    /// `Pending`, `Running`, `Succeeded` or `Failed`.
    pub phase: &'static str,
    /// The CamelCase reason (`Planning`, `NoOffer`, `Unsupported`...), shown by `kubectl get`.
    pub reason: Option<String>,
    /// A sentence saying why.
    pub message: Option<String>,
    /// The container's state.
    pub container: Container,
    /// The instance's public IP, reported as `podIP` once known (kept by later writes).
    pub pod_ip: Option<String>,
    /// How many times the Pod's container was started again on a new instance (its
    /// `restartCount`, which later writes never lower).
    pub restarts: i32,
    /// Sets the `cloud.aibrix.ai/Preempted` condition with this message (a spot instance of the
    /// Pod was reclaimed). `None` keeps the condition as the Pod has it.
    pub preempted: Option<String>,
    /// How the container's last run ended (`lastState.terminated`), once its runner restarted
    /// it in place. `None` keeps what the Pod says.
    pub last_state: Option<LastState>,
    /// When the running container started (RFC 3339), as its runner said; `None` keeps the
    /// Pod's start, or now.
    pub started_at: Option<String>,
    /// What the container's probes say, as its runner reported: `None` (no probes) makes a
    /// running container ready and started.
    pub probed: Option<Probed>,
    /// Whether the Pod's relay (its cluster address) is ready; `None`: it has none, which
    /// does not hold readiness back.
    pub relay_ready: Option<bool>,
}

/// A running container's `ready` and `started`, as its probes decide them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probed {
    /// Its readiness probe passes (or it has none) and it started.
    pub ready: bool,
    /// Its startup probe passed (or it has none).
    pub started: bool,
}

/// A container's `lastState.terminated`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastState {
    /// Its exit code.
    pub exit_code: i32,
    /// `Completed` or `Error`.
    pub reason: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it ended (RFC 3339).
    pub finished_at: String,
}

/// The waiting reason of a container backing off before a restart in place, as a kubelet's.
pub const CRASH_LOOP: &str = "CrashLoopBackOff";

/// The condition type a Pod carries once a provider reclaimed one of its instances.
pub const PREEMPTED: &str = "cloud.aibrix.ai/Preempted";

/// The container's state as the node reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Container {
    /// Not running yet, with a reason (`Provisioning`, `NoOffer`...).
    Waiting {
        /// Why.
        reason: String,
    },
    /// Running on the rented instance.
    Running,
    /// Ended, and waiting to be restarted in place (`CrashLoopBackOff`).
    BackOff {
        /// kubelet's message: `back-off 10s restarting failed container=...`.
        message: String,
    },
    /// Ended.
    Terminated {
        /// Why.
        reason: String,
        /// The exit code (1 when the provider reports none).
        exit_code: i32,
    },
}

impl DesiredPod {
    /// A Pending Pod whose container waits for `reason`.
    pub fn pending(reason: &str, message: impl Into<String>) -> DesiredPod {
        DesiredPod {
            phase: "Pending",
            reason: Some(reason.to_owned()),
            message: Some(message.into()),
            container: Container::Waiting {
                reason: reason.to_owned(),
            },
            pod_ip: None,
            restarts: 0,
            preempted: None,
            last_state: None,
            started_at: None,
            probed: None,
            relay_ready: None,
        }
    }

    /// A Running, ready Pod.
    pub fn running() -> DesiredPod {
        DesiredPod {
            phase: "Running",
            reason: None,
            message: None,
            container: Container::Running,
            pod_ip: None,
            restarts: 0,
            preempted: None,
            last_state: None,
            started_at: None,
            probed: None,
            relay_ready: None,
        }
    }

    /// A Failed Pod.
    pub fn failed(reason: &str, message: impl Into<String>) -> DesiredPod {
        DesiredPod {
            phase: "Failed",
            reason: Some(reason.to_owned()),
            message: Some(message.into()),
            container: Container::Terminated {
                reason: reason.to_owned(),
                exit_code: 1,
            },
            pod_ip: None,
            restarts: 0,
            preempted: None,
            last_state: None,
            started_at: None,
            probed: None,
            relay_ready: None,
        }
    }

    /// The same, on `instance` after `restarts` replacements: its public IP becomes the
    /// Pod's IP if it is a valid address.
    pub fn on(mut self, instance: &neocloud_core::InstanceState, restarts: usize) -> DesiredPod {
        self.pod_ip = instance
            .public_ip
            .as_deref()
            .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
            .map(str::to_owned);
        self.restarts = i32::try_from(restarts).unwrap_or(i32::MAX);
        self
    }

    /// The same, saying that a provider reclaimed the Pod's instance (`message` says when and
    /// how often).
    pub fn preempted(mut self, message: String) -> DesiredPod {
        self.preempted = Some(message);
        self
    }

    fn ready(&self) -> bool {
        self.container == Container::Running
            && self.probed.is_none_or(|p| p.ready)
            && self.relay_ready.unwrap_or(true)
    }

    fn started(&self) -> bool {
        self.container == Container::Running && self.probed.is_none_or(|p| p.started)
    }
}

/// Whether the Pod's status already says what `want` says.
#[cfg(test)]
pub fn is_current(pod: &Pod, want: &DesiredPod) -> bool {
    stale_field(pod, want).is_none()
}

/// The first field of the Pod's status that does not say what `want` says (`None`: it is
/// current), named for the debug line a status write logs.
pub fn stale_field(pod: &Pod, want: &DesiredPod) -> Option<&'static str> {
    let Some(status) = &pod.status else {
        return Some("status");
    };
    let first = status.container_statuses.as_ref().and_then(|c| c.first());
    let restarts = first.map_or(0, |c| c.restart_count);
    let preempted = || {
        want.preempted.as_ref().is_none_or(|message| {
            status.conditions.iter().flatten().any(|c| {
                c.type_ == PREEMPTED && c.status == "True" && c.message.as_ref() == Some(message)
            })
        })
    };
    if status.phase.as_deref() != Some(want.phase) {
        Some("phase")
    } else if status.reason != want.reason {
        Some("reason")
    } else if status.message != want.message {
        Some("message")
    } else if let Some(field) =
        first.map_or(Some("containerStatuses"), |c| container_stale(c, want))
    {
        Some(field)
    } else if want.pod_ip.is_some() && status.pod_ip != want.pod_ip {
        Some("podIP")
    } else if want.restarts > restarts {
        Some("restartCount")
    } else if !preempted() {
        Some("conditions (Preempted)")
    } else {
        None
    }
}

fn container_stale(c: &ContainerStatus, want: &DesiredPod) -> Option<&'static str> {
    let Some(state) = &c.state else {
        return Some("containerStatuses[0].state");
    };
    let time = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.map(|t| t.0.to_string())
    };
    let same_last = want.last_state.as_ref().is_none_or(|want| {
        c.last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .is_some_and(|t| {
                t.exit_code == want.exit_code
                    && time(t.finished_at.as_ref()).as_ref() == Some(&want.finished_at)
            })
    });
    let same_state = match &want.container {
        Container::Waiting { reason } => state
            .waiting
            .as_ref()
            .is_some_and(|w| w.reason.as_deref() == Some(reason)),
        Container::BackOff { message } => state.waiting.as_ref().is_some_and(|w| {
            w.reason.as_deref() == Some(CRASH_LOOP) && w.message.as_ref() == Some(message)
        }),
        Container::Running => state.running.as_ref().is_some_and(|r| {
            want.started_at.is_none()
                || time(r.started_at.as_ref()).as_ref() == want.started_at.as_ref()
        }),
        Container::Terminated { reason, .. } => state
            .terminated
            .as_ref()
            .is_some_and(|t| t.reason.as_deref() == Some(reason)),
    };
    if c.ready != want.ready() {
        Some("containerStatuses[0].ready")
    } else if c.started != Some(want.started()) {
        Some("containerStatuses[0].started")
    } else if !same_last {
        Some("containerStatuses[0].lastState")
    } else if !same_state {
        Some("containerStatuses[0].state")
    } else {
        None
    }
}

/// The server-side apply body for the Pod's status. `now` is RFC 3339; `host_ip` is the node's
/// address.
pub fn apply_body(pod: &Pod, want: &DesiredPod, host_ip: &str, now: &str) -> Value {
    let status = pod.status.as_ref();
    let start_time = status
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0.to_string())
        .unwrap_or_else(|| now.to_owned());
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let ready = if want.ready() { "True" } else { "False" };
    let condition = |type_: &str, value: &str| {
        let since = conditions
            .iter()
            .find(|c: &&PodCondition| c.type_ == type_ && c.status == value)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| now.to_owned());
        json!({"type": type_, "status": value, "lastTransitionTime": since})
    };
    let old_restarts = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count);
    let pod_ip = want
        .pod_ip
        .clone()
        .or_else(|| status.and_then(|s| s.pod_ip.clone()));
    let (name, image) = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .unwrap_or_default();
    let old = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref());
    let state = match &want.container {
        Container::Waiting { reason } => json!({"waiting": {"reason": reason,
            "message": want.message}}),
        Container::BackOff { message } => json!({"waiting": {"reason": CRASH_LOOP,
            "message": message}}),
        Container::Running => {
            let started = want.started_at.clone().unwrap_or_else(|| {
                old.and_then(|s| s.running.as_ref())
                    .and_then(|r| r.started_at.as_ref())
                    .map(|t| t.0.to_string())
                    .unwrap_or_else(|| now.to_owned())
            });
            json!({"running": {"startedAt": started}})
        }
        Container::Terminated { reason, exit_code } => {
            let started = old
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .map(|t| t.0.to_string());
            json!({"terminated": {"reason": reason, "exitCode": exit_code,
                "message": want.message, "startedAt": started, "finishedAt": now}})
        }
    };
    let mut body = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace},
        "status": {
            "phase": want.phase,
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "startTime": start_time,
            "conditions": [
                condition("Initialized", "True"),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "containerStatuses": [{
                "name": name, "image": image, "imageID": "",
                "ready": want.ready(), "restartCount": want.restarts.max(old_restarts),
                "started": want.started(), "state": state,
            }],
        }
    });
    if let Some(last) = last_state(status, want) {
        body["status"]["containerStatuses"][0]["lastState"] = last;
    }
    if let Some(preempted) = preempted_condition(conditions, want, now)
        && let Some(list) = body["status"]["conditions"].as_array_mut()
    {
        list.push(preempted);
    }
    if let Some(ip) = pod_ip {
        body["status"]["podIP"] = json!(ip);
        body["status"]["podIPs"] = json!([{"ip": ip}]);
    }
    if let Some(reason) = &want.reason {
        body["status"]["reason"] = json!(reason);
    }
    if let Some(message) = &want.message {
        body["status"]["message"] = json!(message);
    }
    body
}

/// The container's `lastState` to write: the one `want` gives, or the Pod's own, carried along
/// (the container status is written whole).
fn last_state(
    status: Option<&k8s_openapi::api::core::v1::PodStatus>,
    want: &DesiredPod,
) -> Option<Value> {
    if let Some(last) = &want.last_state {
        return Some(
            json!({"terminated": {"exitCode": last.exit_code, "reason": last.reason,
            "startedAt": last.started_at, "finishedAt": last.finished_at}}),
        );
    }
    let old = status?
        .container_statuses
        .as_ref()?
        .first()?
        .last_state
        .as_ref()?;
    old.terminated.as_ref()?;
    serde_json::to_value(old).ok()
}

/// The `cloud.aibrix.ai/Preempted` condition to write: the new one `want` asks for (its
/// transition time kept when it was already true), or the Pod's own, carried along unchanged so
/// that later writes (which own the condition list) do not drop it.
fn preempted_condition(conditions: &[PodCondition], want: &DesiredPod, now: &str) -> Option<Value> {
    let old = conditions.iter().find(|c| c.type_ == PREEMPTED);
    let time = |c: &PodCondition| c.last_transition_time.as_ref().map(|t| t.0.to_string());
    match (&want.preempted, old) {
        (Some(message), old) => {
            let since = old
                .filter(|c| c.status == "True")
                .and_then(time)
                .unwrap_or_else(|| now.to_owned());
            Some(
                json!({"type": PREEMPTED, "status": "True", "reason": "SpotReclaimed",
                "message": message, "lastTransitionTime": since}),
            )
        }
        (None, Some(old)) => Some(json!({"type": PREEMPTED, "status": old.status,
            "reason": old.reason, "message": old.message,
            "lastTransitionTime": time(old).unwrap_or_else(|| now.to_owned())})),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests;
