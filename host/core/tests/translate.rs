//! Pod -> WorkloadSpec: the supported subset, and every unsupported feature with its exact
//! message.

mod common;

use common::{minimal_pod, to_pod};
use neocloud_core::{
    EnvFromKind, EnvFromRef, EnvValue, EnvVar, KeyRef, PortProtocol, PortSpec, translate_pod,
};
use serde_json::{Value, json};

fn refusals(pod: Value) -> Vec<String> {
    let err = translate_pod(&to_pod(pod)).expect_err("pod should be refused");
    err.refusals.iter().map(ToString::to_string).collect()
}

fn with(edit: impl FnOnce(&mut Value)) -> Value {
    let mut pod = minimal_pod();
    edit(&mut pod);
    pod
}

#[test]
fn a_single_container_gpu_pod_becomes_a_workload() {
    let pod = with(|p| {
        let c = &mut p["spec"]["containers"][0];
        c["command"] = json!(["python"]);
        c["args"] = json!(["train.py", "--epochs", "3"]);
        c["ports"] = json!([{"containerPort": 8080, "name": "http"}, {"containerPort": 9000, "protocol": "UDP"}]);
        c["resources"]["limits"]["nvidia.com/gpu"] = json!("2");
        c["resources"]["limits"]["memory"] = json!("96Gi");
        c["resources"]["requests"] =
            json!({"cpu": "7500m", "memory": "64Gi", "nvidia.com/gpu": "2"});
        p["spec"]["volumes"] = json!([{"name": "kube-api-access", "projected": {"sources": []}}, {"name": "scratch", "emptyDir": {}}]);
    });
    let w = translate_pod(&to_pod(pod)).unwrap();
    assert_eq!(w.image, "pytorch/pytorch:2.4.0");
    assert_eq!(w.command, vec!["python"]);
    assert_eq!(w.args, vec!["train.py", "--epochs", "3"]);
    assert_eq!(w.gpu.count, 2);
    // The other resources as written, GPUs counted apart.
    let pairs = |m: &std::collections::BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(pairs(&w.resources.requests), ["cpu=7500m", "memory=64Gi"]);
    assert_eq!(pairs(&w.resources.limits), ["memory=96Gi"]);
    assert_eq!(
        w.ports,
        vec![
            PortSpec {
                container_port: 8080,
                protocol: PortProtocol::Tcp,
                name: Some("http".into())
            },
            PortSpec {
                container_port: 9000,
                protocol: PortProtocol::Udp,
                name: None
            },
        ]
    );
}

#[test]
fn env_keeps_literals_and_secret_and_configmap_references_unresolved() {
    let pod = with(|p| {
        p["spec"]["containers"][0]["env"] = json!([
            {"name": "MODE", "value": "train"},
            {"name": "EMPTY"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": true}}}
        ]);
        p["spec"]["containers"][0]["envFrom"] =
            json!([{"secretRef": {"name": "creds"}, "prefix": "APP_"}]);
    });
    let w = translate_pod(&to_pod(pod)).unwrap();
    let lit = |v: &str| EnvValue::Literal {
        value: v.to_owned(),
    };
    let key = |n: &str, k: &str, optional| KeyRef {
        name: n.into(),
        key: k.into(),
        optional,
    };
    assert_eq!(
        w.env,
        vec![
            EnvVar {
                name: "MODE".into(),
                value: lit("train")
            },
            EnvVar {
                name: "EMPTY".into(),
                value: lit("")
            },
            EnvVar {
                name: "TOKEN".into(),
                value: EnvValue::SecretKey(key("hf", "token", false))
            },
            EnvVar {
                name: "CFG".into(),
                value: EnvValue::ConfigMapKey(key("cfg", "mode", true))
            },
        ]
    );
    let from = EnvFromRef {
        kind: EnvFromKind::Secret,
        name: "creds".into(),
        prefix: Some("APP_".into()),
        optional: false,
    };
    assert_eq!(w.env_from, vec![from]);
}

#[test]
fn every_unsupported_pod_feature_is_refused_with_its_field_and_value() {
    type Edit = fn(&mut Value);
    let cases: Vec<(Edit, &str)> = vec![
        (
            |p| {
                p["spec"]["volumes"] =
                    json!([{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}])
            },
            "spec.volumes[0]: persistentVolumeClaim is not supported",
        ),
        (
            |p| p["spec"]["volumes"] = json!([{"name": "t", "projected": {"sources": []}}, {"name": "h", "hostPath": {"path": "/data"}}]),
            "spec.volumes[1]: hostPath is not supported",
        ),
        (
            |p| p["spec"]["volumes"] = json!([{"name": "c", "nfs": {"server": "n", "path": "/"}}]),
            "spec.volumes[0]: nfs is not supported",
        ),
        (
            |p| p["spec"]["hostNetwork"] = json!(true),
            "spec.hostNetwork: true is not supported",
        ),
        (
            |p| p["spec"]["hostPID"] = json!(true),
            "spec.hostPID: true is not supported",
        ),
        (
            |p| p["spec"]["hostIPC"] = json!(true),
            "spec.hostIPC: true is not supported",
        ),
        (
            |p| p["spec"]["containers"][0]["securityContext"] = json!({"privileged": true}),
            "spec.containers[0].securityContext.privileged: true is not supported",
        ),
        (
            |p| p["spec"]["initContainers"] = json!([{"name": "setup", "image": "busybox"}]),
            "spec.initContainers[0]: init container \"setup\" is not supported",
        ),
        (
            |p| {
                p["spec"]["initContainers"] =
                    json!([{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}])
            },
            "spec.initContainers[0]: sidecar container \"proxy\" is not supported",
        ),
        (
            |p| p["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "busybox"}]),
            "spec.ephemeralContainers[0]: ephemeral container \"debug\" is not supported",
        ),
        (
            |p| p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u"}]),
            "metadata.ownerReferences[0]: pods owned by DaemonSet \"agent\" are not supported",
        ),
        (
            |p| {
                p["spec"]["containers"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("image");
            },
            "spec.containers[0].image: an image is required",
        ),
        (
            |p| p["spec"]["containers"][0]["image"] = json!("--privileged"),
            "spec.containers[0].image: \"--privileged\" is not an image reference ([registry/]name[:tag][@digest], lower-case name): invalid reference format",
        ),
        (
            |p| p["spec"]["containers"][0]["image"] = json!("ubuntu --network=host"),
            "spec.containers[0].image: \"ubuntu --network=host\" is not an image reference ([registry/]name[:tag][@digest], lower-case name): invalid reference format",
        ),
        (
            |p| p["spec"]["containers"][0]["image"] = json!("ubuntu\nsh"),
            "spec.containers[0].image: \"ubuntu\\nsh\" is not an image reference ([registry/]name[:tag][@digest], lower-case name): invalid reference format",
        ),
        (
            |p| p["spec"]["containers"][0]["image"] = json!("PyTorch/PyTorch"),
            "spec.containers[0].image: \"PyTorch/PyTorch\" is not an image reference ([registry/]name[:tag][@digest], lower-case name): invalid reference format",
        ),
        (
            |p| p["spec"]["containers"][0]["resources"] = json!({}),
            "spec.containers[0].resources.limits[nvidia.com/gpu]: a GPU limit is required",
        ),
        (
            |p| p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("0"),
            "spec.containers[0].resources.limits[nvidia.com/gpu]: 0 GPUs is not supported; at least one is required",
        ),
        (
            |p| p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("500m"),
            "spec.containers[0].resources.limits[nvidia.com/gpu]: \"500m\" is not a whole number of GPUs",
        ),
        (
            |p| p["spec"]["containers"][0]["env"] = json!([{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]),
            "spec.containers[0].env[0].valueFrom.fieldRef: fieldRef is not supported",
        ),
        (
            |p| p["spec"]["containers"][0]["env"] = json!([{"name": "A", "value": "1"}, {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]),
            "spec.containers[0].env[1].valueFrom.resourceFieldRef: resourceFieldRef is not supported",
        ),
        (
            |p| p["spec"]["containers"][0]["envFrom"] = json!([{"prefix": "X_"}]),
            "spec.containers[0].envFrom[0]: exactly one of secretRef or configMapRef is required",
        ),
        (
            |p| {
                p["spec"]["containers"][0]["ports"] =
                    json!([{"containerPort": 22, "hostPort": 2222}])
            },
            "spec.containers[0].ports[0].hostPort: host ports are not supported",
        ),
        (
            |p| {
                p["spec"]["containers"][0]["ports"] =
                    json!([{"containerPort": 3868, "protocol": "SCTP"}])
            },
            "spec.containers[0].ports[0].protocol: \"SCTP\" is not supported (expected TCP or UDP)",
        ),
        (
            |p| p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 70000}]),
            "spec.containers[0].ports[0].containerPort: 70000 is not a port number",
        ),
        (
            |p| {
                p["spec"]["containers"][0]["volumeDevices"] =
                    json!([{"name": "raw", "devicePath": "/dev/xvda"}])
            },
            "spec.containers[0].volumeDevices: block devices are not supported",
        ),
        (
            |p| {
                let c = p["spec"]["containers"][0].clone();
                p["spec"]["containers"] = json!([c.clone(), c]);
            },
            "spec.containers: 2 containers are not supported; exactly one is required",
        ),
        (
            |p| p["spec"]["containers"] = json!([]),
            "spec.containers: 0 containers are not supported; exactly one is required",
        ),
        (
            |p| {
                p.as_object_mut().unwrap().remove("spec");
            },
            "spec: a Pod spec is required",
        ),
    ];
    for (edit, expected) in cases {
        assert_eq!(
            refusals(with(edit)),
            vec![expected.to_owned()],
            "expected {expected}"
        );
    }
}

#[test]
fn every_refusal_is_reported_at_once_in_field_order() {
    let pod = with(|p| {
        p["spec"]["hostNetwork"] = json!(true);
        p["spec"]["volumes"] = json!([{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]);
        p["metadata"]["annotations"] = json!({"cloud.aibrix.ai/max-price": "x"});
    });
    let err = translate_pod(&to_pod(pod)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pod is not supported: metadata.annotations[cloud.aibrix.ai/max-price]: \"x\" is not a positive price in USD per hour; \
         spec.hostNetwork: true is not supported; spec.volumes[0]: persistentVolumeClaim is not supported"
    );
}

#[test]
fn a_gpu_request_without_a_limit_is_counted() {
    let pod = with(|p| {
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"nvidia.com/gpu": "4"}})
    });
    assert_eq!(translate_pod(&to_pod(pod)).unwrap().gpu.count, 4);
}
