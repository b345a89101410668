//! Policies distributed through a real OCI registry (the CNCF distribution registry with TLS
//! and basic auth, `neocloud_testenv::Registry`): `neocloud-node policy push`, `pull`,
//! `keygen`, `sign` and `verify` as an operator runs them, then BurstPolicies with `oci:`,
//! a pull secret, the registry's CA and a required signature, loaded by the node under its own
//! RBAC identity. A signed artifact loads and places Pods; a tampered artifact, a missing
//! signature, a signature by an unlisted key and an unreachable registry each leave the policy
//! not loaded with the reason in its status, and Pods naming it wait with `PolicyNotLoaded`.
//!
//! Needs the guests built by `make policies` and the registry built by `make testenv`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use neocloud_node::crd::{BurstPolicy, BurstPolicyStatus};
use neocloud_testenv::Registry;
use serde_json::{Value, json};
use support::world::{World, policies_dir, reason, running};
use support::{policy_loaded, policy_observed};

fn guest(name: &str) -> PathBuf {
    let path = policies_dir().join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run `make policies`",
        path.display()
    );
    path
}

/// `neocloud-node policy <args>` as an operator runs it, logged in to `registry`.
fn policy(registry: &Registry, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .arg("policy")
        .args(args)
        .env("NEOCLOUD_REGISTRY_USERNAME", registry.username())
        .env("NEOCLOUD_REGISTRY_PASSWORD", registry.password())
        .env("NEOCLOUD_WASM_CACHE_DIR", support::wasm_cache_dir())
        .output()
        .expect("run neocloud-node")
}

fn ok_json(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Pushes `file` to `<registry>/<repo>:v1` and returns the reference by digest.
fn push(registry: &Registry, file: &Path, repo: &str) -> String {
    let ca = registry.ca_file();
    let target = format!("{}/{repo}:v1", registry.host());
    let out = policy(
        registry,
        &[
            "push",
            file.to_str().unwrap(),
            &target,
            "--registry-ca",
            ca.to_str().unwrap(),
        ],
    );
    ok_json(&out)["reference"].as_str().unwrap().to_owned()
}

fn ca_args(registry: &Registry) -> Vec<String> {
    vec![
        "--registry-ca".into(),
        registry.ca_file().to_str().unwrap().to_owned(),
    ]
}

/// A component that differs from `file` (and from every other `name`) by one custom section at
/// its end.
fn variant(file: &Path, dir: &Path, name: &str) -> PathBuf {
    let mut bytes = std::fs::read(file).unwrap();
    // A custom section (id 0) named `name`: size, name length, name.
    bytes.extend_from_slice(&[0x00, name.len() as u8 + 1, name.len() as u8]);
    bytes.extend_from_slice(name.as_bytes());
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, bytes).unwrap();
    path
}

async fn create_policy(world: &World, suffix: &str, wasm: Value) -> BurstPolicy {
    let name = format!("{}-{suffix}", world.ctx.namespace);
    let bp: BurstPolicy = serde_json::from_value(json!({
        "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
        "metadata": {"name": name}, "spec": {"wasm": wasm},
    }))
    .unwrap();
    let api: Api<BurstPolicy> = Api::all(world.ctx.client.clone());
    api.create(&PostParams::default(), &bp).await.unwrap()
}

async fn status_of(world: &World, bp: &BurstPolicy) -> BurstPolicyStatus {
    let name = bp.name_any();
    let bp = support::wait_policy(&world.ctx.client, &name, "observed", 60, policy_observed).await;
    bp.status.unwrap_or_default()
}

/// The pull secret (for both registries) and each one's CA ConfigMap (`registry-ca`,
/// `gone-ca`) a BurstPolicy names, in the test's namespace.
async fn registry_objects(world: &World, registry: &Registry, other: &Registry) {
    registry_credentials(world, &[registry, other]).await;
    for (name, r) in [("registry-ca", registry), ("gone-ca", other)] {
        let ca = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: Some([("ca.crt".to_owned(), r.ca_pem().to_owned())].into()),
            ..ConfigMap::default()
        };
        Api::<ConfigMap>::namespaced(world.ctx.client.clone(), &world.ctx.namespace)
            .create(&PostParams::default(), &ca)
            .await
            .unwrap();
    }
}

/// Creates or replaces the `registry` pull secret with credentials for `registries`.
async fn registry_credentials(world: &World, registries: &[&Registry]) {
    let auths: serde_json::Map<String, Value> = registries
        .iter()
        .map(|r| {
            let auth = json!({"username": r.username(), "password": r.password()});
            (r.host(), auth)
        })
        .collect();
    let docker = json!({ "auths": auths });
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("registry".into()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(
            [(
                ".dockerconfigjson".to_owned(),
                ByteString(docker.to_string().into_bytes()),
            )]
            .into(),
        ),
        ..Secret::default()
    };
    let api = Api::<Secret>::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let params = PatchParams::apply("policy-oci-test").force();
    api.patch("registry", &params, &Patch::Apply(&secret))
        .await
        .unwrap();
}

/// `spec.wasm` for `reference` with the pull secret, the CA ConfigMap `ca` and, if any,
/// required keys.
fn oci(world: &World, reference: &str, keys: &[&str], ca: &str) -> Value {
    let ns = &world.ctx.namespace;
    let mut wasm = json!({
        "oci": reference,
        "pullSecret": {"namespace": ns, "name": "registry"},
        "registryCa": {"namespace": ns, "name": ca, "key": "ca.crt"},
    });
    if !keys.is_empty() {
        wasm["requireSignature"] = json!({"publicKeys": keys});
    }
    wasm
}

#[tokio::test(flavor = "multi_thread")]
async fn policies_from_a_registry_load_only_when_signed_by_a_listed_key_and_intact() {
    let registry = Registry::start().await.expect("registry");
    let keys = tempfile::tempdir().unwrap();
    let ca = ca_args(&registry);
    let ca: Vec<&str> = ca.iter().map(String::as_str).collect();

    // The operator's commands: push, pull back by digest, make keys, sign, verify.
    let placement = guest("placement-c");
    let signed = push(&registry, &placement, "team/placement");
    let pulled = keys.path().join("pulled.wasm");
    let out = policy(
        &registry,
        &[&["pull", &signed, "-o", pulled.to_str().unwrap()], &ca[..]].concat(),
    );
    let json = ok_json(&out);
    assert_eq!(
        std::fs::read(&pulled).unwrap(),
        std::fs::read(&placement).unwrap()
    );
    let digest = json["componentDigest"].as_str().unwrap().to_owned();
    let (_, manifest) = signed.split_once('@').unwrap();
    let absent = signed.replace(manifest, &format!("sha256:{}", "0".repeat(64)));
    let e = failed(&policy(
        &registry,
        &[&["pull", &absent, "-o", "/dev/null"], &ca[..]].concat(),
    ));
    assert!(e.contains("does not exist in the registry"), "{e}");
    let tag = format!("{}/team/placement:v1", registry.host());
    let e = failed(&policy(
        &registry,
        &[&["pull", &tag, "-o", "/dev/null"], &ca[..]].concat(),
    ));
    assert!(e.contains("has no digest"), "{e}");

    // What the node would not load is not pushed.
    let wrong = guest("hostile-wrong-world");
    let target = format!("{}/team/wrong:v1", registry.host());
    let e = failed(&policy(
        &registry,
        &[&["push", wrong.to_str().unwrap(), &target], &ca[..]].concat(),
    ));
    assert!(
        e.contains("exports none of the neocloud:policy") && e.contains("nothing was pushed"),
        "{e}"
    );

    let trusted = keys.path().join("trusted");
    let stranger = keys.path().join("stranger");
    for prefix in [&trusted, &stranger] {
        ok_json(&policy(
            &registry,
            &["keygen", "--prefix", prefix.to_str().unwrap()],
        ));
    }
    let (trusted_key, trusted_pub) = (trusted.with_extension("key"), trusted.with_extension("pub"));
    let stranger_key = stranger.with_extension("key");
    let sign = |reference: &str, key: &Path| {
        ok_json(&policy(
            &registry,
            &[
                &["sign", reference, "--key", key.to_str().unwrap()],
                &ca[..],
            ]
            .concat(),
        ))
    };
    sign(&signed, &trusted_key);
    let verified = ok_json(&policy(
        &registry,
        &[
            &["verify", &signed, "--key", trusted_pub.to_str().unwrap()],
            &ca[..],
        ]
        .concat(),
    ));
    assert_eq!(verified["verified"], true);
    let stranger_pub = stranger.with_extension("pub");
    let e = failed(&policy(
        &registry,
        &[
            &["verify", &signed, "--key", stranger_pub.to_str().unwrap()],
            &ca[..],
        ]
        .concat(),
    ));
    assert!(e.contains("none is valid from a listed key"), "{e}");

    // Artifacts for each way loading must fail.
    let unsigned = push(&registry, &guest("pricing-c"), "team/unsigned");
    let by_stranger = push(
        &registry,
        &variant(&placement, keys.path(), "s"),
        "team/stranger",
    );
    sign(&by_stranger, &stranger_key);
    let tampered_file = variant(&placement, keys.path(), "t");
    let tampered_bytes = std::fs::read(&tampered_file).unwrap();
    let tampered = push(&registry, &tampered_file, "team/tampered");
    sign(&tampered, &trusted_key);
    let component = sha256_hex(&tampered_bytes);
    let blob = registry
        .dir()
        .join("storage/docker/registry/v2/blobs/sha256")
        .join(&component[..2])
        .join(&component)
        .join("data");
    let mut evil = tampered_bytes.clone();
    *evil.last_mut().unwrap() ^= 0xff;
    std::fs::write(&blob, evil).expect("the blob is where distribution stores it");
    // A second registry that held a signed copy and is down when the node loads it.
    let mut gone = Registry::start().await.expect("second registry");
    let unreachable = push(&gone, &placement, "team/placement");
    gone.stop();

    let world = World::new("pol-oci").await;
    registry_objects(&world, &registry, &gone).await;
    let public = std::fs::read_to_string(&trusted_pub).unwrap();
    let key = public.as_str();

    let good = create_policy(
        &world,
        "signed",
        oci(&world, &signed, &[key], "registry-ca"),
    )
    .await;
    let s = status_of(&world, &good).await;
    assert!(s.loaded, "{s:?}");
    assert_eq!(s.digest.as_deref(), Some(digest.as_str()), "{s:?}");

    let cases = [
        (
            "unsigned",
            unsigned.as_str(),
            "spec.wasm.requireSignature",
            "has no signature",
        ),
        (
            "stranger",
            &by_stranger,
            "spec.wasm.requireSignature",
            "none is valid from a listed key",
        ),
        (
            "tampered",
            &tampered,
            "spec.wasm.oci",
            "was tampered with or corrupted",
        ),
        ("down", &unreachable, "spec.wasm.oci", "cannot be reached"),
    ];
    let mut names = Vec::new();
    for (suffix, reference, field, why) in cases {
        let ca = if suffix == "down" {
            "gone-ca"
        } else {
            "registry-ca"
        };
        let bp = create_policy(&world, suffix, oci(&world, reference, &[key], ca)).await;
        let s = status_of(&world, &bp).await;
        assert!(!s.loaded, "{suffix}: {s:?}");
        assert_eq!(s.errors[0].field, field, "{suffix}: {s:?}");
        assert!(s.errors[0].message.contains(why), "{suffix}: {s:?}");
        names.push((bp.name_any(), why));
    }

    // A Pod under the signed policy is placed; Pods under the others wait and say why.
    world
        .create_pod(
            "by-signed",
            json!({"cloud.aibrix.ai/policy": good.name_any()}),
        )
        .await;
    for (i, (name, why)) in names.iter().enumerate() {
        let pod = format!("waits-{i}");
        world
            .create_pod(&pod, json!({"cloud.aibrix.ai/policy": name}))
            .await;
        let p = world
            .wait_pod(&pod, "waiting for its policy", |p| {
                reason(p) == Some("PolicyNotLoaded")
            })
            .await;
        let message = p.status.unwrap().message.unwrap_or_default();
        assert!(
            message.contains(&format!("BurstPolicy {name} failed to load"))
                && message.contains(why),
            "{message}"
        );
        let external = world.binding(&pod).await.spec.external_name;
        assert!(
            world.sims.ledger().named(&external).is_empty(),
            "{pod} rented nothing"
        );
    }
    world.wait_pod("by-signed", "Running", running).await;

    // The unreachable registry comes back on the same address (new storage, CA and password,
    // which the operator updates in the Secret and ConfigMap): the node loads the policy
    // again by itself, and the Pod that waited for it is placed.
    let port: u16 = gone.host().rsplit(':').next().unwrap().parse().unwrap();
    let back = Registry::start_on(port)
        .await
        .expect("the registry comes back");
    assert_eq!(
        push(&back, &placement, "team/placement"),
        unreachable,
        "same bytes, same digest"
    );
    sign_with(&back, &unreachable, &trusted_key);
    registry_credentials(&world, &[&registry, &back]).await;
    let cm = json!({"data": {"ca.crt": back.ca_pem()}});
    Api::<ConfigMap>::namespaced(world.ctx.client.clone(), &world.ctx.namespace)
        .patch("gone-ca", &PatchParams::default(), &Patch::Merge(cm))
        .await
        .unwrap();
    let (down, _) = &names[3];
    let back_up = "loaded once its registry is back";
    support::wait_policy(&world.ctx.client, down, back_up, 60, policy_loaded).await;
    world.wait_pod("waits-3", "Running", running).await;

    // Signing the unsigned artifact after the policy named it: it loads at the next try.
    sign_with(&registry, &unsigned, &trusted_key);
    let (late, _) = &names[0];
    let signed_late = "loaded once its signature is pushed";
    support::wait_policy(&world.ctx.client, late, signed_late, 60, policy_loaded).await;
    world.wait_pod("waits-0", "Running", running).await;
}

fn sign_with(registry: &Registry, reference: &str, key: &Path) {
    let ca = ca_args(registry);
    let mut args = vec!["sign", reference, "--key", key.to_str().unwrap()];
    args.extend(ca.iter().map(String::as_str));
    ok_json(&policy(registry, &args));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_refuses_a_tag_alone_and_registry_fields_without_oci() {
    let world = World::new("pol-oci-refused").await;
    let api: Api<BurstPolicy> = Api::all(world.ctx.client.clone());
    let name = |s: &str| format!("{}-{s}", world.ctx.namespace);
    let cases = [
        (
            json!({"oci": "registry.example.com/team/p:v1"}),
            "a tag alone is refused",
        ),
        (
            json!({"path": "p.wasm", "requireSignature": {"publicKeys": ["x"]}}),
            "apply only to an oci source",
        ),
        (
            json!({"oci": format!("registry.example.com/p@sha256:{}", "a".repeat(64)),
                   "requireSignature": {"publicKeys": []}}),
            "at least one key",
        ),
    ];
    for (i, (wasm, why)) in cases.into_iter().enumerate() {
        let bp: BurstPolicy = serde_json::from_value(json!({
            "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "BurstPolicy",
            "metadata": {"name": name(&format!("refused-{i}"))}, "spec": {"wasm": wasm},
        }))
        .unwrap();
        let e = api
            .create(&PostParams::default(), &bp)
            .await
            .expect_err(why)
            .to_string();
        assert!(e.contains(why), "{why}: {e}");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    neocloud_policy::wasm::sha256_hex(bytes)
}
