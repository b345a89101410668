//! The kubelet API on the real control plane: `kubectl logs` (kube-rs `Api::<Pod>::logs` and
//! `log_stream`) goes through the API server, which dials the node's InternalIP and kubelet port
//! with its kubelet client certificate, to the node's server, which reads what a runner streamed
//! to the runner callback. The node reviews tokens and access as the project's ClusterRole (and
//! nothing more) allows. Direct callers without a certificate, with one from another CA, or with
//! a token of a user who may not proxy to the node are refused.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{LogParams, PostParams};

use neocloud_core::ProviderId;
use neocloud_node::callback::{
    CallbackConfig, CallbackServer, LogRecord, LogStream, RunnerEvent, TlsMaterial, Workload,
};
use neocloud_node::kubelet::{
    KubeAccessReview, KubeletConfig, KubeletServer, NO_RUNNER_CONFIGURED, NodePods, NodeWorkloads,
    PodPlacement,
};
use neocloud_node::vnode::{Health, Heartbeat, NodeConfig};
use neocloud_runner::CallbackClient;
use neocloud_testenv::{CertPair, TestContext};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

mod support;
use support::{bind, node_identity};

type Placements = Arc<Mutex<HashMap<(String, String), PodPlacement>>>;

/// The rig's node: its Pods are where the test placed them.
struct TestPods(Placements);

impl NodePods for TestPods {
    fn find(&self, namespace: &str, name: &str) -> Option<PodPlacement> {
        let key = (namespace.to_owned(), name.to_owned());
        self.0.lock().unwrap().get(&key).cloned()
    }
}

/// A node with its kubelet API and runner callback, registered on the control plane.
struct Rig {
    ctx: TestContext,
    node: String,
    pods: Api<Pod>,
    placements: Placements,
    callback: CallbackServer,
    _events: mpsc::Receiver<RunnerEvent>,
    kubelet: KubeletServer,
    kubelet_cert: String,
    heartbeat: JoinHandle<()>,
    _health: watch::Sender<Health>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

fn healthy() -> Health {
    Health {
        healthy: true,
        message: "lambda answers".into(),
        gpus: 8,
        since: Timestamp::now(),
    }
}

impl Rig {
    async fn new(test: &str) -> Rig {
        Rig::start(test, true).await
    }

    /// A node whose kubelet API reads the runner callback's logs of Lambda Pods (`runner`), or
    /// has no runner at all (its callback still serves nothing but is unused).
    async fn start(test: &str, runner: bool) -> Rig {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("neocloud_node=debug,warn")
            .with_test_writer()
            .try_init();
        let ctx = TestContext::new(test).await;
        let node = format!("neocloud-{}", ctx.namespace);
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let callback_tls = TlsMaterial::self_signed(&["127.0.0.1".into()]).unwrap();
        let callback_config = CallbackConfig {
            listen: loopback,
            ..CallbackConfig::default()
        };
        let (callback, events) = CallbackServer::start(callback_config, &callback_tls)
            .await
            .unwrap();
        let placements = Placements::default();
        let pods = Arc::new(TestPods(placements.clone()));
        let source = if runner {
            NodeWorkloads::new(pods, Some(callback.handle()), [ProviderId::Lambda])
        } else {
            let clouds = [ProviderId::Lambda, ProviderId::Runpod, ProviderId::Vast];
            NodeWorkloads::new(pods, None, []).with_runnerless_providers(clouds)
        };
        let mut config = KubeletConfig::new(&node);
        config.listen = loopback;
        config.client_ca_pem = Some(ctx.control_plane.ca_pem());
        let tls = TlsMaterial::self_signed(&[node.clone(), "127.0.0.1".into()]).unwrap();
        let reviews = Arc::new(KubeAccessReview::new(node_identity(&ctx).await));
        let kubelet = KubeletServer::start(config, &tls, reviews, Arc::new(source))
            .await
            .unwrap();
        let (heartbeat, health) = register(&ctx, &node, kubelet.local_addr().port()).await;
        Rig {
            pods: ctx.namespaced(),
            ctx,
            node,
            placements,
            callback,
            _events: events,
            kubelet,
            kubelet_cert: tls.cert_pem().to_owned(),
            heartbeat,
            _health: health,
        }
    }

    /// Creates Pod `name` bound to the node with container `main`, placed on `provider`.
    async fn pod(&self, name: &str, provider: Option<&str>) -> String {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": self.node,
                "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                "containers": [{"name": "main", "image": "registry.invalid/cuda:12"}]
            }
        }))
        .unwrap();
        let pod = self
            .pods
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let provider = provider.map(|p| p.parse().expect("a provider"));
        let placement = PodPlacement::of(&pod, provider);
        let uid = placement.uid.clone();
        let key = (self.ctx.namespace.clone(), name.to_owned());
        self.placements.lock().unwrap().insert(key, placement);
        uid
    }

    /// A runner's session for the binding `uid`, registered with the callback.
    async fn runner(&self, uid: &str) -> CallbackClient {
        let token = self
            .callback
            .handle()
            .register(uid, 1, Workload::default())
            .unwrap();
        let url = format!("https://127.0.0.1:{}", self.callback.local_addr().port());
        let runner = CallbackClient::new(&url, self.callback.cert_pem().as_bytes()).unwrap();
        runner.exchange(&token).await.unwrap();
        runner
    }

    /// `https://127.0.0.1:<kubelet port><path>`.
    fn kubelet_url(&self, path: &str) -> String {
        format!(
            "https://127.0.0.1:{}{path}",
            self.kubelet.local_addr().port()
        )
    }

    /// A client that trusts the kubelet's certificate and presents `identity`.
    fn direct(&self, identity: Option<&CertPair>) -> reqwest::Client {
        let cert = reqwest::Certificate::from_pem(self.kubelet_cert.as_bytes()).unwrap();
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(cert)
            .timeout(Duration::from_secs(20));
        if let Some(pair) = identity {
            let pem = format!("{}{}", pair.cert_pem, pair.key_pem);
            builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
        }
        builder.build().unwrap()
    }
}

/// Registers the Node as itself, advertising 127.0.0.1 and the kubelet `port`, and keeps it
/// Ready.
async fn register(
    ctx: &TestContext,
    node: &str,
    port: u16,
) -> (JoinHandle<()>, watch::Sender<Health>) {
    let client = ctx
        .control_plane
        .client_as(&format!("system:node:{node}"), &["system:nodes"])
        .await
        .unwrap();
    let mut cfg = NodeConfig::named(node);
    cfg.providers = vec!["lambda".into()];
    cfg.address = "127.0.0.1".into();
    cfg.kubelet_port = port;
    cfg.lease_renew_seconds = 2;
    let (tx, rx) = watch::channel(healthy());
    let hb = Heartbeat::new(client, cfg, rx);
    hb.register().await.unwrap();
    (tokio::spawn(hb.run()), tx)
}

async fn say(runner: &CallbackClient, lines: &[&str]) {
    let body: String = lines
        .iter()
        .map(|line| {
            let record = LogRecord {
                ts: chrono::Utc::now(),
                stream: LogStream::Stdout,
                line: (*line).to_owned(),
                run: 0,
            };
            serde_json::to_string(&record).unwrap() + "\n"
        })
        .collect();
    let body = futures::stream::iter([Ok(Bytes::from(body))]);
    runner.logs(body).await.unwrap();
}

fn main_container() -> LogParams {
    LogParams {
        container: Some("main".into()),
        ..LogParams::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_reads_follows_tails_and_limits_the_runner_log() {
    let rig = Rig::new("kubelet-logs").await;
    let uid = rig.pod("train", Some("lambda")).await;
    let runner = rig.runner(&uid).await;
    say(&runner, &["line-1", "line-2", "line-3", "line-4", "line-5"]).await;

    let all = rig.pods.logs("train", &main_container()).await.unwrap();
    assert_eq!(all, "line-1\nline-2\nline-3\nline-4\nline-5\n");
    let tail = LogParams {
        tail_lines: Some(2),
        ..main_container()
    };
    assert_eq!(
        rig.pods.logs("train", &tail).await.unwrap(),
        "line-4\nline-5\n"
    );
    let limited = LogParams {
        limit_bytes: Some(10),
        ..main_container()
    };
    assert_eq!(
        rig.pods.logs("train", &limited).await.unwrap(),
        "line-1\nlin"
    );
    let stamped = LogParams {
        timestamps: true,
        tail_lines: Some(1),
        ..main_container()
    };
    let stamped = rig.pods.logs("train", &stamped).await.unwrap();
    let (ts, line) = stamped.trim_end().split_once(' ').unwrap();
    assert!(ts.parse::<Timestamp>().is_ok(), "{stamped}");
    assert_eq!(line, "line-5");

    let follow = LogParams {
        follow: true,
        tail_lines: Some(1),
        ..main_container()
    };
    let mut lines = rig.pods.log_stream("train", &follow).await.unwrap().lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), lines.next())
            .await
            .expect("a line in time")
            .expect("the stream is open")
            .unwrap()
    };
    assert_eq!(next().await, "line-5");
    say(&runner, &["after-1", "after-2"]).await;
    assert_eq!(next().await, "after-1");
    assert_eq!(next().await, "after-2");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_explains_why_a_log_cannot_be_read() {
    let rig = Rig::new("kubelet-refusals").await;
    let uid = rig.pod("train", Some("lambda")).await;
    rig.runner(&uid).await;
    let refusal = |name: &'static str, params: LogParams| {
        let pods = rig.pods.clone();
        async move {
            let e = pods.logs(name, &params).await.expect_err("refused");
            e.to_string()
        }
    };

    let other = LogParams {
        container: Some("sidecar".into()),
        ..LogParams::default()
    };
    let message = refusal("train", other).await;
    assert!(message.contains("sidecar"), "{message}");

    rig.pod("on-runpod", Some("runpod")).await;
    let message = refusal("on-runpod", main_container()).await;
    assert!(
        message.contains("logs are not available for pods on runpod: the provider has no log API"),
        "{message}"
    );

    rig.pod("unplaced", None).await;
    let message = refusal("unplaced", main_container()).await;
    assert!(
        message.contains("\"main\"") && message.contains("is waiting to start"),
        "{message}"
    );

    rig.pod("no-runner-yet", Some("lambda")).await;
    let message = refusal("no-runner-yet", main_container()).await;
    assert!(message.contains("is waiting to start"), "{message}");

    // In the API server, but not among the node's Pods.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "elsewhere"},
        "spec": {"nodeName": rig.node, "containers": [{"name": "main", "image": "x"}]}
    }))
    .unwrap();
    rig.pods.create(&PostParams::default(), &pod).await.unwrap();
    let message = refusal("elsewhere", main_container()).await;
    assert!(message.contains("elsewhere"), "{message}");

    let previous = LogParams {
        previous: true,
        ..main_container()
    };
    // Never restarted in place: kubelet's answer.
    let message = refusal("train", previous).await;
    assert!(
        message.contains("previous terminated container \"main\" in pod \"train\" not found"),
        "{message}"
    );
}

/// A token for ServiceAccount `name` in the test's namespace, from the TokenRequest API.
async fn service_account_token(ctx: &TestContext, name: &str) -> String {
    let sas: Api<ServiceAccount> = ctx.namespaced();
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued = sas
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap();
    issued.status.unwrap().token
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kubelet_port_serves_only_callers_the_api_server_vouches_for() {
    let rig = Rig::new("kubelet-auth").await;
    let uid = rig.pod("train", Some("lambda")).await;
    say(&rig.runner(&uid).await, &["hello"]).await;
    let logs = rig.kubelet_url(&format!("/containerLogs/{}/train/main", rig.ctx.namespace));

    let health = rig
        .direct(None)
        .get(rig.kubelet_url("/healthz"))
        .send()
        .await;
    assert_eq!(
        health.unwrap().status(),
        200,
        "healthz needs no credentials"
    );

    let anonymous = rig.direct(None).get(&logs).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);

    let stranger = neocloud_testenv::Pki::new()
        .unwrap()
        .client("intruder", &["system:masters"])
        .unwrap();
    match rig.direct(Some(&stranger)).get(&logs).send().await {
        Err(_) => {} // the handshake failed
        Ok(response) => assert_eq!(response.status(), 401),
    }

    let admin = rig
        .ctx
        .control_plane
        .client_cert("kubelet-test-admin", &["system:masters"])
        .unwrap();
    let trusted = rig.direct(Some(&admin));
    let response = trusted.get(&logs).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "hello\n");
    // Exec without the SPDY upgrade is refused as a kubelet refuses it; an unknown path is 404.
    let plain = trusted
        .get(rig.kubelet_url("/exec/x/y/z"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 400);
    let body = plain.text().await.unwrap();
    assert!(body.contains("missing upgrade headers"), "{body}");
    let elsewhere = trusted.get(rig.kubelet_url("/run/x/y/z")).send().await;
    assert_eq!(elsewhere.unwrap().status(), 404);
    let sidecar = trusted.get(logs.replace("/main", "/sidecar")).send().await;
    let sidecar = sidecar.unwrap();
    assert_eq!(sidecar.status(), 400);
    let body = sidecar.text().await.unwrap();
    assert!(
        body.contains("container \"sidecar\" is not valid"),
        "{body}"
    );
    let absent = trusted
        .get(logs.replace("/train/", "/absent/"))
        .send()
        .await;
    let absent = absent.unwrap();
    assert_eq!(absent.status(), 404);
    let body = absent.text().await.unwrap();
    let pod = format!(
        "pod {}/absent does not exist on this node",
        rig.ctx.namespace
    );
    assert!(body.contains(&pod), "{body}");
    let bad = trusted.get(format!("{logs}?tailLines=-3")).send().await;
    let bad = bad.unwrap();
    assert_eq!(bad.status(), 400);
    let body = bad.text().await.unwrap();
    assert!(
        body.contains("tailLines") && body.contains("\"-3\""),
        "{body}"
    );

    let token = service_account_token(&rig.ctx, "reader").await;
    let denied = rig.direct(None).get(&logs).bearer_auth(&token).send().await;
    let denied = denied.unwrap();
    assert_eq!(denied.status(), 403);
    let body = denied.text().await.unwrap();
    let user = format!("system:serviceaccount:{}:reader", rig.ctx.namespace);
    assert!(
        body.contains(&user) && body.contains("subresource=proxy"),
        "{body}"
    );

    // Once RBAC allows nodes/proxy, the same token reads the log.
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": format!("node-proxy-{}", rig.ctx.namespace)},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]
    }))
    .unwrap();
    let role_name = role.metadata.name.clone().unwrap();
    Api::<ClusterRole>::all(rig.ctx.client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    bind(&rig.ctx, &role_name, &role_name, "ServiceAccount", "reader").await;
    let mut status = 0;
    for _ in 0..50 {
        let response = rig.direct(None).get(&logs).bearer_auth(&token).send().await;
        status = response.unwrap().status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "a token allowed nodes/proxy reads the log");
}

#[tokio::test(flavor = "multi_thread")]
async fn following_streams_chunks_as_they_arrive_on_the_kubelet_port() {
    let rig = Rig::new("kubelet-chunks").await;
    let uid = rig.pod("train", Some("lambda")).await;
    let runner = rig.runner(&uid).await;
    say(&runner, &["first"]).await;
    let admin = rig
        .ctx
        .control_plane
        .client_cert("kubelet-test-admin", &["system:masters"])
        .unwrap();
    let url = rig.kubelet_url(&format!(
        "/containerLogs/{}/train/main?follow=true",
        rig.ctx.namespace
    ));
    let response = rig.direct(Some(&admin)).get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.content_length().is_none(), "a follow is chunked");
    let mut body = response.bytes_stream();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), body.next())
            .await
            .expect("a chunk in time")
            .expect("the stream is open")
            .unwrap()
    };
    assert_eq!(next().await, "first\n");
    say(&runner, &["second"]).await;
    assert_eq!(next().await, "second\n");
}

/// A ClusterRole with `verbs` on `nodes/proxy`, bound to ServiceAccount `account`.
async fn allow_node_proxy(rig: &Rig, account: &str, verbs: &[&str]) {
    let name = format!("node-proxy-{account}-{}", rig.ctx.namespace);
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": verbs}]
    }))
    .unwrap();
    Api::<ClusterRole>::all(rig.ctx.client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    bind(&rig.ctx, &name, &name, "ServiceAccount", account).await;
}

/// A streaming request (`Upgrade: SPDY/3.1` with the stream `protocol`) to `path` with the
/// bearer `token`; the status, and the body unless the connection was upgraded.
async fn open_stream(
    rig: &Rig,
    token: &str,
    method: reqwest::Method,
    path: &str,
    protocol: &str,
) -> (u16, String) {
    let response = rig
        .direct(None)
        .request(method, rig.kubelet_url(path))
        .bearer_auth(token)
        .header("Connection", "Upgrade")
        .header("Upgrade", "SPDY/3.1")
        .header("X-Stream-Protocol-Version", protocol)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    if status == 101 {
        return (status, String::new());
    }
    (status, response.text().await.unwrap())
}

/// `call`'s status once it is `want` (RBAC takes a moment to apply), or its last one after 5 s.
async fn once_status(mut call: impl AsyncFnMut() -> u16, want: u16) -> u16 {
    let mut status = 0;
    for _ in 0..50 {
        status = call().await;
        if status == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    status
}

#[tokio::test(flavor = "multi_thread")]
async fn get_on_nodes_proxy_reads_logs_but_only_create_opens_exec_attach_or_port_forward() {
    let rig = Rig::new("kubelet-verbs").await;
    let uid = rig.pod("train", Some("lambda")).await;
    say(&rig.runner(&uid).await, &["hello"]).await;
    let ns = rig.ctx.namespace.clone();
    let logs = rig.kubelet_url(&format!("/containerLogs/{ns}/train/main"));
    let exec = format!("/exec/{ns}/train/main?command=true&output=1");
    let attach = format!("/attach/{ns}/train/main?output=1");
    let forward = format!("/portForward/{ns}/train");
    let streams = [
        (exec.as_str(), "v4.channel.k8s.io"),
        (attach.as_str(), "v4.channel.k8s.io"),
        (forward.as_str(), "portforward.k8s.io"),
    ];

    // A monitoring account: `get nodes/proxy`, as many hold it.
    let monitor = service_account_token(&rig.ctx, "monitor").await;
    allow_node_proxy(&rig, "monitor", &["get"]).await;
    let reads = once_status(
        async || {
            let response = rig.direct(None).get(&logs).bearer_auth(&monitor).send();
            response.await.unwrap().status().as_u16()
        },
        200,
    )
    .await;
    assert_eq!(reads, 200, "get nodes/proxy reads the log");
    for (path, protocol) in streams {
        for method in [reqwest::Method::GET, reqwest::Method::POST] {
            let (status, body) = open_stream(&rig, &monitor, method.clone(), path, protocol).await;
            assert_eq!(status, 403, "{method} {path}: {body}");
            assert!(
                body.contains("verb=create") && body.contains("subresource=proxy"),
                "{body}"
            );
        }
    }

    // An operator: `create nodes/proxy` opens them, whatever the method.
    let operator = service_account_token(&rig.ctx, "operator").await;
    allow_node_proxy(&rig, "operator", &["create"]).await;
    for (path, protocol) in streams {
        for method in [reqwest::Method::GET, reqwest::Method::POST] {
            let status = once_status(
                async || {
                    let method = method.clone();
                    open_stream(&rig, &operator, method, path, protocol).await.0
                },
                101,
            )
            .await;
            assert_eq!(status, 101, "{method} {path} with create nodes/proxy");
        }
    }
}

/// A `metav1.Status` body's code, reason and message.
fn status_of(body: &str) -> (i64, String, String) {
    let status: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not a Status ({e}): {body}"));
    assert_eq!(status["kind"], "Status", "{body}");
    assert_eq!(status["status"], "Failure", "{body}");
    let text = |key: &str| status[key].as_str().unwrap_or_default().to_owned();
    (
        status["code"].as_i64().unwrap_or(0),
        text("reason"),
        text("message"),
    )
}

/// `kubectl exec POD -- true` in the test's namespace: whether it failed, and its stderr.
async fn kubectl_exec(rig: &Rig, pod: &str) -> (bool, String) {
    let mut cmd = rig.ctx.control_plane.kubectl();
    cmd.args(["-n", &rig.ctx.namespace, "exec", pod, "--", "true"]);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (!out.status.success(), stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_runner_logs_and_streams_say_so_and_streams_are_refused_with_their_status() {
    let rig = Rig::start("kubelet-norunner", false).await;
    rig.pod("train", Some("lambda")).await;
    let ns = rig.ctx.namespace.clone();

    // kubectl logs: the missing runner, not the provider, is named.
    let e = rig.pods.logs("train", &main_container()).await;
    let message = e.expect_err("no runner").to_string();
    let pod = format!("pod {ns}/train");
    assert!(
        message.contains(&format!(
            "logs are not available for {pod}: {NO_RUNNER_CONFIGURED}"
        )),
        "{message}"
    );

    // Streams straight to the kubelet API: each refusal is a Status with its own code.
    let admin = rig
        .ctx
        .control_plane
        .client_cert("kubelet-test-admin", &["system:masters"])
        .unwrap();
    let exec = "v4.channel.k8s.io";
    let cases = [
        (
            format!("/exec/{ns}/train/main?command=true&output=1"),
            exec,
            503,
            "ServiceUnavailable",
            format!("exec is not available for {pod}: {NO_RUNNER_CONFIGURED}"),
        ),
        (
            format!("/attach/{ns}/train/main?output=1"),
            exec,
            503,
            "ServiceUnavailable",
            format!("attach is not available for {pod}: {NO_RUNNER_CONFIGURED}"),
        ),
        (
            format!("/portForward/{ns}/train"),
            "portforward.k8s.io",
            503,
            "ServiceUnavailable",
            format!("port-forward is not available for {pod}: {NO_RUNNER_CONFIGURED}"),
        ),
        (
            format!("/exec/{ns}/absent/main?command=true&output=1"),
            exec,
            404,
            "NotFound",
            format!("pod {ns}/absent does not exist on this node"),
        ),
        (
            format!("/exec/{ns}/train/sidecar?command=true&output=1"),
            exec,
            404,
            "NotFound",
            format!("container \"sidecar\" is not valid for {pod}"),
        ),
        (
            format!("/exec/{ns}/train/main?output=1"),
            exec,
            400,
            "BadRequest",
            "you must specify at least one command for the container".to_owned(),
        ),
        (
            format!("/exec/{ns}/train/main?command=true&output=1"),
            "v1.channel.k8s.io",
            403,
            "Forbidden",
            "unable to negotiate protocol".to_owned(),
        ),
    ];
    for (path, protocol, code, reason, words) in cases {
        let response = rig
            .direct(Some(&admin))
            .post(rig.kubelet_url(&path))
            .header("Connection", "Upgrade")
            .header("Upgrade", "SPDY/3.1")
            .header("X-Stream-Protocol-Version", protocol)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), code, "{path}");
        let body = response.text().await.unwrap();
        let (status, got_reason, message) = status_of(&body);
        assert_eq!(
            (status, got_reason.as_str()),
            (code as i64, reason),
            "{path}: {body}"
        );
        assert!(message.contains(&words), "{path}: {message}");
    }
    // A caller without `create` on nodes/proxy.
    let token = service_account_token(&rig.ctx, "reader").await;
    let path = format!("/exec/{ns}/train/main?command=true&output=1");
    let (code, body) = open_stream(&rig, &token, reqwest::Method::POST, &path, exec).await;
    assert_eq!(code, 403, "{body}");
    let (_, reason, message) = status_of(&body);
    assert_eq!(reason, "Forbidden");
    assert!(message.contains("subresource=proxy"), "{message}");

    // What kubectl shows through the API server: the reason, never an internal error.
    let (failed, stderr) = kubectl_exec(&rig, "train").await;
    assert!(failed, "{stderr}");
    assert!(stderr.contains(NO_RUNNER_CONFIGURED), "{stderr}");
    assert!(!stderr.contains("Internal error"), "{stderr}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "elsewhere"},
        "spec": {"nodeName": rig.node, "containers": [{"name": "main", "image": "x"}]}
    }))
    .unwrap();
    rig.pods.create(&PostParams::default(), &pod).await.unwrap();
    let (failed, stderr) = kubectl_exec(&rig, "elsewhere").await;
    assert!(failed, "{stderr}");
    assert!(stderr.contains("does not exist on this node"), "{stderr}");
    assert!(!stderr.contains("Internal error"), "{stderr}");
}
