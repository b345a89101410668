//! The container's readiness, liveness and startup probes, checked for what the runner runs:
//! one `httpGet`, `tcpSocket` or `exec` action each (`grpc` is refused: the runner carries no
//! gRPC client), a port by number or by the name of one of the container's ports, Kubernetes'
//! bounds on the timings, and a `successThreshold` of 1 for liveness and startup. Each refusal
//! names its field and value.
//!
//! Not for whether the Pod runs under the runner at all (the node knows its providers), and
//! not for running them (the runner's `probe` module).

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{PodRefused, Refusal};

/// One of the container's probes, checked.
#[derive(Debug, Clone, Copy)]
pub struct ContainerProbe<'a> {
    /// Its field: `readinessProbe`, `livenessProbe` or `startupProbe`.
    pub field: &'static str,
    /// The probe as the Pod gives it.
    pub probe: &'a Probe,
    /// The port of its `httpGet` or `tcpSocket`, a named one resolved.
    pub port: Option<u16>,
}

/// The probes of the Pod's one container, or every reason they cannot be run.
pub fn probes(
    pod: &k8s_openapi::api::core::v1::Pod,
) -> Result<Vec<ContainerProbe<'_>>, PodRefused> {
    let mut refusals = Vec::new();
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    let found = container.map_or_else(Vec::new, |c| check(c, "spec.containers[0]", &mut refusals));
    if refusals.is_empty() {
        Ok(found)
    } else {
        Err(PodRefused { refusals })
    }
}

/// The field of the container's first probe (`spec.containers[0].readinessProbe`), if any.
pub fn first_probe_field(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    let c = pod.spec.as_ref()?.containers.first()?;
    named(c)
        .into_iter()
        .find_map(|(field, p)| p.map(|_| format!("spec.containers[0].{field}")))
}

fn named(c: &Container) -> [(&'static str, Option<&Probe>); 3] {
    [
        ("readinessProbe", c.readiness_probe.as_ref()),
        ("livenessProbe", c.liveness_probe.as_ref()),
        ("startupProbe", c.startup_probe.as_ref()),
    ]
}

pub(super) fn check<'a>(
    c: &'a Container,
    at: &str,
    out: &mut Vec<Refusal>,
) -> Vec<ContainerProbe<'a>> {
    let mut found = Vec::new();
    for (field, probe) in named(c) {
        let Some(probe) = probe else { continue };
        let at = format!("{at}.{field}");
        let before = out.len();
        check_timings(probe, field != "readinessProbe", &at, out);
        let port = action(c, probe, &at, out);
        if out.len() == before {
            found.push(ContainerProbe { field, probe, port });
        }
    }
    found
}

fn check_timings(p: &Probe, once: bool, at: &str, out: &mut Vec<Refusal>) {
    let fields = [
        ("initialDelaySeconds", p.initial_delay_seconds, 0),
        ("periodSeconds", p.period_seconds, 1),
        ("timeoutSeconds", p.timeout_seconds, 1),
        ("successThreshold", p.success_threshold, 1),
        ("failureThreshold", p.failure_threshold, 1),
    ];
    for (name, value, least) in fields {
        if let Some(v) = value.filter(|v| *v < least) {
            out.push(Refusal::new(
                format!("{at}.{name}"),
                format!("{v} is less than {least}"),
            ));
        }
    }
    if once && let Some(v) = p.success_threshold.filter(|v| *v != 1) {
        let reason = format!("{v}: must be 1 for liveness and startup probes");
        out.push(Refusal::new(format!("{at}.successThreshold"), reason));
    }
}

/// Checks the probe's one action; the port it probes, for `httpGet` and `tcpSocket`.
fn action(c: &Container, p: &Probe, at: &str, out: &mut Vec<Refusal>) -> Option<u16> {
    let set = [
        p.http_get.is_some(),
        p.tcp_socket.is_some(),
        p.exec.is_some(),
        p.grpc.is_some(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        let reason = "exactly one of httpGet, tcpSocket, exec or grpc is required";
        out.push(Refusal::new(at, reason));
        return None;
    }
    if let Some(get) = &p.http_get {
        let scheme = get.scheme.as_deref().unwrap_or("HTTP");
        if !matches!(scheme, "HTTP" | "HTTPS") {
            let reason = format!("{scheme:?} is not HTTP or HTTPS");
            out.push(Refusal::new(format!("{at}.httpGet.scheme"), reason));
        }
        return port(c, &get.port, &format!("{at}.httpGet.port"), out);
    }
    if let Some(tcp) = &p.tcp_socket {
        return port(c, &tcp.port, &format!("{at}.tcpSocket.port"), out);
    }
    if let Some(exec) = &p.exec {
        if exec.command.as_ref().is_none_or(Vec::is_empty) {
            out.push(Refusal::new(
                format!("{at}.exec.command"),
                "a command is required",
            ));
        }
        return None;
    }
    let reason = "grpc probes are not supported (the runner carries no gRPC client); use \
                  httpGet, tcpSocket or exec";
    out.push(Refusal::new(format!("{at}.grpc"), reason));
    None
}

/// A port by number (1 to 65535), or by the name of one of the container's ports.
fn port(c: &Container, port: &IntOrString, at: &str, out: &mut Vec<Refusal>) -> Option<u16> {
    let resolved = match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{n} is not a port (1 to 65535)")),
        IntOrString::String(name) => (c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("{name:?} names none of the container's ports")),
    };
    resolved.map_err(|why| out.push(Refusal::new(at, why))).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(container: serde_json::Value) -> Pod {
        let mut c = json!({"name": "main", "image": "i",
            "ports": [{"name": "http", "containerPort": 8000}]});
        if let serde_json::Value::Object(extra) = container {
            c.as_object_mut().unwrap().extend(extra);
        }
        serde_json::from_value(json!({"spec": {"containers": [c]}})).unwrap()
    }

    fn refused(pod: &Pod) -> Vec<String> {
        let err = probes(pod).expect_err("refused");
        err.refusals.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_named_port_resolves_to_the_container_s_port() {
        let pod = pod(json!({
            "readinessProbe": {"httpGet": {"path": "/h", "port": "http"}},
            "livenessProbe": {"tcpSocket": {"port": 8001}},
        }));
        let found = probes(&pod).expect("accepted");
        let ports: Vec<_> = found.iter().map(|p| (p.field, p.port)).collect();
        assert_eq!(
            ports,
            [
                ("readinessProbe", Some(8000)),
                ("livenessProbe", Some(8001))
            ]
        );
        assert_eq!(
            first_probe_field(&pod).as_deref(),
            Some("spec.containers[0].readinessProbe")
        );
    }

    #[test]
    fn a_named_port_that_does_not_exist_is_refused_naming_the_field_and_value() {
        let pod = pod(json!({"readinessProbe": {"httpGet": {"port": "metrics"}}}));
        assert_eq!(
            refused(&pod),
            [
                "spec.containers[0].readinessProbe.httpGet.port: \"metrics\" names none of the \
              container's ports"
            ]
        );
    }

    #[test]
    fn grpc_a_liveness_success_threshold_and_a_bad_scheme_are_refused() {
        let pod = pod(json!({
            "readinessProbe": {"grpc": {"port": 9000}},
            "livenessProbe": {"exec": {"command": ["true"]}, "successThreshold": 2},
            "startupProbe": {"httpGet": {"port": 8000, "scheme": "FTP"}, "periodSeconds": 0},
        }));
        let said = refused(&pod);
        assert!(
            said[0].starts_with(
                "spec.containers[0].readinessProbe.grpc: grpc probes are not supported"
            ),
            "{said:?}"
        );
        assert_eq!(
            said[1],
            "spec.containers[0].livenessProbe.successThreshold: 2: must be 1 for liveness and startup probes"
        );
        assert_eq!(
            said[2],
            "spec.containers[0].startupProbe.periodSeconds: 0 is less than 1"
        );
        assert_eq!(
            said[3],
            "spec.containers[0].startupProbe.httpGet.scheme: \"FTP\" is not HTTP or HTTPS"
        );
    }

    #[test]
    fn a_probe_without_an_action_or_with_two_is_refused() {
        let pod = pod(json!({
            "readinessProbe": {"periodSeconds": 5},
            "livenessProbe": {"exec": {"command": []}},
        }));
        assert_eq!(
            refused(&pod),
            [
                "spec.containers[0].readinessProbe: exactly one of httpGet, tcpSocket, exec or grpc is required",
                "spec.containers[0].livenessProbe.exec.command: a command is required",
            ]
        );
    }
}
