//! The install path on the real control plane: the generated files are current, the single-file
//! manifest passes a server-side dry run, and the quickstart works as written: `config/default`
//! applied with kubectl, the node started with the manager's configuration and the
//! ServiceAccount's own credentials, the sample fake Pod scheduled onto it and Running, and
//! `kubectl get cloudpodbindings` showing its row.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use neocloud_testenv::TestContext;

mod support;
use support::can_i;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether `user` may `verb` `autoscaling.x-k8s.io`'s `resource` (its `subresource`, when not
/// empty) in every namespace, asked of the API server directly: `kubectl auth can-i` cannot
/// name a kind whose CRD is not installed.
async fn may(ctx: &TestContext, user: &str, verb: &str, resource: &str, subresource: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({"spec": {
        "user": user,
        "resourceAttributes": {"verb": verb, "group": "autoscaling.x-k8s.io",
            "resource": resource, "subresource": subresource},
    }}))
    .unwrap();
    let api: Api<SubjectAccessReview> = Api::all(ctx.client.clone());
    let answer = api
        .create(&kube::api::PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

/// `kubectl args` with `stdin`, whatever its outcome.
fn kubectl_stdin(ctx: &TestContext, args: &[&str], stdin: &str) -> Output {
    use std::io::Write as _;
    let mut child = ctx
        .control_plane
        .kubectl()
        .current_dir(repo())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn kubectl(ctx: &TestContext, args: &[&str]) -> Output {
    let run = || {
        ctx.control_plane
            .kubectl()
            .current_dir(repo())
            .args(args)
            .output()
            .unwrap()
    };
    let mut out = run();
    // Tests of this binary apply the same cluster-scoped objects (the aibrix-system Namespace)
    // at once; a client-side apply that loses the race between its get and its create says
    // AlreadyExists, and applying again finds the object.
    for _ in 0..3 {
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("AlreadyExists") {
            break;
        }
        out = run();
    }
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_generated_crds_and_manifest_are_current() {
    let ctx = TestContext::new("install-current").await;
    let crds = std::fs::read_to_string(repo().join("config/crd/cloud.aibrix.ai.yaml")).unwrap();
    assert!(
        crds == neocloud_node::crd::to_yaml().unwrap(),
        "config/crd/cloud.aibrix.ai.yaml is stale: run `make manifests`"
    );
    let built = kubectl(&ctx, &["kustomize", "config/default"]);
    let deploy = std::fs::read_to_string(repo().join("deploy/neocloud-node.yaml")).unwrap();
    let body = deploy
        .split_once('\n')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    assert!(
        body == String::from_utf8_lossy(&built.stdout),
        "deploy/neocloud-node.yaml is stale: run `make manifests`"
    );
    // A server-side dry run creates nothing, so the namespaced objects need their namespace to
    // exist already (another test of this binary may or may not have created it).
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "aibrix-system"}})).unwrap();
    match Api::all(ctx.client.clone())
        .create(&kube::api::PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("failed to create namespace aibrix-system: {e}"),
    }
    let dry = kubectl(
        &ctx,
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "-f",
            "deploy/neocloud-node.yaml",
        ],
    );
    let said = String::from_utf8_lossy(&dry.stdout);
    for object in [
        "namespace/aibrix-system",
        "customresourcedefinition.apiextensions.k8s.io/cloudpodbindings.cloud.aibrix.ai",
        "clusterrole.rbac.authorization.k8s.io/aibrix-neocloud-node",
        "deployment.apps/aibrix-neocloud-node",
    ] {
        assert!(said.contains(object), "{object} missing from:\n{said}");
    }
}

/// A kubeconfig that authenticates with a token of the ServiceAccount.
fn service_account_kubeconfig(ctx: &TestContext, dir: &Path) -> PathBuf {
    let token = kubectl(
        ctx,
        &[
            "-n",
            "aibrix-system",
            "create",
            "token",
            "aibrix-neocloud-node",
            "--duration=1h",
        ],
    );
    let token = String::from_utf8(token.stdout).unwrap();
    let path = dir.join("sa.kubeconfig");
    let cp = &ctx.control_plane;
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    \
         certificate-authority: {}\nusers:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- \
         name: sa\n  context: {{cluster: test, user: sa}}\ncurrent-context: sa\n",
        cp.api_url(),
        cp.ca_file().display(),
        token.trim()
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn the_quickstart_runs_the_fake_pod_under_the_service_account() {
    let ctx = TestContext::new("install-quickstart").await;
    kubectl(&ctx, &["apply", "-k", "config/default"]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&ctx, dir.path());
    let log = std::fs::File::create(dir.path().join("node.log")).unwrap();
    let config = repo().join("config/manager/node.yaml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let local = dir.path().join("node.yaml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("0.0.0.0:8080", &format!("127.0.0.1:{port}"));
    std::fs::write(&local, text).unwrap();
    let _node = tokio::process::Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .args(["run", "--config"])
        .arg(&local)
        .env("KUBECONFIG", &kubeconfig)
        .env("GPU_BURST_PROVIDER", "fake")
        .env("POD_NAMESPACE", "aibrix-system")
        .env("POD_NAME", "aibrix-neocloud-node-test")
        .env("RUST_LOG", "info")
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    kubectl(
        &ctx,
        &[
            "-n",
            &ctx.namespace,
            "apply",
            "-f",
            "config/samples/fake-pod.yaml",
        ],
    );
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let mut phase = None;
    for _ in 0..600 {
        let pod = pods.get("neocloud-node-fake-smoke").await.unwrap();
        phase = pod.status.and_then(|s| s.phase);
        if phase.as_deref() == Some("Running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    assert_eq!(phase.as_deref(), Some("Running"), "node log:\n{log}");
    let rows = kubectl(&ctx, &["-n", &ctx.namespace, "get", "cloudpodbindings"]);
    let rows = String::from_utf8_lossy(&rows.stdout);
    let row = rows
        .lines()
        .find(|l| l.starts_with("neocloud-node-fake-smoke"))
        .unwrap_or_else(|| panic!("no binding row:\n{rows}"));
    assert!(row.contains("fake") && row.contains("Running"), "{rows}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_service_account_may_do_what_the_role_lists_and_nothing_broader() {
    let ctx = TestContext::new("install-rbac").await;
    kubectl(&ctx, &["apply", "-k", "config/rbac"]);
    let sa = "system:serviceaccount:aibrix-system:aibrix-neocloud-node";
    let can = |args: &[&str]| can_i(&ctx, sa, args);
    let allowed: &[&[&str]] = &[
        &["watch", "pods", "-A"],
        &["patch", "pods", "--subresource=status", "-A"],
        &["delete", "pods", "-A"],
        &["create", "nodes"],
        &["update", "nodes"],
        &["patch", "nodes", "--subresource=status"],
        &["get", "secrets", "-n", "default"],
        &["get", "configmaps", "-n", "default"],
        &["create", "events", "-n", "default"],
        &["patch", "leases", "-n", "kube-node-lease"],
        &["create", "leases", "-n", "aibrix-system"],
        &["create", "cloudpodbindings.cloud.aibrix.ai", "-A"],
        &["patch", "cloudpodbindings.cloud.aibrix.ai", "-A"],
        &[
            "update",
            "cloudpodbindings.cloud.aibrix.ai",
            "--subresource=status",
            "-A",
        ],
        &["create", "tokenreviews.authentication.k8s.io"],
        &["create", "subjectaccessreviews.authorization.k8s.io"],
        &["get", "namespaces/kube-system"],
        &["create", "secrets", "-n", "aibrix-system"],
        &["update", "secrets", "-n", "aibrix-system"],
        // Relays, anywhere; what they may be is the relay policy's (below).
        &["create", "pods", "-A"],
        &["create", "secrets", "-n", "default"],
        &["patch", "secrets", "-n", "default"],
        &["delete", "secrets", "-n", "default"],
        &[
            "patch",
            "burstpolicies.cloud.aibrix.ai",
            "--subresource=status",
        ],
        // The PodTemplates a ProvisioningRequest names (the requests are below).
        &["get", "podtemplates", "-n", "default"],
    ];
    for args in allowed {
        assert!(can(args), "the role should allow {args:?}");
    }
    let refused: &[&[&str]] = &[
        &["list", "secrets", "-A"],
        &["watch", "secrets", "-A"],
        &["update", "pods", "-A"],
        &["delete", "nodes"],
        &["create", "customresourcedefinitions.apiextensions.k8s.io"],
        &["create", "burstpolicies.cloud.aibrix.ai"],
        &["delete", "burstpolicies.cloud.aibrix.ai"],
        &["create", "clusterroles.rbac.authorization.k8s.io"],
        &["create", "deployments.apps", "-A"],
        &["create", "serviceaccounts/token", "-A"],
        &["get", "nodes", "--subresource=proxy"],
        &["get", "namespaces/default"],
        &["list", "namespaces"],
        &["update", "namespaces/kube-system"],
        &["update", "secrets", "-n", "default"],
        // Rules the review dropped: nothing the node does lists Nodes or Leases, writes a
        // status with anything but one verb, or replaces a binding whole.
        &["list", "nodes"],
        &["watch", "nodes"],
        &["list", "leases", "-A"],
        &["update", "leases", "-n", "kube-node-lease"],
        &["update", "pods", "--subresource=status", "-A"],
        &["get", "pods", "--subresource=status", "-A"],
        &["update", "cloudpodbindings.cloud.aibrix.ai", "-A"],
        &[
            "patch",
            "cloudpodbindings.cloud.aibrix.ai",
            "--subresource=status",
            "-A",
        ],
        &[
            "update",
            "burstpolicies.cloud.aibrix.ai",
            "--subresource=status",
        ],
        &["list", "podtemplates", "-A"],
    ];
    for args in refused {
        assert!(
            !can(args),
            "the role is broader than listed: it allows {args:?}"
        );
    }
    // ProvisioningRequests (Kueue's): watched, and only their status written.
    let requests = |verb, sub| may(&ctx, sa, verb, "provisioningrequests", sub);
    for (verb, sub) in [("watch", ""), ("get", ""), ("patch", "status")] {
        assert!(
            requests(verb, sub).await,
            "the role should allow {verb} {sub}"
        );
    }
    for (verb, sub) in [("create", ""), ("patch", ""), ("update", "status")] {
        assert!(!requests(verb, sub).await, "the role allows {verb} {sub}");
    }

    // The relay policy: as the node, only relay Pods and Secrets (server-side dry runs).
    let relay = |name: &str, extra: serde_json::Value| {
        let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                "labels": {"cloud.aibrix.ai/relay-for": "u-1"}},
            "spec": {"automountServiceAccountToken": false,
                "containers": [{"name": "relay", "image": "ghcr.io/aibrix/neocloud-node:1",
                    "securityContext": {"allowPrivilegeEscalation": false}}],
                "volumes": [{"name": "relay", "secret": {"secretName": name}}]}});
        merge(&mut pod, extra);
        pod.to_string()
    };
    let as_node = |manifest: String, verb: &str| {
        let out = kubectl_stdin(
            &ctx,
            &["--as", sa, verb, "--dry-run=server", "-f", "-"],
            &manifest,
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = as_node(relay("neocloud-relay-u-1", serde_json::json!({})), "create");
    assert!(ok, "a relay Pod is allowed: {err}");
    let refusals = [
        ("anything else", relay("mallory", serde_json::json!({}))),
        (
            "a token",
            relay(
                "neocloud-relay-u-1",
                serde_json::json!({"spec": {"automountServiceAccountToken": true}}),
            ),
        ),
        (
            "host network",
            relay(
                "neocloud-relay-u-1",
                serde_json::json!({"spec": {"hostNetwork": true}}),
            ),
        ),
        (
            "another Secret",
            relay(
                "neocloud-relay-u-1",
                serde_json::json!({"spec": {"volumes": [{"name": "x", "secret": {"secretName": "creds"}}]}}),
            ),
        ),
        (
            "privilege escalation",
            relay(
                "neocloud-relay-u-1",
                serde_json::json!({"spec": {"containers": [{"name": "relay", "image": "i",
                    "securityContext": {"allowPrivilegeEscalation": true}}]}}),
            ),
        ),
    ];
    for (what, manifest) in refusals {
        let (ok, err) = as_node(manifest, "create");
        assert!(
            !ok && err.contains("aibrix-neocloud-node-relays"),
            "{what}: {err}"
        );
    }
    let secret = |name: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "default",
                "labels": {"cloud.aibrix.ai/relay-for": "u-1"}}})
        .to_string()
    };
    assert!(as_node(secret("neocloud-relay-u-1"), "create").0);
    let (ok, err) = as_node(secret("database-password"), "create");
    assert!(!ok && err.contains("only relay Pods and Secrets"), "{err}");
}

/// `extra`'s fields into `base`, objects merged and everything else replaced.
fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

/// Asserts that a sample's CEL loads (names, fields and operand types are checked at load).
fn compiles(sample: &str, constraint: Option<&str>, rank: Option<&str>) {
    let cel = neocloud_policy::cel::CelEngine::new(neocloud_policy::cel::CelLimits::default());
    if let Some(src) = constraint {
        let compiled = cel.compile_constraint(src);
        compiled.unwrap_or_else(|e| panic!("{sample}: {e}"));
    }
    if let Some(src) = rank {
        let compiled = cel.compile_rank(src);
        compiled.unwrap_or_else(|e| panic!("{sample}: {e}"));
    }
}

#[test]
fn every_sample_pod_is_supported_and_every_sample_policy_parses() {
    let mut pods = 0;
    let mut policies = 0;
    for entry in std::fs::read_dir(repo().join("config/samples")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == "kustomization.yaml" || path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        match doc["kind"].as_str() {
            Some("Pod") => {
                let pod: Pod = serde_yaml::from_str(&text).unwrap();
                let w = neocloud_core::translate_pod(&pod)
                    .unwrap_or_else(|e| panic!("{name} is refused: {e}"));
                compiles(&name, w.constraint.as_deref(), w.rank.as_deref());
                pods += 1;
            }
            Some("BurstPolicy") => {
                let bp: neocloud_node::crd::BurstPolicy = serde_yaml::from_str(&text)
                    .unwrap_or_else(|e| panic!("{name} is not a BurstPolicy: {e}"));
                if let Some(cel) = &bp.spec.cel {
                    compiles(&name, cel.constraints.as_deref(), cel.rank.as_deref());
                }
                policies += 1;
            }
            other => panic!("{name}: unexpected kind {other:?}"),
        }
    }
    assert_eq!((pods, policies), (4, 5));
}
