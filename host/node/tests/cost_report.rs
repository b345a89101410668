//! `neocloud-node cost report` against the real API server: Pods in three namespaces on three
//! providers, placed by the reconciler against the simulators; the report, grouped by
//! namespace, provider and a Pod label, as JSON, CSV and a table, agrees with the simulators'
//! ledgers, a Pod deleted before the report included (through its `CloudPodReceipt`, written
//! with the node's own RBAC and expired after the retention); bad arguments are refused by name.

use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use neocloud_node::crd::CloudPodReceipt;
use serde_json::{Value, json};

mod support;
use support::world::{World, running};

fn report(world: &World, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_neocloud-node"))
        .args(["cost", "report"])
        .args(args)
        .env("KUBECONFIG", world.ctx.control_plane.admin_kubeconfig())
        .output()
        .expect("run neocloud-node")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Pod on the node in `ns`, labelled with `team`, on `provider` only.
async fn pod(world: &World, ns: &str, name: &str, team: &str, provider: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"team": team},
            "annotations": {"cloud.aibrix.ai/providers": provider}},
        "spec": {
            "nodeName": world.node,
            "restartPolicy": "Never",
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(world.ctx.client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

async fn wait_running(world: &World, ns: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(world.ctx.client.clone(), ns);
    for _ in 0..600 {
        if pods.get(name).await.is_ok_and(|p| running(&p)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{ns}/{name} never ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_report_groups_what_the_simulators_billed() {
    let world = World::new("cost").await;
    let base = world.ctx.namespace.clone();
    let namespaces = [base.clone(), format!("{base}-b"), format!("{base}-c")];
    for ns in &namespaces[1..] {
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(world.ctx.client.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
    let placed = [
        (&namespaces[0], "p-runpod", "vision", "runpod"),
        (&namespaces[1], "p-lambda", "vision", "lambda"),
        (&namespaces[2], "p-vast", "speech", "vast"),
    ];
    for (ns, name, team, provider) in placed {
        pod(&world, ns, name, team, provider).await;
    }
    for (ns, name, _, _) in placed {
        wait_running(&world, ns, name).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The Vast Pod is deleted before the report: its binding goes, its receipt stays.
    let gone_ns = &namespaces[2];
    Api::<Pod>::namespaced(world.ctx.client.clone(), gone_ns)
        .delete("p-vast", &DeleteParams::default())
        .await
        .unwrap();
    let receipts: Api<CloudPodReceipt> = Api::namespaced(world.ctx.client.clone(), gone_ns);
    let mut receipt = None;
    for _ in 0..300 {
        let pod_gone = Api::<Pod>::namespaced(world.ctx.client.clone(), gone_ns)
            .get_opt("p-vast")
            .await
            .unwrap()
            .is_none();
        let listed = receipts.list(&ListParams::default()).await.unwrap().items;
        if pod_gone && let Some(r) = listed.into_iter().next() {
            receipt = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let receipt = receipt.expect("a receipt for the deleted Pod");
    assert_eq!(receipt.spec.pod_name, "p-vast");
    assert_eq!(receipt.spec.provider.as_deref(), Some("vast"));
    assert_eq!(
        receipt.spec.pod_labels.get("team").map(String::as_str),
        Some("speech")
    );
    let vast_billed: f64 = world
        .sims
        .ledger()
        .entries
        .iter()
        .filter(|e| e.provider == "vast")
        .map(|e| e.cost_usd)
        .sum();
    assert!(
        (receipt.spec.cost_usd - vast_billed).abs() < 0.01,
        "receipt {}, billed {vast_billed}",
        receipt.spec.cost_usd
    );

    let out = stdout(&report(
        &world,
        &["--by", "namespace,provider,label:team", "-o", "json"],
    ));
    let ledger = world.sims.ledger();
    let json: Value = serde_json::from_str(&out).unwrap();
    let rows = json["rows"].as_array().unwrap();
    for (ns, name, team, provider) in placed {
        let gone = name == "p-vast";
        let row = rows
            .iter()
            .find(|r| r["group"]["namespace"] == ns.as_str())
            .unwrap_or_else(|| panic!("no row for {ns}: {out}"));
        assert_eq!(row["group"]["provider"], provider, "{out}");
        assert_eq!(row["group"]["team"], team, "{out}");
        assert_eq!(
            (row["pods"].as_u64(), row["running"].as_u64()),
            (Some(1), Some(u64::from(!gone))),
            "{out}"
        );
        let usd = row["usd"].as_f64().unwrap();
        let billed: f64 = ledger
            .entries
            .iter()
            .filter(|e| e.provider == provider && (gone || e.is_live()))
            .map(|e| e.cost_usd)
            .sum();
        assert!(usd > 0.0, "{out}");
        // The node counts from the rental's answer, the simulator from its create: they agree
        // to the cent over these seconds.
        assert!(
            (usd - billed).abs() < 0.01,
            "{provider}: report {usd}, billed {billed}"
        );
    }

    let csv = stdout(&report(&world, &["--by", "label:team", "-o", "csv"]));
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "team,pods,running,usd", "{csv}");
    assert_eq!(lines.len(), 3, "two teams: {csv}");
    assert!(lines.iter().any(|l| l.starts_with("vision,2,2,")), "{csv}");
    assert!(lines.iter().any(|l| l.starts_with("speech,1,0,")), "{csv}");
    let table = stdout(&report(&world, &["--by", "provider", "-n", &base]));
    assert!(table.starts_with("PROVIDER  PODS  RUNNING  USD"), "{table}");
    assert_eq!(
        table.lines().count(),
        3,
        "one provider and the total: {table}"
    );

    // Receipts go once the retention (30 days by default) is past, and not before.
    let node = world.current.clone().unwrap();
    assert_eq!(node.expire_receipts(chrono::Utc::now()).await.unwrap(), 0);
    let later = chrono::Utc::now() + chrono::Duration::days(31);
    assert_eq!(node.expire_receipts(later).await.unwrap(), 1);
    assert!(
        receipts
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    for (args, why) in [
        (vec!["--by", "pod"], "--by: \"pod\" is not one of"),
        (vec!["--since", "3w"], "--since: \"3w\" is not a duration"),
    ] {
        let out = report(&world, &args);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{stderr}");
    }
}
