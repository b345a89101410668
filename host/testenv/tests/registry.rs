//! Proves the test registry is a real, locked-down OCI registry: the distribution API answers only
//! to its one user over basic auth, only clients that trust its CA get through TLS, and a stopped
//! registry refuses connections on the port it had.

use std::time::Duration;

use neocloud_testenv::Registry;
use neocloud_testenv::registry::{REALM, chain};

/// Starts a registry; a failure reads as the error's message, which names `make testenv` when the
/// binary is missing.
async fn start() -> Registry {
    Registry::start().await.unwrap_or_else(|e| panic!("{e}"))
}

/// A client that trusts the registry's CA and nothing else.
fn trusting(registry: &Registry) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(registry.ca_pem().as_bytes()).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_api_answers_only_to_its_user() {
    let registry = start().await;
    let client = trusting(&registry);
    let v2 = format!("{}/v2/", registry.url());
    assert_eq!(
        registry.host(),
        registry.url().trim_start_matches("https://")
    );

    let anonymous = client.get(&v2).send().await.unwrap();
    assert_eq!(anonymous.status(), 401, "{}", registry.log_tail(20));
    let challenge = anonymous
        .headers()
        .get("www-authenticate")
        .expect("a 401 carries a challenge")
        .to_str()
        .unwrap();
    assert!(challenge.starts_with("Basic "), "{challenge}");
    assert!(challenge.contains(REALM), "{challenge}");

    let user = client
        .get(&v2)
        .basic_auth(registry.username(), Some(registry.password()))
        .send()
        .await
        .unwrap();
    assert_eq!(user.status(), 200, "{}", registry.log_tail(20));
    assert_eq!(
        user.headers()
            .get("docker-distribution-api-version")
            .map(|v| v.to_str().unwrap()),
        Some("registry/2.0"),
        "the distribution registry announces its API version"
    );
    let catalog = client
        .get(format!("{}/v2/_catalog", registry.url()))
        .basic_auth(registry.username(), Some(registry.password()))
        .send()
        .await
        .unwrap();
    assert_eq!(catalog.status(), 200);
    assert_eq!(
        catalog.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({"repositories": []}),
        "a fresh registry is empty"
    );

    let wrong_password = client
        .get(&v2)
        .basic_auth(
            registry.username(),
            Some(format!("{}x", registry.password())),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_password.status(), 401);
    let wrong_user = client
        .get(&v2)
        .basic_auth("someone-else", Some(registry.password()))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_user.status(), 401);

    let log = registry.log_tail(50);
    assert!(log.contains("GET /v2/"), "the access log is kept:\n{log}");
}

#[tokio::test]
async fn only_clients_that_trust_its_ca_get_through_tls() {
    let registry = start().await;
    let v2 = format!("{}/v2/", registry.url());
    assert_ne!(registry.ca_pem(), "");
    assert_eq!(
        std::fs::read_to_string(registry.ca_file()).unwrap(),
        registry.ca_pem()
    );

    let untrusting = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let err = untrusting.get(&v2).send().await.unwrap_err();
    let text = chain(&err);
    assert!(err.is_connect(), "{text}");
    assert!(text.contains("certificate"), "{text}");

    let trusted = trusting(&registry).get(&v2).send().await.unwrap();
    assert_eq!(
        trusted.status(),
        401,
        "the CA, not the leaf, is the trust anchor"
    );
}

#[tokio::test]
async fn a_stopped_registry_refuses_connections() {
    let mut registry = start().await;
    let client = trusting(&registry);
    let v2 = format!("{}/v2/", registry.url());
    assert_eq!(client.get(&v2).send().await.unwrap().status(), 401);

    registry.stop();
    let err = std::net::TcpStream::connect(registry.host()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    // A new client: the first one's pooled connection was merely closed.
    let err = trusting(&registry).get(&v2).send().await.unwrap_err();
    assert!(err.is_connect(), "{}", chain(&err));
    let log = registry.log_tail(50);
    assert!(
        log.contains("listening on"),
        "the log outlives the process:\n{log}"
    );

    registry.stop();
    let dir = registry.dir().to_owned();
    drop(registry);
    if std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_none() {
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }
}
