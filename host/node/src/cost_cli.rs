//! `neocloud-node cost report`: what the node's rentals cost, from the `CloudPodBinding`s in the
//! cluster (read with the caller's kubeconfig), grouped by namespace, provider, GPU model or a
//! Pod label, as a table, CSV or JSON. A binding's cost is what its ended instances accrued
//! (`status.costAccruedUsd`) plus, while it runs, its price since its instance was rented. The
//! report covers the bindings that still exist (a Pod's binding goes with the Pod); spend of
//! deleted Pods is in `neocloud_spend_usd_total`.
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

use crate::crd::{BindingPhase, CloudPodBinding};

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

/// What `b` has cost at `now`: its ended instances' accrual, and while it runs, its price since
/// its current instance was rented (the last rented attempt's outcome time).
fn cost_of(b: &CloudPodBinding, now: DateTime<Utc>) -> Cost {
    let Some(s) = b.status.as_ref() else {
        return Cost {
            running: false,
            usd: 0.0,
        };
    };
    let running = matches!(s.phase, BindingPhase::Running | BindingPhase::Provisioning)
        && s.instance_id.is_some();
    let mut usd = s.cost_accrued_usd;
    if running
        && let Some(price) = s.price_per_hour
        && let Some(since) = s.rented_at()
    {
        let ms = (now - since).num_milliseconds().max(0) as f64;
        usd += price * ms / 3_600_000.0;
    }
    Cost { running, usd }
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
    let labels = pod_labels(&client, &bindings, &groups).await?;
    let now = Utc::now();
    let rows = report(&bindings, &labels, &groups, now, now - window);
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

fn report(
    bindings: &[CloudPodBinding],
    labels: &BTreeMap<String, BTreeMap<String, String>>,
    groups: &[Group],
    now: DateTime<Utc>,
    since: DateTime<Utc>,
) -> Vec<Row> {
    let mut rows: BTreeMap<Vec<String>, Row> = BTreeMap::new();
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
        let values: Vec<String> = groups
            .iter()
            .map(|g| match g {
                Group::Namespace => ns.clone(),
                Group::Provider => status.and_then(|s| s.provider.clone()).unwrap_or_default(),
                Group::Gpu => status
                    .and_then(|s| s.gpu.as_deref())
                    .map(|gpu| crate::crd::gpu_model(gpu).to_owned())
                    .unwrap_or_default(),
                Group::Label(key) => labels
                    .get(&format!("{ns}/{}", b.spec.pod_name))
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
        row.running += usize::from(cost.running);
        row.usd += cost.usd;
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| b.usd.total_cmp(&a.usd));
    rows
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
            let total: f64 = rows.iter().map(|r| r.usd).sum();
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
            let total: f64 = rows.iter().map(|r| r.usd).sum();
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
        let rows = report(&bindings, &labels, &by, now, now - Duration::days(7));
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
}
