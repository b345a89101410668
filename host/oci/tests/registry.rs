//! Against a real CNCF distribution registry on loopback, with TLS and basic auth
//! (`neocloud_testenv::Registry`): push and pull by digest, signatures, and each way a pull
//! must fail: a digest that does not exist, bad credentials, an untrusted certificate, a
//! registry that is down, and bytes changed in the registry's storage.

use neocloud_oci::{
    OciClient, OciError, OciOptions, PolicyRef, RegistryCredentials, SigningKey, sha256_digest,
};
use neocloud_testenv::Registry;

/// A small but real-looking component: the header, then bytes that differ per test.
fn component(tag: &str) -> Vec<u8> {
    let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
    bytes.extend_from_slice(tag.as_bytes());
    bytes
}

fn client(registry: &Registry, password: &str, ca: bool) -> OciClient {
    OciClient::new(OciOptions {
        ca_pem: ca.then(|| registry.ca_pem().to_owned()),
        credentials: Some(RegistryCredentials {
            username: registry.username().to_owned(),
            password: password.to_owned(),
        }),
        ..OciOptions::default()
    })
    .expect("client")
}

fn at(registry: &Registry, path: &str) -> PolicyRef {
    PolicyRef::parse(&format!("{}/{path}", registry.host())).expect("reference")
}

#[tokio::test]
async fn a_pushed_component_is_pulled_by_digest_and_by_nothing_else() {
    let registry = Registry::start().await.expect("registry");
    let oci = client(&registry, registry.password(), true);
    let bytes = component("round trip");
    let pushed = oci
        .push(&at(&registry, "team/fallback:v1"), &bytes)
        .await
        .expect("push");
    assert_eq!(pushed.component_digest, sha256_digest(&bytes));
    assert_eq!(
        pushed.reference.to_string(),
        format!("{}/team/fallback@{}", registry.host(), pushed.digest)
    );
    let pulled = oci.pull(&pushed.reference).await.expect("pull");
    assert_eq!(pulled.bytes, bytes);
    assert_eq!(pulled.digest, pushed.digest);

    // Pushing the same bytes again gives the same digest.
    let again = oci
        .push(&at(&registry, "team/fallback:v2"), &bytes)
        .await
        .unwrap();
    assert_eq!(again.digest, pushed.digest);

    // A digest nobody pushed.
    let absent = pushed.reference.at_digest(&sha256_digest(b"nothing"));
    let e = oci.pull(&absent).await.expect_err("absent");
    assert!(matches!(e, OciError::NotFound { .. }), "{e}");
    assert!(
        e.to_string().contains("does not exist in the registry"),
        "{e}"
    );
    assert!(!e.is_transient());

    // A tag is not enough to pull.
    let e = oci
        .pull(&at(&registry, "team/fallback:v1"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has no digest"), "{e}");

    // Something that is not a Wasm binary is not pushed.
    let e = oci
        .push(&at(&registry, "team/notwasm:v1"), b"#!/bin/sh")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a WebAssembly binary"), "{e}");
}

#[tokio::test]
async fn wrong_credentials_an_untrusted_certificate_and_a_stopped_registry_are_told_apart() {
    let mut registry = Registry::start().await.expect("registry");
    let good = client(&registry, registry.password(), true);
    let pushed = good
        .push(&at(&registry, "p:v1"), &component("creds"))
        .await
        .expect("push");

    let wrong = client(&registry, "not-the-password", true);
    let e = wrong
        .pull(&pushed.reference)
        .await
        .expect_err("wrong password");
    assert!(matches!(e, OciError::Unauthorized { .. }), "{e}");
    assert!(!e.is_transient());
    let e = wrong
        .push(&at(&registry, "p:v2"), &component("x"))
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::Unauthorized { .. }), "{e}");

    let untrusting = client(&registry, registry.password(), false);
    let e = untrusting
        .pull(&pushed.reference)
        .await
        .expect_err("untrusted");
    assert!(matches!(e, OciError::Unreachable { .. }), "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");

    registry.stop();
    let fresh = client(&registry, registry.password(), true);
    let e = fresh.pull(&pushed.reference).await.expect_err("stopped");
    assert!(e.is_transient(), "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("registry {} cannot be reached", registry.host())),
        "{text}"
    );
}

#[tokio::test]
async fn bytes_changed_in_the_registry_are_refused() {
    let registry = Registry::start().await.expect("registry");
    let oci = client(&registry, registry.password(), true);
    let bytes = component("to be tampered with");
    let pushed = oci.push(&at(&registry, "t:v1"), &bytes).await.unwrap();
    let hex = pushed.component_digest.trim_start_matches("sha256:");
    let blob = registry
        .dir()
        .join("storage/docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    let mut evil = bytes.clone();
    *evil.last_mut().unwrap() ^= 0xff;
    std::fs::write(&blob, &evil).expect("the blob is where distribution stores it");
    let e = oci.pull(&pushed.reference).await.expect_err("tampered");
    assert!(matches!(e, OciError::DigestMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("was tampered with or corrupted"),
        "{e}"
    );
}

#[tokio::test]
async fn signatures_accumulate_under_the_cosign_tag_and_verify_only_with_a_listed_key() {
    let registry = Registry::start().await.expect("registry");
    let oci = client(&registry, registry.password(), true);
    let pushed = oci
        .push(&at(&registry, "s:v1"), &component("signed"))
        .await
        .unwrap();
    let other = oci
        .push(&at(&registry, "s:v2"), &component("unsigned"))
        .await
        .unwrap();
    let (alice, bob, mallory) = (
        SigningKey::generate(),
        SigningKey::generate(),
        SigningKey::generate(),
    );

    let unsigned = oci
        .verify(&pushed.reference, &[alice.public_key()])
        .await
        .expect_err("no signature yet");
    assert!(
        unsigned.to_string().contains("has no signature"),
        "{unsigned}"
    );

    let sig = oci.sign(&pushed.reference, &alice).await.expect("sign");
    let hex = pushed.digest.trim_start_matches("sha256:");
    assert_eq!(sig.tag(), Some(format!("sha256-{hex}.sig").as_str()));
    oci.sign(&pushed.reference, &bob)
        .await
        .expect("second signature");
    oci.sign(&pushed.reference, &bob)
        .await
        .expect("the same signature twice");
    assert_eq!(oci.signatures(&pushed.reference).await.unwrap().len(), 2);

    let by_bob = oci
        .verify(&pushed.reference, &[bob.public_key()])
        .await
        .unwrap();
    assert_eq!(by_bob.key_id, bob.public_key().id());
    let by_either = oci
        .verify(
            &pushed.reference,
            &[mallory.public_key(), alice.public_key()],
        )
        .await
        .unwrap();
    assert_eq!(by_either.key_id, alice.public_key().id());

    let e = oci
        .verify(&pushed.reference, &[mallory.public_key()])
        .await
        .expect_err("unlisted key");
    assert!(
        e.to_string().contains("none is valid from a listed key"),
        "{e}"
    );

    // The other artifact is not covered by the first one's signatures.
    let e = oci
        .verify(&other.reference, &[alice.public_key()])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has no signature"), "{e}");

    // Signing what does not exist fails and stores nothing.
    let absent = pushed.reference.at_digest(&sha256_digest(b"absent"));
    let e = oci.sign(&absent, &alice).await.expect_err("absent");
    assert!(matches!(e, OciError::NotFound { .. }), "{e}");
}
