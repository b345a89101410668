//! What a remote cluster's kubeconfig (a Secret that others may write) and its API server cannot
//! do to the node: run a command, hand over a file of the node, talk without TLS verification
//! unless allowed, or hold the provider's health check forever. Inline kubeconfigs work, against
//! the test binary's control plane.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use neocloud_kube_target::{KubeTarget, KubeconfigSource, RemoteCluster, client_from_kubeconfig};
use neocloud_providers::Provider;
use neocloud_testenv::TestContext;
use parking_lot::Mutex;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpListener;

const ORIGIN: &str = "Secret burst/gpu-west key \"kubeconfig\"";

/// A kubeconfig for `server` whose only user has the YAML `user` fields.
fn kubeconfig(server: &str, user: &str, cluster: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n\
         clusters: [{{name: k, cluster: {{server: '{server}'{cluster}}}}}]\n\
         users: [{{name: u, user: {user}}}]\n"
    )
}

/// A TCP server that records every byte sent to it and never answers.
async fn recorder() -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = heard.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    sink.lock().extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    (url, heard)
}

/// What a client built from an accepted kubeconfig would do first: call the API server.
async fn use_client(client: Client) {
    let _ = tokio::time::timeout(Duration::from_secs(5), client.apiserver_version()).await;
}

#[tokio::test]
async fn an_exec_plugin_is_refused_by_name_and_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("plugin-ran");
    let (server, _) = recorder().await;
    let script = format!(
        "touch {}; echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\
         \"kind\":\"ExecCredential\",\"status\":{{\"token\":\"t\"}}}}'",
        marker.display()
    );
    let user = format!(
        "{{exec: {{apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, \
         args: ['-c', {script:?}]}}}}"
    );
    let yaml = kubeconfig(&server, &user, "");
    match client_from_kubeconfig(&yaml, ORIGIN, false).await {
        Ok(client) => {
            use_client(client).await;
            panic!("accepted; the plugin ran: {}", marker.exists());
        }
        Err(e) => {
            assert!(e.contains(ORIGIN), "{e}");
            assert!(e.contains("users[\"u\"] sets \"exec\""), "{e}");
        }
    }
    assert!(!Path::new(&marker).exists(), "the plugin never runs");
}

#[tokio::test]
async fn a_token_file_is_refused_and_the_node_s_token_never_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "node-service-account-token-7f3a").unwrap();
    let (server, heard) = recorder().await;
    let user = format!("{{tokenFile: {}}}", token_file.display());
    let yaml = kubeconfig(&server, &user, "");
    match client_from_kubeconfig(&yaml, ORIGIN, false).await {
        Ok(client) => use_client(client).await,
        Err(e) => {
            assert!(e.contains(ORIGIN), "{e}");
            assert!(e.contains("users[\"u\"] sets \"tokenFile\""), "{e}");
        }
    }
    let heard = String::from_utf8_lossy(&heard.lock()).into_owned();
    assert!(
        !heard.contains("node-service-account-token"),
        "the token was sent: {heard}"
    );
    assert!(heard.is_empty(), "nothing is sent: {heard}");
}

#[tokio::test]
async fn skipping_tls_verification_is_refused_unless_the_cluster_allows_it() {
    let yaml = kubeconfig(
        "https://127.0.0.1:6443",
        "{token: abc}",
        ", insecure-skip-tls-verify: true",
    );
    let e = client_from_kubeconfig(&yaml, ORIGIN, false)
        .await
        .err()
        .expect("refused");
    assert!(e.contains(ORIGIN), "{e}");
    assert!(e.contains("\"insecure-skip-tls-verify\""), "{e}");
    assert!(e.contains("allowInsecureSkipTlsVerify"), "{e}");
    client_from_kubeconfig(&yaml, ORIGIN, true)
        .await
        .expect("allowed by the cluster's setting");
}

#[tokio::test]
async fn an_inline_kubeconfig_reaches_its_cluster() {
    let ctx = TestContext::new("kubeconfig-inline").await;
    let yaml = ctx
        .control_plane
        .inline_kubeconfig_as("inline-admin", &["system:masters"])
        .unwrap();
    let client = client_from_kubeconfig(&yaml, ORIGIN, false).await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert!(!version.git_version.is_empty());
}

#[tokio::test]
async fn a_cluster_that_never_answers_fails_the_health_check_instead_of_holding_it() {
    let (server, _) = recorder().await;
    let client = Client::try_from(kube::Config::new(server.parse().unwrap())).unwrap();
    let cluster = RemoteCluster {
        name: "silent".into(),
        namespace: "burst".into(),
        kubeconfig: KubeconfigSource {
            secret: Some("silent-kubeconfig".into()),
            key: None,
            path: None,
        },
        gpu_prices: BTreeMap::from([("H100".to_owned(), 2.0)]),
        surcharge_per_hour: 0.0,
        allow_insecure_skip_tls_verify: false,
    };
    let target = KubeTarget::start(vec![(cluster, client)]);
    // The probe's own deadline is 10 s; this bound only catches a probe without one (the
    // client's read timeout is minutes).
    let health = tokio::time::timeout(Duration::from_secs(90), target.health())
        .await
        .expect("the health check ends");
    let e = health.unwrap_err();
    assert!(e.message.contains("silent did not answer within"), "{e}");
}
