//! File volumes in translation: ConfigMap, Secret, downward-API and projected volumes are
//! accepted with their items, modes and `optional`, at the container's mount paths; a
//! service-account token, unsafe paths, bad modes and `subPath` are refused naming the field;
//! building the files enforces the Pod's size bound, naming the volume.

mod common;

use std::collections::BTreeMap;

use common::{minimal_pod, to_pod};
use neocloud_core::files::{
    DownwardItem, FileMount, FileSource, FilesError, KeyPath, MAX_POD_FILE_BYTES, ObjectData, build,
};
use neocloud_core::{EnvFromKind, file_mounts, translate_pod};
use serde_json::{Value, json};

fn pod(volumes: Value, mounts: Value) -> Value {
    let mut p = minimal_pod();
    p["spec"]["volumes"] = volumes;
    p["spec"]["containers"][0]["volumeMounts"] = mounts;
    p
}

fn refusals(p: Value) -> Vec<String> {
    let err = translate_pod(&to_pod(p)).expect_err("pod should be refused");
    err.refusals.iter().map(ToString::to_string).collect()
}

#[test]
fn each_file_volume_kind_is_accepted_with_items_modes_and_optional() {
    let p = pod(
        json!([
            {"name": "tpl", "configMap": {"name": "chat", "defaultMode": 0o640,
                "items": [{"key": "template.jinja", "path": "t/chat.jinja", "mode": 0o444}]}},
            {"name": "key", "secret": {"secretName": "hf", "optional": true, "defaultMode": 0o400}},
            {"name": "info", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "team", "fieldRef": {"fieldPath": "metadata.labels['team']"}}]}},
            {"name": "all", "projected": {"defaultMode": 0o600, "sources": [
                {"configMap": {"name": "extra"}},
                {"secret": {"name": "s", "items": [{"key": "k", "path": "k.txt"}]}},
                {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}]}},
            {"name": "kube-api-access-x1", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token"}}]}},
            {"name": "unmounted", "configMap": {"name": "never"}}
        ]),
        json!([
            {"name": "tpl", "mountPath": "/etc/vllm"},
            {"name": "key", "mountPath": "/secrets/hf", "readOnly": true},
            {"name": "info", "mountPath": "/etc/podinfo"},
            {"name": "all", "mountPath": "/etc/all"},
            {"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
        ]),
    );
    let pod = to_pod(p);
    translate_pod(&pod).expect("accepted");
    let mounts = file_mounts(&pod).expect("mounts");
    let paths: Vec<_> = mounts.iter().map(|m| m.mount_path.as_str()).collect();
    assert_eq!(
        paths,
        ["/etc/vllm", "/secrets/hf", "/etc/podinfo", "/etc/all"],
        "the injected token volume and unmounted volumes are left out"
    );
    assert_eq!(
        mounts[0].sources,
        vec![FileSource::Object {
            kind: EnvFromKind::ConfigMap,
            name: "chat".into(),
            items: Some(vec![KeyPath {
                key: "template.jinja".into(),
                path: "t/chat.jinja".into(),
                mode: Some(0o444),
            }]),
            optional: false,
            default_mode: 0o640,
            field: "spec.volumes[0].configMap".into(),
        }]
    );
    assert_eq!(
        mounts[1].sources,
        vec![FileSource::Object {
            kind: EnvFromKind::Secret,
            name: "hf".into(),
            items: None,
            optional: true,
            default_mode: 0o400,
            field: "spec.volumes[1].secret".into(),
        }]
    );
    let FileSource::Downward {
        items,
        default_mode,
    } = &mounts[2].sources[0]
    else {
        panic!("{:?}", mounts[2]);
    };
    assert_eq!(*default_mode, 0o644, "the API server's default");
    assert_eq!(items[1].field_path, "metadata.labels['team']");
    assert_eq!(mounts[3].sources.len(), 3);
    assert!(
        matches!(&mounts[3].sources[1], FileSource::Object { default_mode: 0o600, field, .. }
            if field == "spec.volumes[3].projected.sources[1].secret"),
        "{:?}",
        mounts[3].sources
    );
}

#[test]
fn a_token_projection_is_refused_naming_its_field() {
    let p = pod(
        json!([{"name": "tok", "projected": {"sources": [
            {"configMap": {"name": "c"}},
            {"serviceAccountToken": {"path": "token", "audience": "vault"}}]}}]),
        json!([{"name": "tok", "mountPath": "/var/run/tok"}]),
    );
    let r = refusals(p);
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(
        r[0].starts_with(
            "spec.volumes[0].projected.sources[1].serviceAccountToken: serviceAccountToken is not \
             supported"
        ),
        "{r:?}"
    );
}

#[test]
fn unsafe_paths_bad_modes_and_sub_paths_are_refused_naming_the_field() {
    let p = pod(
        json!([
            {"name": "a", "configMap": {"name": "c", "items": [
                {"key": "k", "path": "../../etc/passwd"},
                {"key": "k2", "path": "/etc/shadow"},
                {"key": "k3", "path": "ok", "mode": 0o4777}]}},
            {"name": "b", "secret": {"secretName": "s", "defaultMode": -1}},
            {"name": "d", "downwardAPI": {"items": [
                {"path": "cpu", "resourceFieldRef": {"resource": "limits.cpu"}},
                {"path": "ip", "fieldRef": {"fieldPath": "status.podIP"}}]}}
        ]),
        json!([
            {"name": "a", "mountPath": "/etc/a"},
            {"name": "b", "mountPath": "/data/../etc"},
            {"name": "d", "mountPath": "/d", "subPath": "cpu"}
        ]),
    );
    let r = refusals(p);
    let expect = [
        "spec.volumes[0].configMap.items[0].path: \"../../etc/passwd\" must not start with '..'",
        "spec.volumes[0].configMap.items[1].path: \"/etc/shadow\" must be a relative path",
        "spec.volumes[0].configMap.items[2].mode: 2559 is not a file mode of 0 to 0777",
        "spec.volumes[1].secret.defaultMode: -1",
        "spec.volumes[2].downwardAPI.items[0].resourceFieldRef: resourceFieldRef is not supported",
        "spec.volumes[2].downwardAPI.items[1].fieldRef.fieldPath: \"status.podIP\" is not \
         supported",
        "spec.containers[0].volumeMounts[1].mountPath: \"/data/../etc\" must not contain '..'",
        "spec.containers[0].volumeMounts[2].subPath: \"cpu\" is not supported",
    ];
    for e in expect {
        assert!(r.iter().any(|x| x.starts_with(e)), "{e}\nnot in {r:#?}");
    }
    assert_eq!(r.len(), expect.len(), "{r:#?}");
    let nested = pod(
        json!([{"name": "a", "configMap": {"name": "c", "items": [{"key": "k", "path": "x/../../y"}]}}]),
        json!([{"name": "a", "mountPath": "/etc/a"}]),
    );
    assert_eq!(
        refusals(nested),
        [
            "spec.volumes[0].configMap.items[0].path: \"x/../../y\" must not contain '..', '.' or \
          empty components"
        ]
    );
}

fn data(pairs: &[(&str, &[u8])]) -> ObjectData {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
        .collect()
}

fn object(
    kind: EnvFromKind,
    name: &str,
    items: Option<Vec<KeyPath>>,
    optional: bool,
) -> FileSource {
    FileSource::Object {
        kind,
        name: name.into(),
        items,
        optional,
        default_mode: 0o644,
        field: format!("spec.volumes[0].{name}"),
    }
}

fn mount(volume: &str, sources: Vec<FileSource>) -> FileMount {
    FileMount {
        volume: volume.into(),
        field: "spec.volumes[0]".into(),
        mount_path: format!("/etc/{volume}"),
        sources,
    }
}

#[test]
fn files_are_built_with_items_modes_optional_objects_and_downward_fields() {
    let cm = data(&[("a.conf", b"A"), ("b.conf", b"B")]);
    let secret = data(&[("token", b"s3cret")]);
    let objects: BTreeMap<(bool, String), ObjectData> = [
        ((false, "cm".to_owned()), cm),
        ((true, "sec".to_owned()), secret),
    ]
    .into();
    let lookup = |kind: EnvFromKind, name: &str| {
        objects.get(&(kind == EnvFromKind::Secret, name.to_owned()))
    };
    let meta =
        to_pod(json!({"metadata": {"name": "p", "labels": {"b": "2", "a": "x\"y"}}})).metadata;
    let key = |key: &str, path: &str, mode| KeyPath {
        key: key.into(),
        path: path.into(),
        mode,
    };
    let mounts = [
        mount(
            "cm",
            vec![object(EnvFromKind::ConfigMap, "cm", None, false)],
        ),
        mount(
            "mixed",
            vec![
                object(
                    EnvFromKind::Secret,
                    "sec",
                    Some(vec![
                        key("token", "hf/token", Some(0o400)),
                        key("absent", "x", None),
                    ]),
                    true,
                ),
                object(EnvFromKind::ConfigMap, "gone", None, true),
                FileSource::Downward {
                    items: vec![DownwardItem {
                        path: "labels".into(),
                        field_path: "metadata.labels".into(),
                        mode: None,
                    }],
                    default_mode: 0o644,
                },
            ],
        ),
    ];
    let built = build(&mounts, &meta, lookup).expect("built");
    let files: Vec<_> = built[0]
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.mode))
        .collect();
    assert_eq!(files, [("a.conf", 0o644), ("b.conf", 0o644)]);
    let files: Vec<_> = built[1]
        .files
        .iter()
        .map(|f| {
            (
                f.path.as_str(),
                f.mode,
                String::from_utf8_lossy(&f.data).into_owned(),
            )
        })
        .collect();
    assert_eq!(
        files,
        [
            ("hf/token", 0o400, "s3cret".to_owned()),
            ("labels", 0o644, "a=\"x\\\"y\"\nb=\"2\"".to_owned()),
        ]
    );
    assert!(
        !format!("{built:?}").contains("s3cret"),
        "Debug hides content"
    );

    let missing = [mount(
        "m",
        vec![object(EnvFromKind::ConfigMap, "nope", None, false)],
    )];
    let err = build(&missing, &meta, lookup).expect_err("missing");
    assert_eq!(
        err.to_string(),
        "spec.volumes[0].nope: ConfigMap nope does not exist"
    );
    let key_missing = [mount(
        "k",
        vec![object(
            EnvFromKind::Secret,
            "sec",
            Some(vec![key("absent", "x", None)]),
            false,
        )],
    )];
    let err = build(&key_missing, &meta, lookup).expect_err("missing key");
    assert_eq!(
        err.to_string(),
        "spec.volumes[0].sec: key absent of Secret sec does not exist"
    );
}

#[test]
fn files_over_the_pod_bound_are_refused_naming_the_volume() {
    let big = data(&[("weights", &vec![b'x'; MAX_POD_FILE_BYTES / 2 + 1])]);
    let lookup = |_: EnvFromKind, _: &str| Some(&big);
    let meta = Default::default();
    let one = [mount(
        "first",
        vec![object(EnvFromKind::ConfigMap, "big", None, false)],
    )];
    build(&one, &meta, lookup).expect("half the bound fits");
    let two = [
        mount(
            "first",
            vec![object(EnvFromKind::ConfigMap, "big", None, false)],
        ),
        mount(
            "second",
            vec![object(EnvFromKind::ConfigMap, "big", None, false)],
        ),
    ];
    let err = build(&two, &meta, lookup).expect_err("over the bound");
    assert!(
        matches!(&err, FilesError::TooLarge { volume, .. } if volume == "second"),
        "{err}"
    );
    assert!(
        err.to_string().contains(
            "volume \"second\" brings the Pod's files to 1048578 bytes, over \
             the bound of 1048576 bytes"
        ),
        "{err}"
    );
}
