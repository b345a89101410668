//! Private images end to end: the reconciler on the real control plane with the simulators
//! configured with a private registry. A Pod whose image is on it rents on RunPod only with its
//! `imagePullSecrets`: the pod pulls with a registry credential made for the rental, named
//! under the cluster's prefix, which is gone once the Pod is deleted. A pull secret that is
//! missing, of another type or malformed keeps the Pod pending with the field named, and
//! nothing is rented (one without an entry for the image's registry is an anonymous pull, as
//! with a kubelet: the pull then fails on the cloud). On Vast.ai the login goes as
//! `image_login`, and without it the instance fails with the pull refused. The password appears in no event,
//! Pod status or binding.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use neocloud_cloudsim::{CloudSim, CloudSimConfig, PrivateRegistry, SimConfig};
use serde_json::json;

mod support;
use support::world::{World, reason, running};

const IMAGE: &str = "registry.example.com/team/model:1";
const PASSWORD: &str = "pw-7f3a91-do-not-leak";

async fn sims() -> CloudSim {
    let private = SimConfig {
        private_registries: vec![PrivateRegistry {
            host: "registry.example.com".into(),
            username: "bot".into(),
            password: PASSWORD.into(),
        }],
        ..SimConfig::fast()
    };
    CloudSim::start(CloudSimConfig {
        runpod: private.clone(),
        lambda: SimConfig::fast(),
        vast: private,
    })
    .await
    .unwrap()
}

async fn secret(world: &World, name: &str, kind: &str, config: &str) {
    let data = BTreeMap::from([(
        ".dockerconfigjson".to_owned(),
        ByteString(config.as_bytes().to_vec()),
    )]);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some(kind.into()),
        data: Some(data),
        ..Secret::default()
    };
    let secrets: Api<Secret> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

async fn create(world: &World, name: &str, pull_secret: &str) {
    create_on(world, name, "runpod", Some(pull_secret)).await;
}

async fn create_on(world: &World, name: &str, provider: &str, pull_secret: Option<&str>) {
    let secrets: Vec<_> = pull_secret
        .map(|s| json!({"name": s}))
        .into_iter()
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"cloud.aibrix.ai/providers": provider}},
        "spec": {
            "nodeName": world.node,
            "restartPolicy": "Never",
            "imagePullSecrets": secrets,
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "main", "image": IMAGE,
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap();
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// The Secret `regcred` with the private registry's login, and its docker config.
async fn regcred(world: &World) -> serde_json::Value {
    let config =
        json!({"auths": {"registry.example.com": {"username": "bot", "password": PASSWORD}}});
    let kind = "kubernetes.io/dockerconfigjson";
    secret(world, "regcred", kind, &config.to_string()).await;
    config
}

/// Everything the cluster shows about a Pod: its status, its binding and its events.
async fn shown(world: &World, name: &str) -> String {
    let pod = world.pods().get(name).await.unwrap();
    let binding = world.bindings().get_opt(name).await.unwrap();
    let events = world.events(name).await;
    format!(
        "{}\n{}\n{events:?}",
        serde_json::to_string(&pod.status).unwrap(),
        serde_json::to_string(&binding).unwrap()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_image_rents_on_runpod_only_with_its_pull_secret_and_the_credential_goes_with_the_pod()
 {
    let world = World::with_sims("priv-img", sims().await).await;
    let config = regcred(&world).await;
    secret(&world, "opaque", "Opaque", &config.to_string()).await;
    // The API server checks that it is JSON; not that it is a docker config.
    let garbled = json!({"auths": {"registry.example.com": PASSWORD}}).to_string();
    secret(
        &world,
        "garbled",
        "kubernetes.io/dockerconfigjson",
        &garbled,
    )
    .await;
    let refusals = [
        (
            "missing",
            "absent",
            "spec.imagePullSecrets[0].name \"absent\": Secret absent does not exist",
        ),
        (
            "wrong-type",
            "opaque",
            "has type Opaque, want kubernetes.io/dockerconfigjson",
        ),
        (
            "malformed",
            "garbled",
            "spec.imagePullSecrets[0].name \"garbled\": .dockerconfigjson is not a docker config",
        ),
    ];
    for (pod, pull_secret, _) in refusals {
        create(&world, pod, pull_secret).await;
    }
    for (pod, _, expected) in refusals {
        let waiting = world
            .wait_pod(pod, "refused for its pull secret", |p| {
                reason(p) == Some("ImagePullSecretError")
            })
            .await;
        let message = waiting.status.unwrap().message.unwrap_or_default();
        assert!(message.contains(expected), "{pod}: {message}");
        assert!(!shown(&world, pod).await.contains(PASSWORD), "{pod}");
    }
    assert!(world.sims.ledger().entries.is_empty(), "nothing is rented");

    create(&world, "private", "regcred").await;
    world.wait_pod("private", "Running", running).await;
    let external = world.binding("private").await.spec.external_name;
    assert!(external.starts_with("ncn-test-"), "{external}");
    assert_eq!(
        world.sims.runpod.registry_names(),
        std::slice::from_ref(&external)
    );
    assert!(!shown(&world, "private").await.contains(PASSWORD));

    world
        .pods()
        .delete("private", &DeleteParams::default())
        .await
        .unwrap();
    world.wait_gone("private").await;
    assert!(
        world.sims.runpod.registry_names().is_empty(),
        "the credential of {external} outlived its pod"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn on_vast_a_private_image_runs_with_its_pull_secret_and_fails_to_pull_without() {
    let world = World::with_sims("priv-vast", sims().await).await;
    regcred(&world).await;
    create_on(&world, "with-secret", "vast", Some("regcred")).await;
    create_on(&world, "without", "vast", None).await;
    world.wait_pod("with-secret", "Running", running).await;
    assert!(!shown(&world, "with-secret").await.contains(PASSWORD));
    let failed = world
        .wait_pod("without", "failed to pull", |p| {
            reason(p) == Some("InstanceFailed")
        })
        .await;
    let message = failed.status.unwrap().message.unwrap_or_default();
    assert!(message.contains("pull access denied"), "{message}");
}
