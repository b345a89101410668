//! The runner identity Secret on the real API server: two replicas starting at once end up with
//! the same identity; the rotation annotation and deleting the Secret each make a new one; a
//! damaged Secret is an error that names the data key, not its value.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use neocloud_node::callback::identity::{KEY, ROTATE_ANNOTATION, TLS_HOST};
use neocloud_node::run::RunnerSettings;
use neocloud_testenv::TestContext;
use serde_json::json;

const NODE: &str = "idnode";
const SECRET: &str = "neocloud-node-idnode-runner-identity";

fn settings(namespace: &str) -> RunnerSettings {
    let yaml = format!(
        "callbackUrl: https://runners.example:8443\nidentitySecretNamespace: {namespace}\n"
    );
    let settings: RunnerSettings = serde_yaml::from_str(&yaml).unwrap();
    settings.check().unwrap();
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_identity_that_rotates_on_demand() {
    let ctx = TestContext::new("runnerid").await;
    let settings = settings(&ctx.namespace);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);

    // Two replicas at once: one creates, the other finds it created and reads it back.
    let (a, b) = tokio::join!(
        settings.load_identity(ctx.client.clone(), NODE),
        settings.load_identity(ctx.client.clone(), NODE)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.keys().key_id(), b.keys().key_id());
    assert_eq!(a.tls().unwrap().cert_pem(), b.tls().unwrap().cert_pem());
    let stored = secrets.get(SECRET).await.unwrap();
    let data = stored.data.clone().unwrap();
    assert_eq!(data[KEY].0.len(), 32);
    assert_eq!(data[TLS_HOST].0, b"runners.example");
    let again = settings
        .load_identity(ctx.client.clone(), NODE)
        .await
        .unwrap();
    assert_eq!(
        again.keys().key_id(),
        a.keys().key_id(),
        "a restart keeps it"
    );

    // Rotation by annotation: a new key and certificate, and the annotation is gone.
    let annotate = json!({"metadata": {"annotations": {ROTATE_ANNOTATION: "now"}}});
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap();
    let rotated = settings
        .load_identity(ctx.client.clone(), NODE)
        .await
        .unwrap();
    assert_ne!(rotated.keys().key_id(), a.keys().key_id());
    assert_ne!(
        rotated.tls().unwrap().cert_pem(),
        a.tls().unwrap().cert_pem()
    );
    let stored = secrets.get(SECRET).await.unwrap();
    assert!(!stored.annotations().contains_key(ROTATE_ANNOTATION));

    // Rotation by deletion.
    secrets
        .delete(SECRET, &DeleteParams::default())
        .await
        .unwrap();
    let remade = settings
        .load_identity(ctx.client.clone(), NODE)
        .await
        .unwrap();
    assert_ne!(remade.keys().key_id(), rotated.keys().key_id());

    // A damaged Secret is an error naming the Secret and the data key, never the value.
    let mut damaged = secrets.get(SECRET).await.unwrap();
    let value = "short-secret-value";
    damaged
        .data
        .as_mut()
        .unwrap()
        .insert(KEY.into(), ByteString(value.as_bytes().to_vec()));
    secrets
        .replace(SECRET, &Default::default(), &damaged)
        .await
        .unwrap();
    let err = settings
        .load_identity(ctx.client.clone(), NODE)
        .await
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains(SECRET) && text.contains(KEY), "{text}");
    assert!(!text.contains(value), "{text}");
}
