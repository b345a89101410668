//! The kubelet's two usage endpoints, rendered from the runners' samples: `/stats/summary`
//! (the Summary API's JSON: node, then Pods with their container's CPU, memory and
//! accelerators) and `/metrics/resource` (the Prometheus text metrics-server scrapes). A figure
//! the runner could not read is left out, never reported as zero. The node itself reports no
//! usage: a virtual node has no machine of its own.
//!
//! Not sampling (the runner's) nor authorization (the server's).

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::PodUsage;

fn rfc3339(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn cpu(u: &PodUsage) -> Value {
    let mut cpu = json!({"time": rfc3339(&u.stats.time)});
    if let Some(n) = u.stats.cpu_usage_nano_cores {
        cpu["usageNanoCores"] = json!(n);
    }
    if let Some(n) = u.stats.cpu_usage_core_nano_seconds {
        cpu["usageCoreNanoSeconds"] = json!(n);
    }
    cpu
}

fn memory(u: &PodUsage) -> Value {
    let mut memory = json!({"time": rfc3339(&u.stats.time)});
    if let Some(n) = u.stats.memory_working_set_bytes {
        memory["workingSetBytes"] = json!(n);
        memory["rssBytes"] = json!(n);
        memory["usageBytes"] = json!(n);
    }
    memory
}

/// The Summary API's body for node `node` and these Pods.
pub(super) fn summary(node: &str, pods: &[PodUsage]) -> Value {
    let pods: Vec<Value> = pods
        .iter()
        .map(|u| {
            let accelerators: Vec<Value> = u
                .stats
                .gpus
                .iter()
                .map(|g| {
                    let mut a = json!({"make": "nvidia", "model": g.model, "id": g.id});
                    if let Some(v) = g.memory_total_bytes {
                        a["memoryTotal"] = json!(v);
                    }
                    if let Some(v) = g.memory_used_bytes {
                        a["memoryUsed"] = json!(v);
                    }
                    if let Some(v) = g.utilization_percent {
                        a["dutyCycle"] = json!(v);
                    }
                    a
                })
                .collect();
            let mut container = json!({"name": u.container, "cpu": cpu(u), "memory": memory(u)});
            if !accelerators.is_empty() {
                container["accelerators"] = json!(accelerators);
            }
            json!({
                "podRef": {"name": u.name, "namespace": u.namespace, "uid": u.uid},
                "containers": [container],
                "cpu": cpu(u),
                "memory": memory(u),
            })
        })
        .collect();
    json!({"node": {"nodeName": node, "systemContainers": []}, "pods": pods})
}

/// The Prometheus text metrics-server reads from `/metrics/resource`: per container and per Pod
/// CPU seconds and working set, with the sample's time.
pub(super) fn resource_metrics(pods: &[PodUsage]) -> String {
    let mut cpu = String::new();
    let mut mem = String::new();
    let mut pod_cpu = String::new();
    let mut pod_mem = String::new();
    for u in pods {
        let ms = u.stats.time.timestamp_millis();
        let labels = format!(
            "container=\"{}\",namespace=\"{}\",pod=\"{}\"",
            escape(&u.container),
            escape(&u.namespace),
            escape(&u.name)
        );
        let pod_labels = format!(
            "namespace=\"{}\",pod=\"{}\"",
            escape(&u.namespace),
            escape(&u.name)
        );
        if let Some(ns) = u.stats.cpu_usage_core_nano_seconds {
            let seconds = ns as f64 / 1e9;
            let _ = writeln!(
                cpu,
                "container_cpu_usage_seconds_total{{{labels}}} {seconds} {ms}"
            );
            let _ = writeln!(
                pod_cpu,
                "pod_cpu_usage_seconds_total{{{pod_labels}}} {seconds} {ms}"
            );
        }
        if let Some(bytes) = u.stats.memory_working_set_bytes {
            let _ = writeln!(
                mem,
                "container_memory_working_set_bytes{{{labels}}} {bytes} {ms}"
            );
            let _ = writeln!(
                pod_mem,
                "pod_memory_working_set_bytes{{{pod_labels}}} {bytes} {ms}"
            );
        }
    }
    let mut out = String::new();
    for (name, kind, help, body) in [
        (
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the container in core-seconds",
            cpu,
        ),
        (
            "container_memory_working_set_bytes",
            "gauge",
            "Current working set of the container in bytes",
            mem,
        ),
        (
            "pod_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the pod in core-seconds",
            pod_cpu,
        ),
        (
            "pod_memory_working_set_bytes",
            "gauge",
            "Current working set of the pod in bytes",
            pod_mem,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        out.push_str(&body);
    }
    out.push_str("# HELP scrape_error 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE scrape_error gauge\nscrape_error 0\n");
    out
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use neocloud_protocol::{GpuStats, WorkloadStats};

    use super::*;

    fn usage(cpu: Option<u64>, gpus: Vec<GpuStats>) -> PodUsage {
        PodUsage {
            namespace: "ml".into(),
            name: "train".into(),
            uid: "u-1".into(),
            container: "main".into(),
            stats: WorkloadStats {
                time: "2026-12-04T10:00:00Z".parse().unwrap(),
                cpu_usage_core_nano_seconds: cpu,
                cpu_usage_nano_cores: cpu.map(|_| 250_000_000),
                memory_working_set_bytes: Some(64 << 20),
                gpus,
            },
        }
    }

    #[test]
    fn the_summary_has_the_pod_its_container_and_its_gpus_and_omits_what_is_unknown() {
        let gpu = GpuStats {
            id: "GPU-1".into(),
            model: "NVIDIA A40".into(),
            utilization_percent: Some(87),
            memory_used_bytes: None,
            memory_total_bytes: Some(48 << 30),
        };
        let body = summary("vnode", &[usage(Some(3_000_000_000), vec![gpu])]);
        assert_eq!(body["node"]["nodeName"], "vnode");
        let pod = &body["pods"][0];
        assert_eq!(
            pod["podRef"],
            json!({"name": "train", "namespace": "ml", "uid": "u-1"})
        );
        let c = &pod["containers"][0];
        assert_eq!(c["name"], "main");
        assert_eq!(c["cpu"]["usageCoreNanoSeconds"], 3_000_000_000u64);
        assert_eq!(c["cpu"]["usageNanoCores"], 250_000_000u64);
        assert_eq!(c["memory"]["workingSetBytes"], 64u64 << 20);
        assert_eq!(c["accelerators"][0]["dutyCycle"], 87);
        assert!(c["accelerators"][0].get("memoryUsed").is_none(), "{c}");

        let body = summary("vnode", &[usage(None, vec![])]);
        let c = &body["pods"][0]["containers"][0];
        assert!(c["cpu"].get("usageCoreNanoSeconds").is_none(), "{c}");
        assert!(c.get("accelerators").is_none(), "{c}");
    }

    #[test]
    fn resource_metrics_are_prometheus_text_with_the_sample_time() {
        let text = resource_metrics(&[usage(Some(1_500_000_000), vec![])]);
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"main\",namespace=\"ml\",pod=\"train\"} 1.5 1796378400000\n"
        ), "{text}");
        assert!(text.contains("pod_memory_working_set_bytes{namespace=\"ml\",pod=\"train\"} 67108864 1796378400000\n"), "{text}");
        assert!(text.ends_with("scrape_error 0\n"), "{text}");
        let without = resource_metrics(&[usage(None, vec![])]);
        assert!(
            !without.contains("container_cpu_usage_seconds_total{"),
            "{without}"
        );
    }
}
