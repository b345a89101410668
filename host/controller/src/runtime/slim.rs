//! What the Pod cache keeps. The cache holds every Pod of the node for as long as it lives (about
//! 9 KiB each as the API server sends them), and the reconciler reads few of their fields: the
//! Pod translation's (containers' images, commands, environment, ports, resources and security
//! contexts; volume kinds, and file volumes whole with their mounts; host namespaces; owners;
//! annotations), the restart policy, and the
//! status fields `pod_status` compares and carries over (phase, reason, message, conditions,
//! start time, the container's state, readiness, `started`, restart count and last state). The
//! rest is dropped before caching.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, Volume};

/// The name prefix of the service account token volume the API server injects.
const INJECTED_TOKEN_VOLUME: &str = "kube-api-access-";

/// Written by `kubectl apply`: the whole previous manifest, never read here.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what the reconciler never reads from a Pod about to be cached.
pub fn slim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    if let Some(spec) = pod.spec.as_mut() {
        spec.tolerations = None;
        spec.affinity = None;
        // The translation refuses volumes by kind and names them by index: the kinds that need
        // nothing written (emptyDir, the service account token's `projected` one the API
        // server injects) keep their name and place but not their (large) source. When every
        // volume is of those kinds (nearly every Pod), none is kept: even empty, a `Volume`
        // takes 3 KiB. File volumes (ConfigMap, Secret, downward API, other projected ones) are
        // kept whole, with the container's mounts of them: the runner writes their files.
        let mut all_bare = true;
        let mut kept = Vec::new();
        for v in spec.volumes.iter_mut().flatten() {
            let injected = v.projected.is_some() && v.name.starts_with(INJECTED_TOKEN_VOLUME);
            if injected || v.empty_dir.is_some() {
                *v = Volume {
                    name: std::mem::take(&mut v.name),
                    ..Volume::default()
                };
            } else {
                all_bare = false;
                kept.push(v.name.clone());
            }
        }
        if all_bare {
            spec.volumes = None;
        }
        for c in &mut spec.containers {
            match c.volume_mounts.as_mut() {
                Some(mounts) if !kept.is_empty() => mounts.retain(|m| kept.contains(&m.name)),
                _ => c.volume_mounts = None,
            }
            c.termination_message_path = None;
            c.termination_message_policy = None;
            c.image_pull_policy = None;
        }
    }
    if let Some(status) = pod.status.as_mut() {
        // Conditions and start time stay: the status written back keeps their times.
        status.host_ips = None;
        status.pod_ips = None;
        status.qos_class = None;
        for c in status.container_statuses.iter_mut().flatten() {
            // Every field `pod_status::stale_field` compares: one dropped here reads as stale on
            // each reconcile, and the status is written again (the load bench found `started`).
            *c = ContainerStatus {
                name: std::mem::take(&mut c.name),
                ready: c.ready,
                started: c.started,
                restart_count: c.restart_count,
                last_state: c.last_state.take(),
                state: c.state.take(),
                ..ContainerStatus::default()
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::pod_status::{DesiredPod, apply_body, is_current};
    use neocloud_core::translate_pod;
    use serde_json::json;

    /// A Pod as the API server returns it once admitted, defaulted and given a status.
    fn full_pod(extra_volume: &serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "train", "namespace": "ml", "uid": "u-1", "resourceVersion": "42",
                "annotations": {
                    "cloud.aibrix.ai/max-price": "2.5",
                    LAST_APPLIED: "{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}"
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
            },
            "spec": {
                "nodeName": "neocloud",
                "restartPolicy": "OnFailure",
                "containers": [{
                    "name": "main", "image": "nvcr.io/nvidia/pytorch:24.01",
                    "command": ["python", "train.py"], "args": ["--epochs", "3"],
                    "env": [{"name": "A", "value": "1"}],
                    "ports": [{"containerPort": 8080}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                    "volumeMounts": [{"name": "kube-api-access-x", "mountPath": "/var/run/secrets"}]
                }],
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
                "volumes": [
                    {"name": "kube-api-access-x", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
                    ]}},
                    extra_volume
                ]
            },
            "status": {
                "phase": phase,
                "reason": "Provisioning",
                "message": "waiting",
                "hostIP": "10.0.0.1",
                "startTime": "2026-12-03T09:00:00Z",
                "conditions": [{"type": "Ready", "status": "False",
                    "lastTransitionTime": "2026-12-03T09:00:01Z"}],
                "containerStatuses": [{
                    "name": "main", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                    "state": {"running": {"startedAt": "2026-12-03T09:00:02Z"}}
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_slim_pod_translates_and_compares_as_the_full_one() {
        for (extra, phase) in [
            (json!({"name": "scratch", "emptyDir": {}}), "Pending"),
            (
                json!({"name": "data", "persistentVolumeClaim": {"claimName": "d"}}),
                "Pending",
            ),
        ] {
            let full = full_pod(&extra, phase);
            let mut slim = full.clone();
            slim_pod(&mut slim);
            assert_eq!(
                format!("{:?}", translate_pod(&full)),
                format!("{:?}", translate_pod(&slim))
            );
            for want in [
                DesiredPod::pending("Provisioning", "waiting"),
                DesiredPod::pending("Provisioning", "other"),
                DesiredPod::running(),
                DesiredPod::failed("Error", "waiting"),
            ] {
                assert_eq!(
                    is_current(&full, &want),
                    is_current(&slim, &want),
                    "{want:?}"
                );
                let now = "2026-12-03T10:00:00Z";
                assert_eq!(
                    apply_body(&full, &want, "10.0.0.9", now),
                    apply_body(&slim, &want, "10.0.0.9", now)
                );
            }
            let text = serde_json::to_string(&slim).unwrap();
            for gone in [
                "managedFields",
                LAST_APPLIED,
                "serviceAccountToken",
                "mountPath",
                "tolerations",
            ] {
                assert!(!text.contains(gone), "{gone} is still cached: {text}");
            }
            assert_eq!(
                slim.spec.as_ref().unwrap().restart_policy.as_deref(),
                Some("OnFailure")
            );
            assert_eq!(slim.metadata.uid.as_deref(), Some("u-1"));
            // Only a refused volume keeps the list (its index names it in the refusal).
            let kept = slim.spec.as_ref().unwrap().volumes.as_ref().map(Vec::len);
            let refused = extra.get("persistentVolumeClaim").is_some();
            assert_eq!(kept, refused.then_some(2), "{extra}");
        }
    }

    /// What the node writes, read back through the cache, says what it wrote: otherwise every
    /// reconcile of the Pod writes its status again (one more request per Pod on the load bench
    /// when `started` was dropped).
    #[test]
    fn every_status_the_node_writes_is_current_once_cached_slim() {
        use crate::reconcile::pod_status::{Container, LastState, Probed};
        let full = full_pod(&json!({"name": "scratch", "emptyDir": {}}), "Pending");
        let mut restarted = DesiredPod::running();
        restarted.restarts = 2;
        restarted.started_at = Some("2026-12-03T09:30:00Z".into());
        restarted.last_state = Some(LastState {
            exit_code: 3,
            reason: "Error".into(),
            started_at: "2026-12-03T09:10:00Z".into(),
            finished_at: "2026-12-03T09:20:00Z".into(),
        });
        let mut probing = DesiredPod::running();
        probing.probed = Some(Probed {
            ready: false,
            started: false,
        });
        let mut backing_off = restarted.clone();
        backing_off.container = Container::BackOff {
            message: "back-off 10s restarting failed container=main pod=train_ml(u-1)".into(),
        };
        for want in [
            DesiredPod::pending("Provisioning", "waiting"),
            DesiredPod::running(),
            restarted,
            probing,
            backing_off,
            DesiredPod::failed("Error", "exited"),
        ] {
            let body = apply_body(&full, &want, "10.0.0.9", "2026-12-03T10:00:00Z");
            let mut written = full.clone();
            written.status = Some(serde_json::from_value(body["status"].clone()).unwrap());
            assert!(is_current(&written, &want), "as written: {want:?}");
            slim_pod(&mut written);
            assert!(is_current(&written, &want), "cached slim: {want:?}");
        }
    }

    #[test]
    fn file_volumes_and_their_mounts_survive_the_slim_pod() {
        let extra = json!({"name": "tpl", "configMap": {"name": "chat"}});
        let mut full = full_pod(&extra, "Pending");
        let container = &mut full.spec.as_mut().unwrap().containers[0];
        container.volume_mounts.get_or_insert_with(Vec::new).push(
            serde_json::from_value(json!({"name": "tpl", "mountPath": "/etc/vllm"})).unwrap(),
        );
        let mut slim = full.clone();
        slim_pod(&mut slim);
        let mounts = neocloud_core::file_mounts(&slim).unwrap();
        assert_eq!(mounts, neocloud_core::file_mounts(&full).unwrap());
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].mount_path, "/etc/vllm");
        let text = serde_json::to_string(&slim).unwrap();
        assert!(!text.contains("serviceAccountToken"), "{text}");
        assert!(!text.contains("/var/run/secrets"), "{text}");
    }
}
