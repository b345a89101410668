//! `neocloud-node cost report`: what the node's rentals cost, from the `CloudPodBinding`s in the
//! cluster (read with the caller's kubeconfig), grouped by namespace, provider, GPU model or a
//! Pod label, as a table, CSV or JSON. A binding's cost is what its ended instances accrued
//! (`status.costAccruedUsd`) plus, while it runs, its price since its instance was rented. A
//! deleted Pod's binding is gone with it; its `CloudPodReceipt` (kept for the node's
//! `spend.retentionDays`) stands in for it.
//!
//! Not the counter (see `metrics`) nor the ledger the node keeps while it runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, bail};
use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;

use neocloud_node::crd::{CloudPodBinding, CloudPodReceipt};

/// `neocloud-node cost <command>`.
#[derive(Debug, clap::Subcommand)]
pub enum CostCommand {
    /// Print what the rentals cost, grouped.
    Report {
        /// Only bindings created within this window, or still running: `30m`, `12h`, `7d`.
        #[arg(long, default_value = "7d")]
        since: String,
        /// Group by these, comma-separated: namespace, provider, gpu, label:KEY (a Pod label).
        #[arg(long, default_value = "namespace")]
        by: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
        /// Only this namespace.
        #[arg(short, long)]
        namespace: Option<String>,
    },
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

/// One grouping dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Group {
    Namespace,
    Provider,
    Gpu,
    Label(String),
}

impl Group {
    fn title(&self) -> String {
        match self {
            Group::Namespace => "namespace".into(),
            Group::Provider => "provider".into(),
            Group::Gpu => "gpu".into(),
            Group::Label(key) => key.clone(),
        }
    }
}

fn groups(by: &str) -> anyhow::Result<Vec<Group>> {
    let mut groups = Vec::new();
    for word in by.split(',').map(str::trim) {
        let group = match word {
            "namespace" => Group::Namespace,
            "provider" => Group::Provider,
            "gpu" => Group::Gpu,
            _ => match word.strip_prefix("label:") {
                Some(key) if !key.is_empty() => Group::Label(key.to_owned()),
                _ => bail!("--by: {word:?} is not one of namespace, provider, gpu, label:KEY"),
            },
        };
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    Ok(groups)
}

/// `30m`, `12h`, `7d`, `90s`.
fn window(since: &str) -> anyhow::Result<Duration> {
    let refused =
        || anyhow::anyhow!("--since: {since:?} is not a duration such as 90s, 30m, 12h or 7d");
    let (number, unit) = since.split_at(since.len().saturating_sub(1));
    let n: i64 = number.parse().map_err(|_| refused())?;
    if n <= 0 {
        return Err(refused());
    }
    match unit {
        "s" => Ok(Duration::seconds(n)),
        "m" => Ok(Duration::minutes(n)),
        "h" => Ok(Duration::hours(n)),
        "d" => Ok(Duration::days(n)),
        _ => Err(refused()),
    }
}

/// One binding's figures.
#[derive(Debug, Clone)]
struct Cost {
    running: bool,
    usd: f64,
}

/// What `b` has cost at `now` (see [`neocloud_node::crd::CloudPodBindingStatus::cost_usd_at`]).
fn cost_of(b: &CloudPodBinding, now: DateTime<Utc>) -> Cost {
    b.status.as_ref().map_or(
        Cost {
            running: false,
            usd: 0.0,
        },
        |s| Cost {
            running: s.holds_instance(),
            usd: s.cost_usd_at(now),
        },
    )
}

/// One row of the report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// The group's values, in `--by` order.
    pub group: BTreeMap<String, String>,
    pub pods: usize,
    pub running: usize,
    pub usd: f64,
}

/// Runs `command` and returns its output.
pub async fn run(command: CostCommand) -> anyhow::Result<String> {
    let CostCommand::Report {
        since,
        by,
        output,
        namespace,
    } = command;
    let groups = groups(&by)?;
    let window = window(&since)?;
    let client = kube::Client::try_default()
        .await
        .context("failed to build a Kubernetes client (KUBECONFIG or in-cluster)")?;
    let bindings: Api<CloudPodBinding> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let bindings = bindings
        .list(&ListParams::default())
        .await
        .context("failed to list CloudPodBindings")?
        .items;
    let receipts: Api<CloudPodReceipt> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let receipts = match receipts.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // A cluster whose CRDs predate receipts: the report covers the live bindings.
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(anyhow::Error::new(e).context("failed to list CloudPodReceipts")),
    };
    let labels = pod_labels(&client, &bindings, &groups).await?;
    let now = Utc::now();
    let rows = report(&bindings, &receipts, &labels, &groups, now, now - window);
    Ok(render(&rows, &groups, output))
}

/// The labels of the bindings' Pods, by `namespace/pod`, when a group needs them.
async fn pod_labels(
    client: &kube::Client,
    bindings: &[CloudPodBinding],
    groups: &[Group],
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, String>>> {
    let mut labels = BTreeMap::new();
    if !groups.iter().any(|g| matches!(g, Group::Label(_))) {
        return Ok(labels);
    }
    let namespaces: std::collections::BTreeSet<String> =
        bindings.iter().filter_map(|b| b.namespace()).collect();
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let list = pods
            .list(&ListParams::default())
            .await
            .with_context(|| format!("failed to list Pods in {ns}"))?;
        for pod in list.items {
            labels.insert(format!("{ns}/{}", pod.name_any()), pod.labels().clone());
        }
    }
    Ok(labels)
}

/// What one Pod contributes to the report, from its binding or its receipt.
struct Entry<'a> {
    namespace: String,
    provider: Option<&'a str>,
    gpu: Option<&'a str>,
    labels: Option<&'a BTreeMap<String, String>>,
    cost: Cost,
}

fn rfc3339(t: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The Pods in the window: bindings created within it or still running, and receipts of Pods
/// that ended within it and whose binding is not listed (a receipt is written just before its
/// binding goes).
fn entries<'a>(
    bindings: &'a [CloudPodBinding],
    receipts: &'a [CloudPodReceipt],
    labels: &'a BTreeMap<String, BTreeMap<String, String>>,
    now: DateTime<Utc>,
    since: DateTime<Utc>,
) -> Vec<Entry<'a>> {
    let mut out = Vec::new();
    for b in bindings {
        let cost = cost_of(b, now);
        let created = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let recent = created.is_none_or(|c| {
            DateTime::<Utc>::from_timestamp(c.as_second(), 0).is_none_or(|c| c >= since)
        });
        if !(cost.running || recent) {
            continue;
        }
        let ns = b.namespace().unwrap_or_default();
        let status = b.status.as_ref();
        out.push(Entry {
            labels: labels.get(&format!("{ns}/{}", b.spec.pod_name)),
            namespace: ns,
            provider: status.and_then(|s| s.provider.as_deref()),
            gpu: status.and_then(|s| s.gpu.as_deref()),
            cost,
        });
    }
    let listed: std::collections::BTreeSet<&str> =
        bindings.iter().map(|b| b.spec.pod_uid.as_str()).collect();
    for r in receipts {
        if listed.contains(r.spec.pod_uid.as_str())
            || rfc3339(&r.spec.ended_at).is_some_and(|t| t < since)
        {
            continue;
        }
        out.push(Entry {
            namespace: r.namespace().unwrap_or_default(),
            provider: r.spec.provider.as_deref(),
            gpu: r.spec.gpu.as_deref(),
            labels: Some(&r.spec.pod_labels),
            cost: Cost {
                running: false,
                usd: r.spec.cost_usd,
            },
        });
    }
    out
}

fn report(
    bindings: &[CloudPodBinding],
    receipts: &[CloudPodReceipt],
    labels: &BTreeMap<String, BTreeMap<String, String>>,
    groups: &[Group],
    now: DateTime<Utc>,
    since: DateTime<Utc>,
) -> Vec<Row> {
    let mut rows: BTreeMap<Vec<String>, Row> = BTreeMap::new();
    for e in entries(bindings, receipts, labels, now, since) {
        let values: Vec<String> = groups
            .iter()
            .map(|g| match g {
                Group::Namespace => e.namespace.clone(),
                Group::Provider => e.provider.unwrap_or_default().to_owned(),
                Group::Gpu => e
                    .gpu
                    .map(|gpu| neocloud_node::crd::gpu_model(gpu).to_owned())
                    .unwrap_or_default(),
                Group::Label(key) => e
                    .labels
                    .and_then(|l| l.get(key))
                    .cloned()
                    .unwrap_or_default(),
            })
            .collect();
        let row = rows.entry(values.clone()).or_insert_with(|| Row {
            group: groups.iter().map(Group::title).zip(values).collect(),
            pods: 0,
            running: 0,
            usd: 0.0,
        });
        row.pods += 1;
        row.running += usize::from(e.cost.running);
        row.usd += e.cost.usd;
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| b.usd.total_cmp(&a.usd));
    rows
}

/// The rows' USD together; nothing spent is `0` (a float sum of nothing is `-0`, which would
/// print as `-0.0000`).
fn total_usd(rows: &[Row]) -> f64 {
    rows.iter().fold(0.0, |sum, r| sum + r.usd)
}

fn render(rows: &[Row], groups: &[Group], format: Format) -> String {
    let titles: Vec<String> = groups.iter().map(Group::title).collect();
    let cells = |row: &Row| -> Vec<String> {
        titles
            .iter()
            .map(|t| row.group.get(t).cloned().unwrap_or_default())
            .chain([
                row.pods.to_string(),
                row.running.to_string(),
                format!("{:.4}", row.usd),
            ])
            .collect()
    };
    let header: Vec<String> = titles
        .iter()
        .map(|t| t.to_uppercase())
        .chain(["PODS".into(), "RUNNING".into(), "USD".into()])
        .collect();
    match format {
        Format::Json => {
            let total = total_usd(rows);
            let value = serde_json::json!({ "rows": rows, "totalUsd": total });
            format!(
                "{}\n",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            )
        }
        Format::Csv => {
            let mut out = String::new();
            let csv = |cells: &[String]| -> String {
                cells
                    .iter()
                    .map(|c| {
                        if c.contains([',', '"', '\n']) {
                            format!("\"{}\"", c.replace('"', "\"\""))
                        } else {
                            c.clone()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let lower: Vec<String> = header.iter().map(|h| h.to_lowercase()).collect();
            let _ = writeln!(out, "{}", csv(&lower));
            for row in rows {
                let _ = writeln!(out, "{}", csv(&cells(row)));
            }
            out
        }
        Format::Table => {
            let body: Vec<Vec<String>> = rows.iter().map(cells).collect();
            let widths: Vec<usize> = (0..header.len())
                .map(|i| {
                    body.iter()
                        .map(|r| r[i].len())
                        .chain([header[i].len()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |cells: &[String]| -> String {
                let padded: Vec<String> = cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                padded.join("  ").trim_end().to_owned()
            };
            let mut out = format!("{}\n", line(&header));
            for row in &body {
                let _ = writeln!(out, "{}", line(row));
            }
            let total = total_usd(rows);
            let _ = writeln!(out, "total {total:.4} USD");
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_groups_are_parsed_or_refused_by_name() {
        assert_eq!(window("7d").unwrap(), Duration::days(7));
        assert_eq!(window("90s").unwrap(), Duration::seconds(90));
        for bad in ["", "7", "d", "-1h", "0m", "3w"] {
            let e = window(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--since: {bad:?}")), "{e}");
        }
        assert_eq!(
            groups("namespace, label:team,namespace").unwrap(),
            [Group::Namespace, Group::Label("team".into())]
        );
        let e = groups("pod").unwrap_err().to_string();
        assert!(e.contains("--by: \"pod\" is not one of"), "{e}");
        assert!(groups("label:").is_err());
    }

    fn binding(
        ns: &str,
        pod: &str,
        provider: &str,
        accrued: f64,
        running_price: Option<f64>,
    ) -> CloudPodBinding {
        let rented = chrono::Utc::now() - Duration::hours(2);
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "CloudPodBinding",
            "metadata": {"name": pod, "namespace": ns},
            "spec": {"podName": pod, "podUid": "u", "externalName": "e", "clusterId": "c",
                     "workload": {"image": "i", "gpuCount": 1, "capacityType": "any"}},
            "status": {
                "phase": if running_price.is_some() { "Running" } else { "Succeeded" },
                "provider": provider, "gpu": "1x A40",
                "instanceId": running_price.map(|_| "i-1"),
                "pricePerHour": running_price,
                "costAccruedUsd": accrued,
                "attempts": [{"number": 1, "provider": provider, "offerId": "o",
                    "pricePerHour": running_price.unwrap_or(1.0),
                    "startedAt": rented.to_rfc3339(), "finishedAt": rented.to_rfc3339(),
                    "outcome": "Created"}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn running_bindings_add_their_price_since_rented_and_groups_sum() {
        let now = Utc::now();
        let bindings = [
            binding("ml", "a", "runpod", 0.5, Some(1.0)),
            binding("ml", "b", "vast", 0.25, None),
            binding("web", "c", "vast", 1.0, None),
        ];
        let mut labels = BTreeMap::new();
        labels.insert(
            "ml/a".to_owned(),
            BTreeMap::from([("team".to_owned(), "vision".to_owned())]),
        );
        let by = groups("namespace,label:team").unwrap();
        let receipt: CloudPodReceipt = serde_json::from_value(serde_json::json!({
            "apiVersion": "cloud.aibrix.ai/v1alpha1", "kind": "CloudPodReceipt",
            "metadata": {"name": "gone-u2", "namespace": "web"},
            "spec": {"podName": "gone", "podUid": "u2", "clusterId": "c",
                     "podLabels": {"team": "vision"}, "provider": "lambda", "gpu": "1x A10",
                     "boundAt": (now - Duration::hours(3)).to_rfc3339(),
                     "endedAt": (now - Duration::hours(1)).to_rfc3339(), "costUsd": 2.0}
        }))
        .unwrap();
        let mut old = receipt.clone();
        old.spec.pod_uid = "u3".into();
        old.spec.ended_at = (now - Duration::days(8)).to_rfc3339();
        // A receipt whose binding is still listed is not counted twice.
        let mut twin = receipt.clone();
        twin.spec.pod_uid = "u".into();
        let receipts = [receipt, old, twin];
        let rows = report(
            &bindings[..1],
            &receipts,
            &labels,
            &groups("label:team").unwrap(),
            now,
            now - Duration::days(7),
        );
        // a (running, about 2.5) and the gone Pod (2.0); not the old receipt nor the twin.
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!((rows[0].pods, rows[0].running), (2, 1), "{rows:?}");
        assert!((rows[0].usd - 4.5).abs() < 0.01, "{rows:?}");
        let rows = report(
            &bindings[1..],
            &receipts,
            &labels,
            &groups("label:team,provider").unwrap(),
            now,
            now - Duration::days(7),
        );
        let gone = rows
            .iter()
            .find(|r| r.group["provider"] == "lambda")
            .unwrap();
        assert_eq!((gone.pods, gone.running, gone.usd), (1, 0, 2.0), "{rows:?}");
        assert_eq!(gone.group["team"], "vision");

        let rows = report(&bindings, &[], &labels, &by, now, now - Duration::days(7));
        assert_eq!(rows.len(), 3);
        let vision = rows.iter().find(|r| r.group["team"] == "vision").unwrap();
        assert!((vision.usd - 2.5).abs() < 0.01, "{vision:?}");
        assert_eq!((vision.pods, vision.running), (1, 1));
        let csv = render(&rows, &by, Format::Csv);
        assert!(
            csv.starts_with("namespace,team,pods,running,usd\n"),
            "{csv}"
        );
        assert_eq!(csv.lines().count(), 4);
        let json: serde_json::Value =
            serde_json::from_str(&render(&rows, &by, Format::Json)).unwrap();
        assert!(
            (json["totalUsd"].as_f64().unwrap() - 3.75).abs() < 0.01,
            "{json}"
        );
        let table = render(&rows, &by, Format::Table);
        assert!(
            table.starts_with("NAMESPACE  TEAM") && table.contains("total 3.75"),
            "{table}"
        );
    }

    #[test]
    fn nothing_spent_totals_zero_not_minus_zero() {
        let by = groups("namespace").unwrap();
        let table = render(&[], &by, Format::Table);
        assert!(table.contains("total 0.0000 USD"), "{table}");
        let json = render(&[], &by, Format::Json);
        assert!(json.contains("\"totalUsd\": 0.0"), "{json}");
        assert!(!json.contains("-0"), "{json}");
    }
}
