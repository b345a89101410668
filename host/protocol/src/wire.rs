//! The callback API's JSON shapes, shared by the server and the runner: the workload a runner
//! fetches, the token exchange, state reports and log records. `Debug` of anything that carries
//! a secret (env values, tokens) is redacted.
//!
//! Not behaviour: the server and the runner decide what to do with these.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a runner runs: one container's image and process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// Container image (the process executor ignores it).
    pub image: String,
    /// Entrypoint override; empty keeps the image's.
    #[serde(default)]
    pub command: Vec<String>,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment, values included (they may be secrets).
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// Working directory; `None` keeps the image's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Files the workload expects (its ConfigMap, Secret and downward-API volumes), by mount.
    /// Absent when there are none, so a runner from before files reads every other workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileMount>,
    /// The Pod's `restartPolicy`, for a runner that restarts the workload in place (it asks
    /// for it with [`WORKLOAD_RESTARTS_QUERY`]; the node leaves it out for runners that do not,
    /// which refuse fields they do not know). `None`, as from an older node, means the runner
    /// never restarts: the node decides, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// The container's probes, for a runner that runs them (it asks with
    /// [`crate::WORKLOAD_PROBES_QUERY`]; the node leaves them out for runners that do not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<crate::Probes>,
    /// The login for the image's registry (the Pod's `imagePullSecrets`), for a runner that
    /// pulls the image itself (the docker executor on a VM). Absent for a public image, so a
    /// runner from before private images reads every other workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_login: Option<RegistryLogin>,
    /// The in-cluster destinations the workload may reach (the Pod's `cloud.aibrix.ai/egress`),
    /// for a runner that serves them (it asks with [`crate::WORKLOAD_EGRESS_QUERY`]; the node
    /// leaves them out for runners that do not). An index into this list names a destination
    /// on `GET /v1/egress/{index}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::EgressTarget>,
}

/// A login to one container registry. `Debug` never shows the password. The node's
/// `neocloud_core::RegistryCredential` on the wire: the runner does not link `neocloud-core`
/// (nor its Kubernetes types), so the protocol keeps its own copy of the three fields.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryLogin {
    /// The registry host (`docker.io`, `ghcr.io`, `registry.example.com:5000`).
    pub server: String,
    /// The user name.
    pub username: String,
    /// The password or token.
    pub password: String,
}

impl fmt::Debug for RegistryLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryLogin")
            .field("server", &self.server)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The query a runner that restarts workloads in place adds to `GET /v1/workload`, so the node
/// includes [`Workload::restart_policy`].
pub const WORKLOAD_RESTARTS_QUERY: &str = "restarts=in-place";

/// A Pod's `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    /// Restart whenever the container ends.
    Always,
    /// Restart when it ends with a non-zero code.
    OnFailure,
    /// Never restart.
    Never,
}

impl RestartPolicy {
    /// The policy a Pod's `spec.restartPolicy` names (Kubernetes' default, `Always`, when
    /// unset); `None` for a value Kubernetes would not accept.
    pub fn from_pod(value: Option<&str>) -> Option<Self> {
        match value {
            None | Some("Always") => Some(Self::Always),
            Some("OnFailure") => Some(Self::OnFailure),
            Some("Never") => Some(Self::Never),
            Some(_) => None,
        }
    }

    /// Whether a container that ended with `exit_code` runs again.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            Self::Always => true,
            Self::OnFailure => exit_code != 0,
            Self::Never => false,
        }
    }
}

/// A directory of files the workload sees at `mount_path`, as a kubelet writes a ConfigMap or
/// Secret volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileMount {
    /// Where the container sees the directory: an absolute path.
    pub mount_path: String,
    /// The files, with paths relative to the mount.
    pub files: Vec<File>,
}

/// One file of a [`FileMount`]. `Debug` shows its path, mode and size, never its content.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// The path relative to the mount (no `..`, not absolute; the runner checks again).
    pub path: String,
    /// Permissions, 0 to 0777.
    pub mode: u32,
    /// The content, base64 in JSON (possibly a secret).
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
}

impl fmt::Debug for File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("File")
            .field("path", &self.path)
            .field("mode", &format_args!("{:o}", self.mode))
            .field("data", &format_args!("<{} bytes>", self.data.len()))
            .finish()
    }
}

mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// One environment variable. `Debug` shows the name only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value, possibly a secret.
    pub value: String,
}

impl EnvVar {
    /// A variable.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
        }
    }
}

impl fmt::Debug for EnvVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=<redacted>", self.name)
    }
}

/// `POST /v1/token` request.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRequest {
    /// The one-time bootstrap token.
    pub bootstrap_token: String,
}

impl fmt::Debug for TokenRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenRequest { bootstrap_token: <redacted> }")
    }
}

/// `POST /v1/token/reauth` request: a runner whose session the node no longer accepts (it
/// expired while the node was away, or the node restarted before its bootstrap token was used).
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReauthRequest {
    /// The binding's re-authentication credential from the VM's `user_data`.
    pub credential: String,
}

impl fmt::Debug for ReauthRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReauthRequest { credential: <redacted> }")
    }
}

/// `POST /v1/heartbeat` body (optional): the state the runner is in, so a node that took over
/// learns it without waiting for the next report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// The runner's current state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RunnerState>,
}

/// `POST /v1/token` response.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenResponse {
    /// The session token for `Authorization: Bearer`.
    pub session_token: String,
    /// Expiry of the session, seconds since the Unix epoch.
    pub expires_at: i64,
    /// The binding's SPIFFE ID.
    pub spiffe_id: String,
    /// A renewal credential for `POST /v1/token/reauth`, bound to this rental and expiring
    /// (`ncr2`): the runner keeps the latest in memory and uses it, in place of the boot
    /// credential of its `user_data`, when the node no longer accepts its session. Absent from
    /// nodes before `ncr2`; a runner then keeps the credential it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

impl fmt::Debug for TokenResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenResponse")
            .field("session_token", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .field("spiffe_id", &self.spiffe_id)
            .field(
                "credential",
                &self.credential.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The workload's lifecycle as a runner reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunnerState {
    /// The runner has the workload and is starting it (pulling the image, spawning).
    Starting,
    /// The workload's process is running.
    Running,
    /// The workload's process ended; `exit_code` says how. Final: the runner will not run it
    /// again.
    Exited,
    /// The workload's process ended and the runner restarts it in place after a back-off
    /// (kubelet's `CrashLoopBackOff`): `last_termination` says how it ended, `backoff_seconds`
    /// how long the runner waits. Sent only to a node that gave a restart policy.
    BackOff,
}

/// `POST /v1/status` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusReport {
    /// The new state.
    pub state: RunnerState,
    /// The exit code, with `Exited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// A short human-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How many times the runner restarted the workload in place (kubelet's `restartCount`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart_count: u32,
    /// When the current run started (with `Running`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// How the last run that ended did (with `BackOff`, and with `Running` after a restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_termination: Option<Termination>,
    /// How long the runner waits before the restart (with `BackOff`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_seconds: Option<u64>,
    /// The runner applied the Pod's restart policy itself (with `Exited`): the exit is final
    /// and the node must not run the workload again elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restarts_in_place: bool,
    /// What the probes say (with `Running`), from a runner that was given probes: a node that
    /// gave none does not know the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<crate::ProbeStatus>,
}

impl StatusReport {
    /// A report of `state` alone.
    pub fn new(state: RunnerState) -> Self {
        Self {
            state,
            exit_code: None,
            message: None,
            restart_count: 0,
            started_at: None,
            last_termination: None,
            backoff_seconds: None,
            restarts_in_place: false,
            probes: None,
        }
    }
}

/// How one run of the workload ended (kubelet's `lastState.terminated`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Termination {
    /// Its exit code.
    pub exit_code: i32,
    /// `Completed` for 0, `Error` otherwise, as a kubelet says.
    pub reason: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: DateTime<Utc>,
}

impl Termination {
    /// A run that started at `started_at` and ended with `exit_code` at `finished_at`.
    pub fn new(exit_code: i32, started_at: DateTime<Utc>, finished_at: DateTime<Utc>) -> Self {
        let reason = if exit_code == 0 { "Completed" } else { "Error" };
        Self {
            exit_code,
            reason: reason.to_owned(),
            started_at,
            finished_at,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Which output stream a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One line of `POST /v1/logs` (newline-delimited JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogRecord {
    /// When the runner read the line (RFC 3339 with nanoseconds).
    pub ts: DateTime<Utc>,
    /// Where it came from.
    pub stream: LogStream,
    /// The line, without its newline.
    pub line: String,
    /// Which run of the workload wrote it: 0 for the first, then one more for each restart in
    /// place (the node keeps the current and the previous run apart for `kubectl logs
    /// --previous`). Left out for 0, so older nodes read the first run's records.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub run: u32,
}

/// An error body: `{"error": "..."}`, with a machine-readable `code` for the refusals a runner
/// acts on ([`RENTAL_NOT_CURRENT`]). Readers of older bodies see no code.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What failed; never contains a secret.
    pub error: String,
    /// What kind of refusal, when a runner must act on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// The [`ErrorBody::code`] of a 403 to a runner whose rental was replaced or declared lost: it
/// must stop its workload and exit, since the node no longer believes it.
pub const RENTAL_NOT_CURRENT: &str = "RentalNotCurrent";

/// The [`ErrorBody::code`] of a 409 to `GET /v1/workload` from the runner of a machine rented
/// ahead of its Pod (held for a ProvisioningRequest): there is no workload yet, and the runner
/// waits on `GET /v1/handover` ([`Handover`]) until a Pod takes the machine.
pub const HELD_FOR_A_POD: &str = "HeldForAPod";

/// `GET /v1/handover` response, to the runner of a machine held for a Pod: empty while no Pod
/// has taken the machine; then the Pod's own bootstrap token and boot credential, with which
/// the runner authenticates again, as the Pod's runner, and fetches the Pod's workload. Each
/// poll is a sign of life, as a heartbeat is.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// The Pod's one-time bootstrap token; `None` while the machine waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_token: Option<String>,
    /// The Pod's boot credential (for `POST /v1/token/reauth` when the token is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

impl fmt::Debug for Handover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |s: &Option<String>| s.as_ref().map(|_| "<redacted>");
        f.debug_struct("Handover")
            .field("bootstrap_token", &shown(&self.bootstrap_token))
            .field("credential", &shown(&self.credential))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_json_is_camel_case_and_debug_hides_env_values() {
        let workload = Workload {
            image: "img".into(),
            env: vec![EnvVar::new("TOKEN", "s3cret")],
            working_dir: Some("/w".into()),
            ..Workload::default()
        };
        let json = serde_json::to_value(&workload).expect("json");
        assert_eq!(json["workingDir"], "/w");
        assert_eq!(
            serde_json::from_value::<Workload>(json).expect("back"),
            workload
        );
        let debug = format!("{workload:?}");
        assert!(
            !debug.contains("s3cret") && debug.contains("TOKEN"),
            "{debug}"
        );
        assert!(
            !json_of(&workload).contains("files"),
            "no files, no field: older runners read it"
        );
    }

    fn json_of(w: &Workload) -> String {
        serde_json::to_string(w).expect("json")
    }

    #[test]
    fn files_travel_as_base64_and_debug_hides_their_content() {
        let workload = Workload {
            files: vec![FileMount {
                mount_path: "/etc/hf".into(),
                files: vec![File {
                    path: "token".into(),
                    mode: 0o400,
                    data: b"hf_s3cret\n".to_vec(),
                }],
            }],
            ..Workload::default()
        };
        let json = json_of(&workload);
        assert!(json.contains(r#""mountPath":"/etc/hf""#), "{json}");
        assert!(json.contains(r#""data":"aGZfczNjcmV0Cg==""#), "{json}");
        assert_eq!(
            serde_json::from_str::<Workload>(&json).expect("back"),
            workload
        );
        let debug = format!("{workload:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(
            debug.contains("mode: 400") && debug.contains("<10 bytes>"),
            "{debug}"
        );
    }

    #[test]
    fn status_reports_refuse_unknown_fields() {
        let err = serde_json::from_str::<StatusReport>(r#"{"state":"Exited","exitCode":0,"x":1}"#)
            .expect_err("unknown field");
        assert!(err.to_string().contains("unknown field `x`"), "{err}");
        let report: StatusReport =
            serde_json::from_str(r#"{"state":"Exited","exitCode":3}"#).expect("report");
        assert_eq!(report.exit_code, Some(3));
        assert_eq!(report.restart_count, 0);
        assert!(!report.restarts_in_place);
    }

    #[test]
    fn a_first_run_s_report_and_log_record_keep_the_old_shape() {
        let report = StatusReport {
            exit_code: Some(1),
            ..StatusReport::new(RunnerState::Exited)
        };
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json, serde_json::json!({"state": "Exited", "exitCode": 1}));
        let record = LogRecord {
            ts: Utc::now(),
            stream: LogStream::Stdout,
            line: "x".into(),
            run: 0,
        };
        let json = serde_json::to_value(&record).expect("json");
        assert!(json.get("run").is_none(), "{json}");
        let workload = serde_json::to_value(Workload::default()).expect("json");
        assert!(workload.get("restartPolicy").is_none(), "{workload}");
    }

    #[test]
    fn restart_policies_read_as_kubernetes_defaults_them() {
        assert_eq!(RestartPolicy::from_pod(None), Some(RestartPolicy::Always));
        assert_eq!(
            RestartPolicy::from_pod(Some("OnFailure")),
            Some(RestartPolicy::OnFailure)
        );
        assert_eq!(RestartPolicy::from_pod(Some("Sometimes")), None);
        assert!(RestartPolicy::Always.restarts(0));
        assert!(RestartPolicy::OnFailure.restarts(2));
        assert!(!RestartPolicy::OnFailure.restarts(0));
        assert!(!RestartPolicy::Never.restarts(2));
    }
}

/// `POST /v1/stats` body: what the workload uses, sampled by the runner. Best effort: a node
/// that does not know the route answers 404 and the runner carries on. A figure the runner
/// could not read is absent, never zero.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStats {
    /// When the sample was taken.
    pub time: DateTime<Utc>,
    /// CPU time the workload's processes used since it started, nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usage_core_nano_seconds: Option<u64>,
    /// CPU use over the last sampling interval, nanocores (1e9 is one core busy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usage_nano_cores: Option<u64>,
    /// Resident memory of the workload's processes, bytes (its working set here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_working_set_bytes: Option<u64>,
    /// The GPUs the workload sees, from `nvidia-smi`; empty when there is none or no tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuStats>,
}

/// One GPU as `nvidia-smi --query-gpu` reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuStats {
    /// The GPU's UUID.
    pub id: String,
    /// Its product name (`NVIDIA A40`).
    pub model: String,
    /// Utilisation over the last sample period, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_percent: Option<u64>,
    /// Memory in use, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_bytes: Option<u64>,
    /// Memory in total, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_bytes: Option<u64>,
}
