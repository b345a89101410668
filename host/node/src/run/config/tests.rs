//! Tests of `config`.

use super::*;

const MINIMAL: &str = "clusterId: prod1\nnode: {name: neocloud-node}\n";

#[test]
fn a_minimal_file_gets_every_default() {
    let c = RunConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(c.cluster().unwrap().unwrap().prefix(), "ncn-prod1-");
    assert!(c.leader_election.enabled);
    assert_eq!(c.metrics_address, "0.0.0.0:8080");
    assert_eq!(c.sweeper.interval, Duration::from_secs(300));
    assert_eq!(c.provider_ids(None).unwrap(), vec![ProviderId::Fake]);
    assert_eq!(
        c.provider_ids(Some("runpod, vast")).unwrap(),
        vec![ProviderId::Runpod, ProviderId::Vast]
    );
}

#[test]
fn the_example_config_parses() {
    let c = RunConfig::from_yaml(include_str!("../../../../../examples/node.yaml")).unwrap();
    assert_eq!(
        (c.cluster_id.as_deref(), c.node.name.as_str()),
        (Some("dev1"), "neocloud-node")
    );
    assert_eq!(c.providers, vec![ProviderId::Fake]);
}

#[test]
fn remote_clusters_are_read_and_bad_ones_refused_by_field() {
    let good = format!(
        "{MINIMAL}providers: [kube, fake]\nremoteClusters:\n- {{name: gpu-west, namespace: burst, \
         kubeconfig: {{secret: west}}, gpuPrices: {{NVIDIA-A100-SXM4-80GB: 1.6}}}}\n"
    );
    let c = RunConfig::from_yaml(&good).unwrap();
    assert_eq!(c.remote_clusters[0].name, "gpu-west");
    assert_eq!(c.provider_ids(None).unwrap()[0], ProviderId::Kube);
    let e = RunConfig::from_yaml(&good.replace("1.6", "-1")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("remoteClusters[0].gpuPrices[\"NVIDIA-A100-SXM4-80GB\"]: -1"),
        "{e}"
    );
    let e = RunConfig::from_yaml(&format!("{MINIMAL}providers: [kube]\n")).unwrap_err();
    assert!(e.to_string().contains("remoteClusters"), "{e}");
    assert!(RunConfig::from_yaml(&good.replace("namespace: burst", "namespace: Burst")).is_err());
    let nvke = format!(
        "{MINIMAL}providers: [kube]\nnvke: {{url: 'https://nvke.example.com', \
         tokenSecret: nvke-token, namespace: burst, gpuPrices: {{H100: 2.5}}}}\n"
    );
    let c = RunConfig::from_yaml(&nvke).unwrap();
    assert_eq!(c.nvke.as_ref().unwrap().interval_seconds, 30);
    let e = RunConfig::from_yaml(&nvke.replace("https://", "ftp://")).unwrap_err();
    assert!(e.to_string().starts_with("nvke.url: \"ftp://"), "{e}");
}

#[test]
fn spend_is_labelled_by_namespace_provider_and_gpu_unless_configured() {
    let c = RunConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(c.spend.labels, DEFAULT_SPEND_LABELS);
    let text = format!("{MINIMAL}spend: {{labels: [team, gpu], teamLabel: example.com/team}}\n");
    let c = RunConfig::from_yaml(&text).unwrap();
    assert_eq!(c.spend.labels, [SpendLabel::Team, SpendLabel::Gpu]);
    assert_eq!(c.spend.team_label.as_deref(), Some("example.com/team"));
}

#[test]
fn receipts_are_kept_thirty_days_unless_configured() {
    let c = RunConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(c.spend.retention(), Some(Duration::from_secs(30 * 86_400)));
    let c = RunConfig::from_yaml(&format!("{MINIMAL}spend: {{retentionDays: 0}}\n")).unwrap();
    assert_eq!(c.spend.retention(), None);
    let c = RunConfig::from_yaml(&format!("{MINIMAL}spend: {{retentionDays: 90}}\n")).unwrap();
    assert_eq!(c.spend.retention(), Some(Duration::from_secs(90 * 86_400)));
}

#[test]
fn providers_under_node_are_refused_by_name_not_overwritten() {
    let e = RunConfig::from_yaml("node: {name: n, providers: [runpod]}\n").unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("unknown field `providers`"), "{e}");
}

#[test]
fn an_unset_cluster_id_is_left_to_be_derived() {
    let c = RunConfig::from_yaml("node: {name: neocloud-node}\n").unwrap();
    assert_eq!(c.cluster_id, None);
    assert_eq!(c.cluster().unwrap(), None);
}

#[test]
fn bad_values_are_refused_by_field_and_value() {
    let cases = [
        (
            "clusterId: prod-1\nnode: {name: n}\n",
            "clusterId: \"prod-1\"",
        ),
        (
            "clusterId: p\nnode: {name: n}\nbudgetUsdPerHour: -3\n",
            "budgetUsdPerHour: -3",
        ),
        (
            "clusterId: p\nnode: {name: n}\nmetricsAddress: localhost\n",
            "metricsAddress: \"localhost\"",
        ),
        (
            "clusterId: p\nnode: {name: n}\nbudget: 3\n",
            "unknown field `budget`",
        ),
        (
            "clusterId: p\nnode: {name: n}\nspend: {labels: [namespace, team]}\n",
            "spend.labels: team needs spend.teamLabel",
        ),
        (
            "clusterId: p\nnode: {name: n}\nspend: {retentionDays: 4000}\n",
            "spend.retentionDays: 4000 is more than ten years",
        ),
        (
            "clusterId: p\nnode: {name: n}\nspend: {retentionDays: -1}\n",
            "retentionDays",
        ),
        (
            "clusterId: p\nnode: {name: n}\nspend: {labels: [pod]}\n",
            "unknown variant `pod`",
        ),
        (
            "clusterId: p\nnode: {name: n}\nspend: {teamLabel: \"my team\"}\n",
            "spend.teamLabel: \"my team\" is not a Pod label key",
        ),
        (
            "clusterId: p\nnode: {name: n}\nleaderElection: {leaseDurationSeconds: 5}\n",
            "leaderElection.renewGraceSeconds: 5",
        ),
        (
            "clusterId: p\nnode: {name: n}\nwatchNamespaces: []\n",
            "watchNamespaces: [] names no namespace",
        ),
        (
            "clusterId: p\nnode: {name: n}\nfake: {workloadSeconds: 0}\n",
            "fake.workloadSeconds: 0 must be at least 1",
        ),
        (
            "clusterId: p\nnode: {name: n}\nfake: {runSeconds: 5}\n",
            "unknown field `runSeconds`",
        ),
        (
            "clusterId: p\nnode: {name: n}\nwatchNamespaces: [team-a, Team_B]\n",
            "watchNamespaces: \"Team_B\" is not a namespace name",
        ),
        (
            "clusterId: p\nnode: {name: n}\npolicies: {wasmDir: policies}\n",
            "policies.wasmDir: \"policies\" is not an absolute path",
        ),
        (
            "clusterId: p\nnode: {name: n}\npolicies: {cacheDir: cache}\n",
            "policies.cacheDir: \"cache\" is not an absolute path",
        ),
        (
            "clusterId: p\nnode: {name: n}\npolicies: {cacheDir: /c, cacheMaxMib: 0}\n",
            "policies.cacheMaxMib: 0 keeps nothing",
        ),
    ];
    for (yaml, want) in cases {
        let e = format!("{:#}", RunConfig::from_yaml(yaml).unwrap_err());
        assert!(e.contains(want), "{yaml}: {e}");
    }
    let c = RunConfig::from_yaml(MINIMAL).unwrap();
    let e = c.provider_ids(Some("runpod,aws")).unwrap_err().to_string();
    assert!(e.contains("GPU_BURST_PROVIDER: \"aws\""), "{e}");
}
