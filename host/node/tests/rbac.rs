//! Least privilege with `watchNamespaces` (config/namespaced: config/default with the
//! config/components/watch-namespaces component), on the real control plane: the node's
//! ServiceAccount reads Secrets and ConfigMaps only in the watched namespace (and its own
//! identity Secret), and keeps what the node needs everywhere else. Its own test binary, so its
//! control plane holds no default install binding the same ServiceAccount cluster-wide.

use std::path::Path;

use neocloud_node::run::RunConfig;
use neocloud_testenv::TestContext;

mod support;
use support::can_i;

#[tokio::test(flavor = "multi_thread")]
async fn the_namespaced_install_reads_secrets_only_in_its_watched_namespaces() {
    let ctx = TestContext::new("rbac-ns").await;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = ctx
        .control_plane
        .kubectl()
        .current_dir(&repo)
        .args(["apply", "-k", "config/namespaced"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sa = "system:serviceaccount:aibrix-system:aibrix-neocloud-node";
    let can = |args: &[&str]| can_i(&ctx, sa, args);
    let allowed: &[&[&str]] = &[
        &["get", "secrets", "-n", "gpu-jobs"],
        &["get", "configmaps", "-n", "gpu-jobs"],
        &["get", "secrets", "-n", "aibrix-system"],
        &["create", "secrets", "-n", "aibrix-system"],
        &["watch", "pods", "-A"],
        &["patch", "pods", "--subresource=status", "-A"],
        // the leader's label on the node's own Pods
        &["patch", "pods", "-n", "aibrix-system"],
        &["create", "events", "-n", "gpu-jobs"],
        // relays of its burst Pods, there only
        &["create", "secrets", "-n", "gpu-jobs"],
        &["create", "pods", "-n", "gpu-jobs"],
    ];
    for args in allowed {
        assert!(can(args), "the namespaced install should allow {args:?}");
    }
    let refused: &[&[&str]] = &[
        &["get", "secrets", "-n", "default"],
        &["get", "secrets", "-n", "kube-system"],
        &["get", "configmaps", "-n", "default"],
        &["get", "secrets", "-A"],
        &["list", "secrets", "-n", "gpu-jobs"],
        &["watch", "configmaps", "-n", "gpu-jobs"],
        &["create", "secrets", "-n", "default"],
        &["create", "pods", "-n", "default"],
        &["delete", "secrets", "-n", "kube-system"],
        &["patch", "pods", "-n", "gpu-jobs"],
    ];
    for args in refused {
        assert!(!can(args), "the namespaced install allows {args:?}");
    }
    let config = ctx
        .control_plane
        .kubectl()
        .args([
            "-n",
            "aibrix-system",
            "get",
            "configmap",
            "aibrix-neocloud-node-config",
        ])
        .args(["-o", "jsonpath={.data.node\\.yaml}"])
        .output()
        .unwrap();
    let config = RunConfig::from_yaml(&String::from_utf8_lossy(&config.stdout)).unwrap();
    assert_eq!(config.watch_namespaces, Some(vec!["gpu-jobs".to_owned()]));
}
