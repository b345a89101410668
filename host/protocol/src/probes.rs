//! The probes a runner runs next to the workload (a Pod's readiness, liveness and startup
//! probes, resolved: named ports are numbers here) and what it reports of them.
//!
//! Opt-in both ways, as restarts in place are: a runner that runs probes asks for them with
//! [`WORKLOAD_PROBES_QUERY`] (an older runner refuses fields it does not know, and is given
//! none), and reports [`ProbeStatus`] only to a node that gave it probes (an older node refuses
//! it likewise).
//!
//! Not behaviour: the runner's `probe` module decides when to probe and what a result means.

use serde::{Deserialize, Serialize};

/// The query a runner that runs probes adds to `GET /v1/workload`, so the node includes
/// [`crate::Workload::probes`].
pub const WORKLOAD_PROBES_QUERY: &str = "probes=run";

/// The container's probes; each absent one is not run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probes {
    /// `readinessProbe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Probe>,
    /// `livenessProbe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<Probe>,
    /// `startupProbe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<Probe>,
}

impl Probes {
    /// Whether there is no probe at all.
    pub fn is_empty(&self) -> bool {
        self.readiness.is_none() && self.liveness.is_none() && self.startup.is_none()
    }
}

/// One probe, with Kubernetes' defaults already applied by the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probe {
    /// What to check.
    pub action: ProbeAction,
    /// Seconds after the container started before the first check.
    pub initial_delay_seconds: u32,
    /// Seconds between checks (at least 1).
    pub period_seconds: u32,
    /// Seconds a check may take (at least 1).
    pub timeout_seconds: u32,
    /// Successes in a row that make a failing probe pass (1 for liveness and startup).
    pub success_threshold: u32,
    /// Failures in a row that make a passing probe fail.
    pub failure_threshold: u32,
}

impl Probe {
    /// A probe with Kubernetes' defaults: no delay, every 10 s, 1 s timeout, thresholds 1 and 3.
    pub fn new(action: ProbeAction) -> Self {
        Self {
            action,
            initial_delay_seconds: 0,
            period_seconds: 10,
            timeout_seconds: 1,
            success_threshold: 1,
            failure_threshold: 3,
        }
    }
}

/// What a probe checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum ProbeAction {
    /// An HTTP GET that passes with a status from 200 to 399.
    #[serde(rename_all = "camelCase")]
    HttpGet {
        /// `http` or `https` (certificates are not verified, as a kubelet does not).
        https: bool,
        /// The host to connect to; the workload's own loopback when empty.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        host: String,
        /// The port.
        port: u16,
        /// The path, with its query.
        path: String,
        /// Extra request headers (name, value).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        headers: Vec<(String, String)>,
    },
    /// A TCP connection that passes once it is established.
    #[serde(rename_all = "camelCase")]
    TcpSocket {
        /// The host; the workload's own loopback when empty.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        host: String,
        /// The port.
        port: u16,
    },
    /// A command run in the container that passes when it exits with 0.
    Exec {
        /// The command and its arguments (no shell).
        command: Vec<String>,
    },
}

/// Which of the container's probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProbeKind {
    /// `readinessProbe`.
    Readiness,
    /// `livenessProbe`.
    Liveness,
    /// `startupProbe`.
    Startup,
}

impl ProbeKind {
    /// As a kubelet's event names it: `Readiness`, `Liveness`, `Startup`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Readiness => "Readiness",
            Self::Liveness => "Liveness",
            Self::Startup => "Startup",
        }
    }
}

/// What a runner that runs probes says of them, with each report of a run (in
/// [`crate::StatusReport::probes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProbeStatus {
    /// The container's `ready`.
    pub ready: bool,
    /// The container's `started` (its startup probe passed, or it has none).
    pub started: bool,
    /// A check that just failed, for the node's `Unhealthy` event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<ProbeFailure>,
}

/// One failed check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProbeFailure {
    /// Which probe.
    pub probe: ProbeKind,
    /// Why, as a kubelet says (`HTTP probe failed with statuscode: 503`).
    pub message: String,
}

impl ProbeFailure {
    /// The note of the node's `Unhealthy` event: `Readiness probe failed: <message>`.
    pub fn note(&self) -> String {
        format!("{} probe failed: {}", self.probe.as_str(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_round_trip_and_a_failure_reads_as_a_kubelet_event() {
        let probes = Probes {
            readiness: Some(Probe::new(ProbeAction::HttpGet {
                https: false,
                host: String::new(),
                port: 8000,
                path: "/health".into(),
                headers: vec![("X-A".into(), "b".into())],
            })),
            liveness: Some(Probe::new(ProbeAction::TcpSocket {
                host: String::new(),
                port: 8000,
            })),
            startup: Some(Probe::new(ProbeAction::Exec {
                command: vec!["true".into()],
            })),
        };
        let json = serde_json::to_string(&probes).expect("json");
        assert!(
            json.contains(r#""httpGet":{"https":false,"port":8000"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Probes>(&json).expect("back"), probes);
        let failure = ProbeFailure {
            probe: ProbeKind::Readiness,
            message: "HTTP probe failed with statuscode: 503".into(),
        };
        assert_eq!(
            failure.note(),
            "Readiness probe failed: HTTP probe failed with statuscode: 503"
        );
    }
}
