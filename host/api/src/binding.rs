//! `CloudPodBinding`: one Pod's rental, written before every provider call so that a restarted
//! node knows what it was doing. The spec is the intent (fixed when the binding is created); the
//! status is what happened (phase, the instance, every attempt, cost).

// kube-derive repeats keys such as `type_` across `printcolumn(...)` entries; clippy takes
// them for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The intent: which Pod, under which external name, within which constraints.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cloud.aibrix.ai",
    version = "v1alpha1",
    kind = "CloudPodBinding",
    namespaced,
    status = "CloudPodBindingStatus",
    shortname = "cpb",
    category = "neocloud",
    printcolumn(name = "Provider", type_ = "string", json_path = ".status.provider"),
    printcolumn(name = "Instance", type_ = "string", json_path = ".status.instanceId"),
    printcolumn(name = "GPU", type_ = "string", json_path = ".status.gpu"),
    printcolumn(
        name = "USD/hour",
        type_ = "number",
        json_path = ".status.pricePerHour"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CloudPodBindingSpec {
    /// The Pod's name (the binding has the same name and namespace).
    pub pod_name: String,
    /// The Pod's UID: a binding never outlives, nor serves, another Pod of the same name.
    pub pod_uid: String,
    /// The deterministic name every rental of this Pod carries at the provider, derived from the
    /// cluster identity and the Pod UID: the idempotency key for creates and the sweeper.
    pub external_name: String,
    /// The cluster identity that prefixes external names.
    pub cluster_id: String,
    /// The constraints the Pod asked for, as parsed from its spec and annotations.
    pub workload: WorkloadSummary,
    /// The policy that decides for this Pod, if not the built-in defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRef>,
}

/// What the Pod asked for, in provider-neutral terms.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSummary {
    /// The container image.
    pub image: String,
    /// GPUs per instance.
    pub gpu_count: u32,
    /// Acceptable canonical GPU models; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    /// The most the Pod may cost, USD per hour for the whole instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price_per_hour: Option<f64>,
    /// `on-demand`, `spot` or `any`.
    pub capacity_type: String,
    /// Allowed providers in preference order; empty means every enabled provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<String>,
    /// Allowed regions; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
}

/// A `BurstPolicy` by name, with the digest that was in force when the binding was created.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRef {
    /// The `BurstPolicy` name.
    pub name: String,
    /// `sha256:<hex>` of the Wasm component or of the CEL rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// Where a binding is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BindingPhase {
    /// Created, nothing decided yet.
    #[default]
    Pending,
    /// Choosing an offer.
    Planning,
    /// A rental is in flight or the instance is starting.
    Provisioning,
    /// The instance runs the workload.
    Running,
    /// The workload finished successfully; the instance is released.
    Succeeded,
    /// The workload failed, or the ladder gave up.
    Failed,
    /// The Pod is being deleted; the instance is being released.
    Releasing,
    /// The provider confirmed the instance gone.
    Released,
}

/// What happened, most recent last.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudPodBindingStatus {
    /// The current phase.
    #[serde(default)]
    pub phase: BindingPhase,
    /// A CamelCase reason for the phase (NoOffer, OverBudget, Unsupported, Capacity...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The provider of the current instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The provider's id of the current instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The offer the current instance was rented from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer_id: Option<String>,
    /// GPUs of the current instance, such as `1x A40`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// USD per hour of the current instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_hour: Option<f64>,
    /// USD accrued by every instance of this binding so far.
    #[serde(default)]
    pub cost_accrued_usd: f64,
    /// While `Releasing`: the phase the binding ends in once its instances are confirmed gone
    /// (`Released`, `Failed` or `Succeeded`). The decision to end is written before anything is
    /// deleted, so a release interrupted by an error or a restart finishes the same way instead
    /// of placing the Pod again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ending: Option<BindingPhase>,
    /// The workload's exit code, when a VM runner reported that it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The W3C `traceparent` of the placement's trace, when traces are exported: find the
    /// trace by its id (the second field) in the tracing backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The latest rental attempts, oldest first (at most the last 20; older ones are counted in
    /// `attemptTally`); an attempt is written before its provider call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptRecord>,
    /// Attempts no longer listed in `attempts`, counted per provider, outcome and failure class
    /// with the first and last time of each: the history stays bounded however long a Pod waits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_tally: Vec<AttemptTally>,
    /// Standard conditions (Ready, Released...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The rental whose runner the node believes: each placement that boots a runner takes the
    /// next number, written before the instance is rented, and the runner callback refuses a
    /// runner of any other (a replaced or lost machine that comes back). Absent before the
    /// first runner, and in bindings from before rentals were numbered (their runners are
    /// rental 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_rental: Option<u64>,
}

impl CloudPodBindingStatus {
    /// When the current instance was rented: the last created attempt's answer (to the second).
    pub fn rented_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.attempts
            .iter()
            .rev()
            .find(|a| a.outcome == AttemptOutcome::Created)
            .map(|a| a.finished_at.as_deref().unwrap_or(&a.started_at))
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
    }

    /// Whether an instance is held (provisioning or running).
    pub fn holds_instance(&self) -> bool {
        matches!(
            self.phase,
            BindingPhase::Running | BindingPhase::Provisioning
        ) && self.instance_id.is_some()
    }

    /// What the binding has cost at `now`, USD: its ended instances' accrual, and while it holds
    /// an instance, that instance's price since it was rented.
    pub fn cost_usd_at(&self, now: chrono::DateTime<chrono::Utc>) -> f64 {
        let mut usd = self.cost_accrued_usd;
        if self.holds_instance()
            && let Some(price) = self.price_per_hour
            && let Some(since) = self.rented_at()
        {
            let ms = (now - since).num_milliseconds().max(0) as f64;
            usd += price * ms / 3_600_000.0;
        }
        usd
    }
}

/// The GPU model of a binding's `gpu` (`1x A40` -> `A40`); a value without a count as is.
pub fn gpu_model(gpu: &str) -> &str {
    gpu.split_once("x ")
        .filter(|(count, _)| count.chars().all(|c| c.is_ascii_digit()))
        .map_or(gpu, |(_, model)| model)
}

/// One rental attempt.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// 1 for the first attempt.
    pub number: u32,
    /// The provider asked.
    pub provider: String,
    /// The offer rented.
    pub offer_id: String,
    /// USD per hour of the offer when it was checked just before renting.
    pub price_per_hour: f64,
    /// RFC 3339 time the attempt was written, before the provider call.
    pub started_at: String,
    /// RFC 3339 time the outcome was known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// What came of it.
    pub outcome: AttemptOutcome,
    /// The failure class, for failed attempts (capacity, quota, auth, rate-limited...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
    /// The provider's message, for failed attempts (never a credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What was decided after this attempt failed: `retry-same-offer`, `next-offer`,
    /// `skip-provider`, `wait` or `give-up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Who decided: the `BurstPolicy` name, `default` for the built-in fallback, or `node` when
    /// the node moved on by itself (an offer taken by another renter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// The decision in a sentence, with what followed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    /// The requests the provider's adapter sent again within this attempt (429s, 5xx, timeouts),
    /// none when every request was answered at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried: Option<RetriedRequests>,
}

/// The requests an adapter sent again within one attempt.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetriedRequests {
    /// How many requests were sent again.
    pub count: u32,
    /// What each retried request was answered: an HTTP status (`429`, `503`) or a transport
    /// failure (`timeout`, `connect`, `transport`).
    pub causes: Vec<String>,
    /// The waits the provider asked for in `Retry-After`, in seconds, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked_seconds: Vec<f64>,
    /// The waits taken before each request was sent again, in seconds, in order.
    pub waited_seconds: Vec<f64>,
}

/// Attempts folded out of the list, one entry per provider, outcome and failure class.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptTally {
    /// The provider asked.
    pub provider: String,
    /// What came of them.
    pub outcome: AttemptOutcome,
    /// The failure class, for failed attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
    /// How many.
    pub count: u32,
    /// RFC 3339 start of the first.
    pub first_at: String,
    /// RFC 3339 start of the last.
    pub last_at: String,
    /// The message of the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_message: Option<String>,
}

/// The outcome of an attempt.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AttemptOutcome {
    /// The provider call has not answered yet (or the node died during it).
    InFlight,
    /// An instance was created (or found by its external name).
    Created,
    /// The provider refused or failed; see the failure class.
    Failed,
}
