//! The orphan sweeper: deletes instances that carry this cluster's name prefix at a provider but
//! have no `CloudPodBinding`, once they are older than a grace period. Orphans come from a node
//! that crashed between a create and its bookkeeping, a binding deleted by hand, or a create
//! whose answer was lost and never retried.
//!
//! Not the reconciler: it never releases an instance that has a binding (even one being deleted,
//! which the reconciler is releasing), never touches Pods or bindings, and never rents.
//!
//! # Why bindings are listed before instances
//!
//! The reconciler creates a binding before it rents anything, so every instance we rent has a
//! binding for as long as it lives. A sweep takes a fresh list of every binding in every
//! namespace from the API server (a quorum read, not a cache that may lag) at time `T`, and only
//! then lists the instances. An instance whose binding was created after `T` was rented after
//! `T`, so it is younger than `T` and is missing from our list only because we looked too early.
//! Ages are therefore measured at `T`, not when the instance is seen: an instance is deleted only
//! when it was created at least `grace` before `T`. Even with a grace of zero an instance created
//! after the binding list survives (up to the clock skew between us and the provider, which a
//! real grace period covers). An instance whose provider gives no creation time is aged from when
//! this sweeper first saw it, which is always after `T`, so it survives at least one sweep. If
//! the binding list fails (or any binding cannot be read), nothing at all is deleted.
//!
//! # Why the prefix is safe across clusters
//!
//! Instances are listed by `ncn-<cluster>-`. A cluster id holds only `[a-z0-9]` (no `-`), so
//! the `-` after the id ends it: no cluster's prefix is a prefix of another cluster's names
//! (`ncn-a-` never matches `ncn-ab-...`), and two clusters sharing one cloud account never see,
//! let alone sweep, each other's instances. Instances not named by us do not start with `ncn-`.
//! The sweeper checks the prefix itself too, rather than trusting each adapter's filter.
//!
//! Registry credentials a rental made at a provider (RunPod's, named by the rental) are swept
//! the same way after the instances (see `credentials`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use kube::api::{Api, ListParams};
use neocloud_core::{InstancePhase, InstanceState, ProviderId};
use neocloud_providers::{Provider, ProviderError};
use serde::Deserialize;
use tracing::Instrument;

use crate::crd::CloudPodBinding;
use crate::naming::ClusterId;

mod credentials;

/// The shortest interval [`Sweeper::run`] sweeps at, whatever the configuration says.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Bindings fetched per list request.
const PAGE_SIZE: u32 = 500;

/// How often to sweep, how old an orphan must be, and whether to delete at all.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "RawSweeperConfig")]
pub struct SweeperConfig {
    /// Time between sweeps (`intervalSeconds`, default 300).
    pub interval: Duration,
    /// How old an orphan must be before it is deleted (`graceSeconds`, default 600).
    pub grace: Duration,
    /// Report what would be deleted and delete nothing (`dryRun`, default false).
    pub dry_run: bool,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            interval: Duration::from_secs(5 * 60),
            grace: Duration::from_secs(10 * 60),
            dry_run: false,
        }
    }
}

/// The configuration as written in the node's config file.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSweeperConfig {
    /// Seconds between sweeps; at least 1.
    #[serde(default = "default_interval_seconds")]
    interval_seconds: u64,
    /// How old, in seconds, an instance without a binding must be before it is deleted.
    #[serde(default = "default_grace_seconds")]
    grace_seconds: u64,
    /// Report what would be deleted and delete nothing.
    #[serde(default)]
    dry_run: bool,
}

fn default_interval_seconds() -> u64 {
    SweeperConfig::default().interval.as_secs()
}

fn default_grace_seconds() -> u64 {
    SweeperConfig::default().grace.as_secs()
}

/// Why a sweeper configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sweeper.intervalSeconds: {0} is not a positive number of seconds")]
pub struct BadSweeperConfig(pub u64);

impl TryFrom<RawSweeperConfig> for SweeperConfig {
    type Error = BadSweeperConfig;

    fn try_from(raw: RawSweeperConfig) -> Result<Self, Self::Error> {
        if raw.interval_seconds == 0 {
            return Err(BadSweeperConfig(raw.interval_seconds));
        }
        Ok(SweeperConfig {
            interval: Duration::from_secs(raw.interval_seconds),
            grace: Duration::from_secs(raw.grace_seconds),
            dry_run: raw.dry_run,
        })
    }
}

/// One instance the sweeper acted on or kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweptInstance {
    /// The provider holding it.
    pub provider: ProviderId,
    /// The provider's instance id.
    pub id: String,
    /// Its external name.
    pub external_name: String,
    /// Its age at the binding list, if known and not in the future.
    pub age: Option<Duration>,
}

impl SweptInstance {
    fn of(instance: &InstanceState, age: Option<Duration>) -> Self {
        SweptInstance {
            provider: instance.provider,
            id: instance.id.clone(),
            external_name: instance.external_name.clone(),
            age,
        }
    }
}

/// A provider call that failed during a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepFailure {
    /// The provider that failed.
    pub provider: ProviderId,
    /// The instance being deleted, or `None` when listing failed.
    pub instance: Option<SweptInstance>,
    /// What the provider said.
    pub error: ProviderError,
}

/// What one sweep saw and did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepReport {
    /// Distinct external names among the bindings listed when the sweep began.
    pub bindings: usize,
    /// Instances with a binding: kept.
    pub kept_bound: Vec<SweptInstance>,
    /// Orphans younger than the grace period: kept for now.
    pub kept_in_grace: Vec<SweptInstance>,
    /// Orphans deleted.
    pub deleted: Vec<SweptInstance>,
    /// Orphans a dry run would have deleted.
    pub would_delete: Vec<SweptInstance>,
    /// Stale registry credentials deleted (named by the rental that made them).
    pub credentials_deleted: Vec<SweptInstance>,
    /// Stale registry credentials a dry run would have deleted.
    pub credentials_would_delete: Vec<SweptInstance>,
    /// Provider calls that failed; the other providers were still swept.
    pub failures: Vec<SweepFailure>,
}

impl SweepReport {
    fn merge(&mut self, other: SweepReport) {
        self.kept_bound.extend(other.kept_bound);
        self.kept_in_grace.extend(other.kept_in_grace);
        self.deleted.extend(other.deleted);
        self.would_delete.extend(other.would_delete);
        self.credentials_deleted.extend(other.credentials_deleted);
        self.credentials_would_delete
            .extend(other.credentials_would_delete);
        self.failures.extend(other.failures);
    }

    fn log(&self) {
        for i in &self.deleted {
            tracing::info!(provider = %i.provider, instance = %i.id, name = %i.external_name, "deleted orphan instance");
        }
        for i in &self.would_delete {
            tracing::info!(provider = %i.provider, instance = %i.id, name = %i.external_name, "dry run: would delete orphan instance");
        }
        for c in &self.credentials_deleted {
            tracing::info!(provider = %c.provider, credential = %c.id, name = %c.external_name, "deleted stale registry credential");
        }
        for c in &self.credentials_would_delete {
            tracing::info!(provider = %c.provider, credential = %c.id, name = %c.external_name, "dry run: would delete stale registry credential");
        }
        for f in &self.failures {
            let instance = f.instance.as_ref().map(|i| i.id.as_str());
            tracing::warn!(provider = %f.provider, instance, error = %f.error, "sweep call failed");
        }
        tracing::info!(
            bindings = self.bindings,
            bound = self.kept_bound.len(),
            in_grace = self.kept_in_grace.len(),
            deleted = self.deleted.len(),
            would_delete = self.would_delete.len(),
            failures = self.failures.len(),
            "sweep finished"
        );
    }
}

/// Why a sweep did nothing at all.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The bindings could not be listed, so no instance can be judged an orphan.
    #[error("failed to list CloudPodBindings in all namespaces, so nothing was deleted: {0}")]
    ListBindings(#[source] kube::Error),
}

impl SweepError {
    /// Whether the next sweep may succeed without anyone acting (always: it lists afresh).
    pub fn is_transient(&self) -> bool {
        true
    }

    /// A short, stable metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SweepError::ListBindings(_) => "list_bindings",
        }
    }
}

/// What the sweeper decides about one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not ours (does not carry our prefix) or already terminated: left alone.
    NotOurs,
    /// A binding carries its external name: kept.
    Bound,
    /// An orphan younger than the grace period (or of unknown age): kept for now.
    InGrace,
    /// An orphan at least as old as the grace period: to be deleted.
    Orphan,
}

/// Judges one instance. `bound` holds every binding's external name as listed at `listed_at`;
/// `first_seen` is when this sweeper first saw the instance, used when the provider gives no
/// creation time. Pure: the sweep's decisions are exactly this function's.
pub fn judge(
    instance: &InstanceState,
    prefix: &str,
    bound: &HashSet<String>,
    first_seen: DateTime<Utc>,
    listed_at: DateTime<Utc>,
    grace: Duration,
) -> Verdict {
    if !instance.external_name.starts_with(prefix) || instance.phase == InstancePhase::Terminated {
        return Verdict::NotOurs;
    }
    if bound.contains(&instance.external_name) {
        return Verdict::Bound;
    }
    match age_at(instance.created_at.unwrap_or(first_seen), listed_at) {
        Some(age) if age >= grace => Verdict::Orphan,
        _ => Verdict::InGrace,
    }
}

/// How long before `listed_at` something began; `None` if it began after.
fn age_at(since: DateTime<Utc>, listed_at: DateTime<Utc>) -> Option<Duration> {
    (listed_at - since).to_std().ok()
}

/// Finds and deletes orphan instances of one cluster across providers.
pub struct Sweeper {
    bindings: Api<CloudPodBinding>,
    providers: Vec<Arc<dyn Provider>>,
    cluster: ClusterId,
    config: SweeperConfig,
    /// When each listed instance was first seen, by provider and id (the age of instances whose
    /// provider gives no creation time).
    first_seen: Mutex<HashMap<(ProviderId, String), DateTime<Utc>>>,
    /// When each listed registry credential was first seen, by provider and id.
    credentials_seen: Mutex<credentials::Seen>,
    /// Where deletions are counted, if anywhere.
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("providers", &self.providers)
            .field("cluster", &self.cluster)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Sweeper {
    /// A sweeper of `cluster`'s instances at `providers`, reading bindings with `client`.
    pub fn new(
        client: kube::Client,
        providers: Vec<Arc<dyn Provider>>,
        cluster: ClusterId,
        config: SweeperConfig,
    ) -> Self {
        Sweeper {
            bindings: Api::all(client),
            providers,
            cluster,
            config,
            first_seen: Mutex::new(HashMap::new()),
            credentials_seen: Mutex::new(HashMap::new()),
            metrics: None,
        }
    }

    /// Counts what each sweep deletes (or would delete) in `neocloud_sweeper_deletions_total`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// One sweep: lists every binding first, then each provider's instances under our prefix,
    /// and deletes (or, in a dry run, reports) the orphans older than the grace period. A
    /// provider that fails is reported and the others are still swept; if the bindings cannot
    /// be listed, nothing is deleted and the error is returned.
    pub async fn sweep_once(&self) -> Result<SweepReport, SweepError> {
        let listed_at = Utc::now();
        let bound = self.bound_names().await?;
        let prefix = self.cluster.prefix();
        let sweeps = self.providers.iter().map(|p| {
            let span = tracing::info_span!("sweep provider", provider = %p.id());
            self.sweep_provider(p.as_ref(), &prefix, &bound, listed_at)
                .instrument(span)
        });
        let mut report = SweepReport {
            bindings: bound.len(),
            ..SweepReport::default()
        };
        for part in join_all(sweeps).await {
            report.merge(part);
        }
        Ok(report)
    }

    /// Waits for `synced`, then sweeps every interval (at least [`MIN_INTERVAL`]) until the
    /// returned future is dropped, logging each report.
    pub async fn run(self, synced: impl Future<Output = ()>) {
        synced.await;
        let period = self.config.interval.max(MIN_INTERVAL);
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let span = tracing::info_span!("sweep", cluster = %self.cluster, dry_run = self.config.dry_run);
            match self.sweep_once().instrument(span.clone()).await {
                Ok(report) => {
                    span.in_scope(|| report.log());
                    if let Some(m) = &self.metrics {
                        for i in &report.deleted {
                            m.record_sweeper_deletion(i.provider, false);
                        }
                        for i in &report.would_delete {
                            m.record_sweeper_deletion(i.provider, true);
                        }
                    }
                }
                Err(error) => {
                    span.in_scope(
                        || tracing::warn!(%error, label = error.metric_label(), "sweep failed"),
                    );
                }
            }
        }
    }

    /// Every binding's external name, from a fresh, paged list of all namespaces.
    async fn bound_names(&self) -> Result<HashSet<String>, SweepError> {
        let mut names = HashSet::new();
        let mut params = ListParams::default().limit(PAGE_SIZE);
        loop {
            let page = self
                .bindings
                .list(&params)
                .await
                .map_err(SweepError::ListBindings)?;
            names.extend(page.items.into_iter().map(|b| b.spec.external_name));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(names),
            }
        }
    }

    async fn sweep_provider(
        &self,
        provider: &dyn Provider,
        prefix: &str,
        bound: &HashSet<String>,
        listed_at: DateTime<Utc>,
    ) -> SweepReport {
        let mut report = SweepReport::default();
        let instances = match provider.list_ours(prefix).await {
            Ok(instances) => instances,
            Err(error) => {
                report.failures.push(SweepFailure {
                    provider: provider.id(),
                    instance: None,
                    error,
                });
                return report;
            }
        };
        let first_seen = self.first_seen_of(provider.id(), &instances);
        for (instance, seen) in instances.iter().zip(first_seen) {
            let verdict = judge(instance, prefix, bound, seen, listed_at, self.config.grace);
            let age = age_at(instance.created_at.unwrap_or(seen), listed_at);
            let entry = SweptInstance::of(instance, age);
            match verdict {
                Verdict::NotOurs => {}
                Verdict::Bound => report.kept_bound.push(entry),
                Verdict::InGrace => report.kept_in_grace.push(entry),
                Verdict::Orphan if self.config.dry_run => report.would_delete.push(entry),
                Verdict::Orphan => self.delete(provider, entry, &mut report).await,
            }
        }
        let live = instances.into_iter().map(|i| i.external_name).collect();
        let cx = credentials::Context {
            prefix,
            bound,
            live,
            listed_at,
            grace: self.config.grace,
            dry_run: self.config.dry_run,
        };
        credentials::sweep(provider, &cx, &self.credentials_seen, &mut report).await;
        report
    }

    async fn delete(
        &self,
        provider: &dyn Provider,
        entry: SweptInstance,
        report: &mut SweepReport,
    ) {
        match provider.delete(&entry.id).await {
            Ok(()) => report.deleted.push(entry),
            Err(error) => report.failures.push(SweepFailure {
                provider: entry.provider,
                instance: Some(entry),
                error,
            }),
        }
    }

    /// When each of `instances` was first seen; see [`remember`].
    fn first_seen_of(
        &self,
        provider: ProviderId,
        instances: &[InstanceState],
    ) -> Vec<DateTime<Utc>> {
        let mut seen = self
            .first_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        remember(&mut seen, provider, instances, Utc::now())
    }
}

/// When each of `instances` was first seen (`now` for new ones), remembering new ones and
/// forgetting `provider`'s instances that are no longer listed.
fn remember(
    seen: &mut HashMap<(ProviderId, String), DateTime<Utc>>,
    provider: ProviderId,
    instances: &[InstanceState],
    now: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let listed: HashSet<&str> = instances.iter().map(|i| i.id.as_str()).collect();
    seen.retain(|(p, id), _| *p != provider || listed.contains(id.as_str()));
    instances
        .iter()
        .map(|i| *seen.entry((provider, i.id.clone())).or_insert(now))
        .collect()
}

#[cfg(test)]
mod tests;
