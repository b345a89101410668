//! The Pod's probes on their way to its runner: the checked probes of `neocloud-core` with
//! Kubernetes' defaults applied, as the runner's wire types; and the refusal of a Pod whose
//! probes would not be run because no runner would run it (a node without runners, or a Pod
//! a container provider runs natively), naming the probe's field. Probes are never silently
//! ignored.
//!
//! Not the running of probes (the runner) and not what their results do to the Pod's status
//! (`mirror`, `pod_status`).

use k8s_openapi::api::core::v1::Pod;
use neocloud_protocol::{Probe, ProbeAction, Probes};

use super::runner_workload::container_runner;
use super::runners::Runners;

/// The Pod's probes as its runner runs them; `None` when it has none (or they are refused,
/// which admission already said).
pub(super) fn for_runner(pod: &Pod) -> Option<Probes> {
    let found = neocloud_core::translate::probes(pod).ok()?;
    let mut probes = Probes::default();
    for p in found {
        let Some(action) = action(p.probe, p.port) else {
            continue;
        };
        let k = p.probe;
        let or =
            |v: Option<i32>, default: u32| v.and_then(|v| u32::try_from(v).ok()).unwrap_or(default);
        let probe = Probe {
            action,
            initial_delay_seconds: or(k.initial_delay_seconds, 0),
            period_seconds: or(k.period_seconds, 10),
            timeout_seconds: or(k.timeout_seconds, 1),
            success_threshold: or(k.success_threshold, 1),
            failure_threshold: or(k.failure_threshold, 3),
        };
        let slot = match p.field {
            "readinessProbe" => &mut probes.readiness,
            "livenessProbe" => &mut probes.liveness,
            _ => &mut probes.startup,
        };
        *slot = Some(probe);
    }
    (!probes.is_empty()).then_some(probes)
}

fn action(k: &k8s_openapi::api::core::v1::Probe, port: Option<u16>) -> Option<ProbeAction> {
    if let Some(get) = &k.http_get {
        let headers = (get.http_headers.iter().flatten())
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        return Some(ProbeAction::HttpGet {
            https: get.scheme.as_deref() == Some("HTTPS"),
            host: get.host.clone().unwrap_or_default(),
            port: port?,
            path: get.path.clone().unwrap_or_else(|| "/".to_owned()),
            headers,
        });
    }
    if let Some(tcp) = &k.tcp_socket {
        return Some(ProbeAction::TcpSocket {
            host: tcp.host.clone().unwrap_or_default(),
            port: port?,
        });
    }
    let command = k.exec.as_ref()?.command.clone()?;
    Some(ProbeAction::Exec { command })
}

/// Why the Pod's probes cannot be honoured on this node (no runner would run them), naming
/// the first probe's field; `None` when they can, or when it has none. A remote cluster's
/// kubelet runs the probes of the Pods placed there (their `Ready` is mirrored), so the `kube`
/// provider honours them too.
pub(super) fn unhonoured(pod: &Pod, runners: Option<&Runners>) -> Option<String> {
    let field = neocloud_core::translate::first_probe_field(pod)?;
    // A remote cluster's kubelet runs them itself: only the clouds need a runner.
    let why = without_runner(pod, runners, false)?;
    Some(format!(
        "pod is not supported: {field}: probes are run by the runner, and {why}"
    ))
}

/// Why no runner would run `pod` on this node, as the end of a sentence; `None` when one
/// would (what probes and egress need).
pub(super) fn without_runner(
    pod: &Pod,
    runners: Option<&Runners>,
    remote_cluster: bool,
) -> Option<&'static str> {
    match runners {
        None => Some("this node runs none (configure a runner)"),
        Some(r) if !r.containers().is_empty() && !container_runner(pod) => Some(
            "a container provider would run this Pod without it (give the container a \
             command, and do not set cloud.aibrix.ai/runner: \"false\")",
        ),
        Some(_) if remote_cluster => Some(
            "the kube provider would run this Pod on a remote cluster without it (leave kube \
             out of cloud.aibrix.ai/providers)",
        ),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_kubernetes_and_a_named_port_is_its_number() {
        let pod: Pod = serde_json::from_value(json!({"spec": {"containers": [{
            "name": "main", "image": "i", "ports": [{"name": "http", "containerPort": 8000}],
            "readinessProbe": {"httpGet": {"port": "http", "scheme": "HTTPS",
                "httpHeaders": [{"name": "X-A", "value": "b"}]}, "periodSeconds": 2},
            "livenessProbe": {"exec": {"command": ["true"]}},
        }]}}))
        .unwrap();
        let probes = for_runner(&pod).expect("probes");
        let readiness = probes.readiness.expect("readiness");
        assert_eq!(
            readiness.action,
            ProbeAction::HttpGet {
                https: true,
                host: String::new(),
                port: 8000,
                path: "/".into(),
                headers: vec![("X-A".into(), "b".into())],
            }
        );
        assert_eq!(
            (readiness.period_seconds, readiness.timeout_seconds),
            (2, 1)
        );
        let liveness = probes.liveness.expect("liveness");
        assert_eq!(
            (liveness.period_seconds, liveness.failure_threshold),
            (10, 3)
        );
        assert!(probes.startup.is_none());
        let refused = unhonoured(&pod, None).expect("no runner");
        assert!(
            refused.starts_with("pod is not supported: spec.containers[0].readinessProbe: probes are run by the runner"),
            "{refused}"
        );
    }
}
