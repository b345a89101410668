//! The node's configuration file (`neocloud-node run --config node.yaml`): identity, providers,
//! budget, sweeper, leader election and reconciler timing. Unknown fields are refused by name;
//! every default is written here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use neocloud_core::ProviderId;
use serde::Deserialize;

use crate::metrics::{DEFAULT_SPEND_LABELS, SpendLabel};
use crate::naming::ClusterId;
use crate::sweeper::SweeperConfig;
use crate::vnode::NodeConfig;

/// The whole file.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunConfig {
    /// This cluster's identity in every external name: 1-16 of `[a-z0-9]`. Unset: derived from
    /// the UID of the `kube-system` namespace at start ([`ClusterId::derived_from_uid`]).
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// The Node: name, taint, limits.
    pub node: NodeConfig,
    /// Enabled providers. Empty: `GPU_BURST_PROVIDER` (comma-separated), else `fake`.
    #[serde(default)]
    pub providers: Vec<ProviderId>,
    /// The cluster budget, USD per hour over every running and starting instance.
    #[serde(default)]
    pub budget_usd_per_hour: Option<f64>,
    /// The orphan sweeper.
    #[serde(default)]
    pub sweeper: SweeperConfig,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[serde(default = "default_metrics_address")]
    pub metrics_address: String,
    /// One active replica at a time.
    #[serde(default)]
    pub leader_election: LeaderElection,
    /// Reconciler timing and concurrency.
    #[serde(default)]
    pub reconciler: ReconcilerSettings,
    /// Apply the CRDs at start (handy for local runs; installs normally ship them).
    #[serde(default)]
    pub install_crds: bool,
    /// How often provider health is checked, seconds.
    #[serde(default = "default_health_seconds")]
    pub health_interval_seconds: u64,
    /// The fake provider's workloads.
    #[serde(default)]
    pub fake: FakeSettings,
    /// The VM runner for Lambda Cloud. Without it a Lambda Pod is Running once its VM is.
    #[serde(default)]
    pub runner: Option<super::vm::RunnerSettings>,
    /// The kubelet API (`kubectl logs`) on `node.kubeletPort`.
    #[serde(default)]
    pub kubelet_api: super::kubelet_api::KubeletApiSettings,
    /// Where BurstPolicies may read Wasm components from.
    #[serde(default)]
    pub policies: PolicySettings,
    /// The namespaces whose Pods the node serves; unset: every namespace. A Pod elsewhere that
    /// is scheduled onto the node stays Pending with reason `NamespaceNotWatched`, and the node
    /// needs to read Secrets and ConfigMaps only in these (see docs/INSTALL.md).
    #[serde(default)]
    pub watch_namespaces: Option<Vec<String>>,
    /// What `neocloud_spend_usd_total` is labelled by.
    #[serde(default)]
    pub spend: SpendSettings,
    /// Other Kubernetes clusters the `kube` provider rents GPUs on (see
    /// docs/REMOTE-CLUSTERS.md). Only read when `kube` is an enabled provider.
    #[serde(default)]
    pub remote_clusters: Vec<neocloud_kube_target::RemoteCluster>,
    /// NVKE discovery: the workload clusters an NVKE management plane provisions join
    /// `remoteClusters` by themselves (see docs/REMOTE-CLUSTERS.md).
    #[serde(default)]
    pub nvke: Option<neocloud_kube_target::NvkeDiscovery>,
    /// The ProvisioningRequest class `rent.cloud.aibrix.ai`, which Kueue's ProvisioningRequest
    /// admission check asks before it admits a Workload (see docs/KUEUE.md).
    #[serde(default)]
    pub provisioning: ProvisioningSettings,
}

/// The `provisioning:` section.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProvisioningSettings {
    /// Serve the class: plan each request's Pods at once in one provider and region, and hold
    /// their budget until the Pods come. Where the ProvisioningRequest API is not served (no
    /// Kueue or cluster-autoscaler CRD), the node says so once in its log and waits for it.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long the budget held for a request waits for its Pods, seconds; what they have not
    /// taken by then is released and the request is `BookingExpired`. A request's
    /// `ValidUntilSeconds` parameter may shorten it.
    #[serde(default = "default_booking_seconds")]
    pub booking_seconds: u64,
}

impl Default for ProvisioningSettings {
    fn default() -> Self {
        ProvisioningSettings {
            enabled: true,
            booking_seconds: default_booking_seconds(),
        }
    }
}

fn default_booking_seconds() -> u64 {
    600
}

impl ProvisioningSettings {
    fn check(&self) -> anyhow::Result<()> {
        if self.booking_seconds == 0 {
            bail!("provisioning.bookingSeconds: 0 must be at least 1");
        }
        Ok(())
    }

    /// The controller's configuration.
    pub fn config(&self) -> neocloud_provisioning::ProvisioningConfig {
        neocloud_provisioning::ProvisioningConfig {
            booking: Duration::from_secs(self.booking_seconds),
            ..Default::default()
        }
    }
}

/// The `fake:` section: how the in-process fake cloud (provider `fake`) treats workloads.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FakeSettings {
    /// The fake runs nothing; with this, each workload ends this many seconds after its
    /// instance started, with exit code 0 (a Pod with `restartPolicy: Never` then Succeeds).
    /// Unset: workloads run until their Pod is deleted.
    #[serde(default)]
    pub workload_seconds: Option<u64>,
}

/// The `spend:` section.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpendSettings {
    /// The labels of `neocloud_spend_usd_total`, among `namespace`, `team`, `provider` and
    /// `gpu` (default: namespace, provider, gpu). Each multiplies the series.
    #[serde(default = "default_spend_labels")]
    pub labels: Vec<SpendLabel>,
    /// The Pod label whose value is the `team` label (required when `labels` has `team`).
    #[serde(default)]
    pub team_label: Option<String>,
    /// Days a deleted Pod's `CloudPodReceipt` is kept for `cost report` (default 30); 0 writes
    /// none.
    #[serde(default = "default_retention_days")]
    pub retention_days: u32,
}

fn default_retention_days() -> u32 {
    30
}

impl Default for SpendSettings {
    fn default() -> Self {
        SpendSettings {
            labels: default_spend_labels(),
            team_label: None,
            retention_days: default_retention_days(),
        }
    }
}

fn default_spend_labels() -> Vec<SpendLabel> {
    DEFAULT_SPEND_LABELS.to_vec()
}

impl SpendSettings {
    /// How long receipts are kept; `None`: none are written.
    pub fn retention(&self) -> Option<Duration> {
        (self.retention_days > 0)
            .then(|| Duration::from_secs(u64::from(self.retention_days) * 86_400))
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.retention_days > 3_650 {
            bail!(
                "spend.retentionDays: {} is more than ten years (3650 days); 0 keeps no receipts",
                self.retention_days
            );
        }
        if self.labels.contains(&SpendLabel::Team) && self.team_label.is_none() {
            bail!("spend.labels: team needs spend.teamLabel, the Pod label that names the team");
        }
        if let Some(key) = &self.team_label {
            let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
            let name_ok = !name.is_empty()
                && name.len() <= 63
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && name.ends_with(|c: char| c.is_ascii_alphanumeric());
            let prefix_ok = prefix.len() <= 253
                && prefix.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.')
                });
            if !(name_ok && prefix_ok) || key.ends_with('/') {
                bail!(
                    "spend.teamLabel: {key:?} is not a Pod label key (such as team or example.com/team)"
                );
            }
        }
        Ok(())
    }
}

/// The `policies:` section.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicySettings {
    /// The one directory a `spec.wasm.path` may name a file in (after symlinks and `..` are
    /// resolved); a relative `path` is taken inside it. An absolute path.
    #[serde(default = "default_wasm_dir")]
    pub wasm_dir: PathBuf,
    /// Where compiled components are kept across restarts, so a restarted node loads its
    /// policies in well under a second instead of compiling them again (most of a minute for a
    /// Python one in a debug build, seconds in a release one). An absolute path on a writable
    /// volume; the shipped manifests mount an `emptyDir` at `/var/cache/neocloud-node/wasm`,
    /// which outlives a container restart but not the Pod. Unset: nothing is kept on disk (the
    /// shipped manifests' root filesystem is read-only, so no default path would be writable).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// The largest size of `cacheDir`, in MiB; the oldest entries past it are removed at start
    /// (and by wasmtime as entries are written). Keep the volume's `sizeLimit` above it.
    #[serde(default = "default_cache_max_mib")]
    pub cache_max_mib: u64,
}

impl Default for PolicySettings {
    fn default() -> Self {
        PolicySettings {
            wasm_dir: default_wasm_dir(),
            cache_dir: None,
            cache_max_mib: default_cache_max_mib(),
        }
    }
}

impl PolicySettings {
    /// The Wasm engine's configuration: the defaults, with this disk cache.
    pub fn engine_config(&self) -> neocloud_policy::wasm::EngineConfig {
        neocloud_policy::wasm::EngineConfig {
            cache_dir: self.cache_dir.clone(),
            cache_max_bytes: self.cache_max_mib.saturating_mul(1 << 20),
            ..Default::default()
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        if !self.wasm_dir.is_absolute() {
            bail!(
                "policies.wasmDir: {:?} is not an absolute path",
                self.wasm_dir
            );
        }
        if let Some(dir) = self.cache_dir.as_ref().filter(|d| !d.is_absolute()) {
            bail!("policies.cacheDir: {dir:?} is not an absolute path");
        }
        if self.cache_max_mib == 0 {
            bail!("policies.cacheMaxMib: 0 keeps nothing; unset cacheDir to turn the cache off");
        }
        Ok(())
    }
}

fn default_cache_max_mib() -> u64 {
    neocloud_policy::wasm::DEFAULT_CACHE_MAX_BYTES >> 20
}

/// `watchNamespaces`: at least one, each a namespace name (a DNS-1123 label).
fn check_namespaces(namespaces: &[String]) -> anyhow::Result<()> {
    if namespaces.is_empty() {
        bail!(
            "watchNamespaces: [] names no namespace; list at least one, or leave it unset to serve every namespace"
        );
    }
    for ns in namespaces {
        let label = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        let ok = !ns.is_empty()
            && ns.len() <= 63
            && ns.chars().all(label)
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !ok {
            bail!(
                "watchNamespaces: {ns:?} is not a namespace name (1-63 of [a-z0-9-], starting and ending alphanumeric)"
            );
        }
    }
    Ok(())
}

/// Where the image and the Helm chart put policy files.
pub const DEFAULT_WASM_DIR: &str = "/etc/neocloud-node/policies";

fn default_wasm_dir() -> PathBuf {
    PathBuf::from(DEFAULT_WASM_DIR)
}

/// Leader election over a Lease.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaderElection {
    /// Off only for a single replica you are sure of.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The Lease's namespace; default `POD_NAMESPACE`, else `default`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The Lease's name; default `neocloud-node-<node name>`.
    #[serde(default)]
    pub lease_name: Option<String>,
    /// How long a leader holds the Lease without renewing it, seconds.
    #[serde(default = "default_lease_seconds")]
    pub lease_duration_seconds: u64,
    /// How early before expiry the leader renews, seconds.
    #[serde(default = "default_grace_seconds")]
    pub renew_grace_seconds: u64,
}

impl Default for LeaderElection {
    fn default() -> Self {
        LeaderElection {
            enabled: true,
            namespace: None,
            lease_name: None,
            lease_duration_seconds: default_lease_seconds(),
            renew_grace_seconds: default_grace_seconds(),
        }
    }
}

/// Reconciler settings.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReconcilerSettings {
    /// Pods reconciled at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: u16,
    /// How often a starting instance is polled, milliseconds.
    #[serde(default = "default_poll_ms")]
    pub poll_interval_ms: u64,
    /// How often a running instance is polled, milliseconds.
    #[serde(default = "default_running_poll_ms")]
    pub running_poll_interval_ms: u64,
    /// How long a Pod with no offer waits before planning again, milliseconds.
    #[serde(default = "default_retry_ms")]
    pub retry_interval_ms: u64,
}

impl Default for ReconcilerSettings {
    fn default() -> Self {
        ReconcilerSettings {
            concurrency: default_concurrency(),
            poll_interval_ms: default_poll_ms(),
            running_poll_interval_ms: default_running_poll_ms(),
            retry_interval_ms: default_retry_ms(),
        }
    }
}

fn yes() -> bool {
    true
}
fn default_metrics_address() -> String {
    "0.0.0.0:8080".to_owned()
}
fn default_lease_seconds() -> u64 {
    15
}
fn default_grace_seconds() -> u64 {
    5
}
fn default_concurrency() -> u16 {
    16
}
fn default_poll_ms() -> u64 {
    2_000
}
fn default_running_poll_ms() -> u64 {
    30_000
}
fn default_retry_ms() -> u64 {
    30_000
}
fn default_health_seconds() -> u64 {
    30
}

impl RunConfig {
    /// Reads and checks the file.
    pub fn from_file(path: &Path) -> anyhow::Result<RunConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("failed to read the config {}", path.display()))?;
        Self::from_yaml(&text).with_context(|| format!("config {}", path.display()))
    }

    /// Parses and checks YAML.
    pub fn from_yaml(text: &str) -> anyhow::Result<RunConfig> {
        let cfg: RunConfig = serde_yaml::from_str(text)?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> anyhow::Result<()> {
        if let Some(id) = &self.cluster_id {
            ClusterId::new(id)?;
        }
        if let Some(b) = self.budget_usd_per_hour
            && !(b.is_finite() && b > 0.0)
        {
            bail!("budgetUsdPerHour: {b} is not a positive number of USD per hour");
        }
        if self.reconciler.concurrency == 0 {
            bail!("reconciler.concurrency: 0 must be at least 1");
        }
        let le = &self.leader_election;
        if le.enabled && le.renew_grace_seconds >= le.lease_duration_seconds {
            bail!(
                "leaderElection.renewGraceSeconds: {} must be less than leaseDurationSeconds ({})",
                le.renew_grace_seconds,
                le.lease_duration_seconds
            );
        }
        if self.health_interval_seconds == 0 {
            bail!("healthIntervalSeconds: 0 must be at least 1");
        }
        if self.fake.workload_seconds == Some(0) {
            bail!(
                "fake.workloadSeconds: 0 must be at least 1 (unset: workloads run until deleted)"
            );
        }
        if let Some(runner) = &self.runner {
            runner.check()?;
        }
        self.kubelet_api.check()?;
        if let Some(namespaces) = &self.watch_namespaces {
            check_namespaces(namespaces)?;
        }
        self.spend.check()?;
        neocloud_kube_target::config::validate(&self.remote_clusters, "remoteClusters")?;
        if let Some(nvke) = &self.nvke {
            nvke.validate()?;
        }
        if self.providers.contains(&ProviderId::Kube)
            && self.remote_clusters.is_empty()
            && self.nvke.is_none()
        {
            bail!("providers: kube needs at least one entry in remoteClusters, or nvke");
        }
        self.policies.check()?;
        self.provisioning.check()?;
        self.metrics_address
            .parse::<std::net::SocketAddr>()
            .with_context(|| {
                format!(
                    "metricsAddress: {:?} is not host:port",
                    self.metrics_address
                )
            })?;
        Ok(())
    }

    /// The configured cluster id, validated; `None` when it is to be derived.
    pub fn cluster(&self) -> anyhow::Result<Option<ClusterId>> {
        Ok(self.cluster_id.as_deref().map(ClusterId::new).transpose()?)
    }

    /// The enabled providers: the file's, else `GPU_BURST_PROVIDER`, else `fake`.
    pub fn provider_ids(&self, env: Option<&str>) -> anyhow::Result<Vec<ProviderId>> {
        if !self.providers.is_empty() {
            return Ok(self.providers.clone());
        }
        let Some(list) = env.filter(|s| !s.trim().is_empty()) else {
            return Ok(vec![ProviderId::Fake]);
        };
        list.split(',')
            .map(|p| {
                p.trim().parse::<ProviderId>().map_err(|_| {
                    anyhow::anyhow!(
                        "GPU_BURST_PROVIDER: {p:?} is not runpod, lambda, vast, kube or fake"
                    )
                })
            })
            .collect()
    }

    /// Poll interval as a duration.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.reconciler.poll_interval_ms.max(100))
    }

    /// Running poll interval as a duration.
    pub fn running_poll_interval(&self) -> Duration {
        Duration::from_millis(self.reconciler.running_poll_interval_ms.max(100))
    }

    /// Retry interval as a duration.
    pub fn retry_interval(&self) -> Duration {
        Duration::from_millis(self.reconciler.retry_interval_ms.max(100))
    }
}

#[cfg(test)]
mod tests;
