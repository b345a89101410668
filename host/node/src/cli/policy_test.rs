//! `neocloud-node policy test FILE FIXTURES`: runs a Wasm policy against a YAML file of cases and
//! their expected decisions, and prints a pass/fail table; any failure makes the command fail.
//! Also the fallback half of `policy eval` (its input and output as JSON).
//!
//! A fixtures file:
//!
//! ```yaml
//! tests:
//!   - name: a refused key skips the provider     # shown in the table
//!     workload: {gpu_count: 1}                    # as `policy eval --workload` (optional)
//!     fallback:                                   # a fallback decision after these attempts
//!       attempts: [{provider: vast, offer_id: o1, failure: auth}]
//!       remaining_offers: 2
//!     expect: {skip-provider: vast}
//!   - name: the cheaper of two equal offers first
//!     offers: [...]                               # as `policy eval --offers`
//!     expect: {order: [1, 0]}                     # placement: offers best first, excluded left out
//!   - name: a price over the maximum is refused
//!     workload: {max_price_per_hour: 2.0}
//!     offers: [...]
//!     expect: {pricing: [accept, reject]}         # pricing: one answer per offer
//! ```
//!
//! A fallback case expects one of `retry-same: MS`, `next-offer`, `skip-provider: NAME`,
//! `wait: MS` or `give-up: TEXT` (the reason contains TEXT); any case may expect
//! `error: TEXT` (the decision fails with an error whose message contains TEXT).
//!
//! Not for CEL policies, nor the node's own fallback ladder (the broker's tests cover that).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use neocloud_core::FailureClass;
use neocloud_policy::wasm::bindings::{Attempt, FallbackAction, FallbackInput};
use neocloud_policy::wasm::{Evaluation, Role, Verdict, WasmPolicy};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cli::policy::{
    OfferJson, WorkloadJson, load, placement_input, price_each, price_json, require,
};
use neocloud_node::policies::wit::{
    failure_class, gpu_model_named, placement_scores, provider_from_wit, provider_named,
};

/// The attempts file of `policy eval --attempts`, and a case's `fallback`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FallbackJson {
    /// Oldest first; the last is the failure being handled.
    attempts: Vec<AttemptJson>,
    /// Offers still untried.
    #[serde(default)]
    remaining_offers: u32,
    /// Milliseconds since the workload was first planned.
    #[serde(default)]
    elapsed_ms: u64,
}

/// One failed attempt.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AttemptJson {
    provider: String,
    #[serde(default)]
    offer_id: String,
    #[serde(default)]
    gpu_model: String,
    #[serde(default)]
    price_per_hour: f64,
    #[serde(default)]
    region: String,
    /// `capacity`, `quota`, `auth`, `rate-limited`, `invalid-request`, `transient`,
    /// `price-exceeded`, `timeout`, `preempted`, `lost`.
    failure: FailureClass,
    #[serde(default)]
    message: String,
    #[serde(default)]
    age_ms: u64,
}

/// The fallback input for `workload` after `f`'s attempts.
pub(crate) fn fallback_input(
    workload: &WorkloadJson,
    f: &FallbackJson,
) -> anyhow::Result<FallbackInput> {
    let attempts = f
        .attempts
        .iter()
        .map(|a| Attempt {
            provider: provider_named(&a.provider),
            offer_id: a.offer_id.clone(),
            gpu_model: gpu_model_named(&a.gpu_model),
            price_per_hour: a.price_per_hour,
            region: a.region.clone(),
            failure: failure_class(a.failure),
            message: a.message.clone(),
            age_ms: a.age_ms,
        })
        .collect();
    Ok(FallbackInput {
        workload: placement_input(workload, &[])?.workload,
        attempts,
        remaining_offers: f.remaining_offers,
        elapsed_ms: f.elapsed_ms,
    })
}

/// What `policy bench` asks a fallback policy: a Pod whose first two attempts found no capacity
/// and whose third was rate limited, with offers left.
pub(crate) fn synthetic_fallback() -> anyhow::Result<FallbackInput> {
    let attempt = |provider: &str, offer_id: &str, failure| AttemptJson {
        provider: provider.into(),
        offer_id: offer_id.into(),
        gpu_model: "H100".into(),
        price_per_hour: 2.49,
        region: "us-east-1".into(),
        failure,
        message: String::new(),
        age_ms: 1000,
    };
    let f = FallbackJson {
        attempts: vec![
            attempt("runpod", "r1", FailureClass::Capacity),
            attempt("vast", "v1", FailureClass::Capacity),
            attempt("lambda", "gpu_1x_h100", FailureClass::RateLimited),
        ],
        remaining_offers: 5,
        elapsed_ms: 4000,
    };
    fallback_input(&WorkloadJson::default(), &f)
}

/// A fallback action as `policy eval` prints it (and fixtures name it).
pub(crate) fn action_json(action: &FallbackAction) -> Value {
    match action {
        FallbackAction::RetrySame(ms) => json!({ "retry-same": ms }),
        FallbackAction::NextOffer => json!("next-offer"),
        FallbackAction::SkipProvider(p) => json!({ "skip-provider": provider_name(*p) }),
        FallbackAction::Wait(ms) => json!({ "wait": ms }),
        FallbackAction::GiveUp(reason) => json!({ "give-up": reason }),
    }
}

/// A WIT provider by the name fixtures use (`other` for one the node does not run).
fn provider_name(p: neocloud_policy::wasm::bindings::Provider) -> &'static str {
    provider_from_wit(p).map_or("other", |id| id.as_str())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fixtures {
    tests: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    workload: WorkloadJson,
    #[serde(default)]
    offers: Vec<OfferJson>,
    #[serde(default)]
    fallback: Option<FallbackJson>,
    expect: Expect,
}

/// What a case expects.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
enum Expect {
    Order(Vec<u32>),
    Pricing(Vec<PriceExpect>),
    RetrySame(u32),
    NextOffer,
    SkipProvider(String),
    Wait(u32),
    GiveUp(String),
    Error(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum PriceExpect {
    Accept,
    Reject,
}

/// Runs every case of `fixtures` against `file`: the table, or an error holding it when a case
/// failed.
pub fn run(
    cache: &crate::cli::policy::CacheArgs,
    file: &Path,
    fixtures: &Path,
) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(fixtures)
        .with_context(|| format!("failed to read {}", fixtures.display()))?;
    // Through JSON values, so an expectation is written `{skip-provider: vast}` or
    // `next-offer` rather than with YAML tags; errors name the path of the bad field.
    let parse = || -> anyhow::Result<Fixtures> {
        let value: Value = serde_yaml::from_str(&text)?;
        serde_path_to_error::deserialize(value)
            .map_err(|e| anyhow::anyhow!("{}: {}", e.path(), e.inner()))
    };
    let fixtures = parse().with_context(|| format!("failed to parse {}", fixtures.display()))?;
    if fixtures.tests.is_empty() {
        bail!("{}: tests: [] has no case", file.display());
    }
    let policy = load(cache, file)?;
    let mut table = String::new();
    let mut failed = 0;
    for case in &fixtures.tests {
        let (got, passed) = match decide(&policy, file, case) {
            Ok(got) => {
                let passed = matches(&case.expect, &got);
                (got.to_string(), passed)
            }
            Err(e) => (format!("{e:#}"), false),
        };
        failed += usize::from(!passed);
        let verdict = if passed { "PASS" } else { "FAIL" };
        let _ = writeln!(table, "{verdict}  {}", case.name);
        if !passed {
            let want = serde_json::to_string(&expect_json(&case.expect)).unwrap_or_default();
            let _ = writeln!(table, "      expected {want}\n      got      {got}");
        }
    }
    let total = fixtures.tests.len();
    let _ = write!(table, "{} passed, {failed} failed", total - failed);
    if failed > 0 {
        bail!("{table}");
    }
    Ok(format!("{table}\n"))
}

/// The decision a case asks for, as JSON: `{"decision": ...}` or `{"error": ...}`.
fn decide(policy: &WasmPolicy, file: &Path, case: &Case) -> anyhow::Result<Value> {
    if let Some(f) = &case.fallback {
        require(policy, file, Role::Fallback)?;
        let input = fallback_input(&case.workload, f)?;
        return Ok(answer(&policy.next(&input), action_json));
    }
    let input = placement_input(&case.workload, &case.offers)?;
    if matches!(case.expect, Expect::Pricing(_)) {
        require(policy, file, Role::Pricing)?;
        let priced = price_each(policy, &input, &case.offers);
        let answers: Vec<Value> = priced.iter().map(|e| answer(e, price_json)).collect();
        return Ok(json!({ "pricing": answers }));
    }
    require(policy, file, Role::Placement)?;
    let n = input.offers.len();
    Ok(answer(&policy.place(&input), |d| {
        let (scores, excluded) = placement_scores(d, n);
        let mut order: Vec<usize> = (0..n).filter(|i| !excluded[*i]).collect();
        order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
        json!({ "order": order })
    }))
}

fn answer<T>(evaluation: &Evaluation<T>, show: impl Fn(&T) -> Value) -> Value {
    match &evaluation.verdict {
        Verdict::Apply(decision) => json!({ "decision": show(decision) }),
        other => json!({ "error": other.error().map(|e| e.to_string()).unwrap_or_default() }),
    }
}

/// Whether `got` (from [`decide`]) is what `expect` says.
fn matches(expect: &Expect, got: &Value) -> bool {
    let decision = &got["decision"];
    match expect {
        Expect::Error(text) => got["error"].as_str().is_some_and(|e| e.contains(text)),
        Expect::GiveUp(text) => decision["give-up"]
            .as_str()
            .is_some_and(|reason| reason.contains(text)),
        Expect::Pricing(want) => {
            let got: Vec<Option<PriceExpect>> = got["pricing"]
                .as_array()
                .map(|answers| answers.iter().map(price_of).collect())
                .unwrap_or_default();
            got == want.iter().copied().map(Some).collect::<Vec<_>>()
        }
        other => *decision == expect_json(other),
    }
}

fn price_of(answer: &Value) -> Option<PriceExpect> {
    let decision = &answer["decision"];
    if decision.get("accept").is_some() {
        Some(PriceExpect::Accept)
    } else if decision.get("reject").is_some() {
        Some(PriceExpect::Reject)
    } else {
        None
    }
}

/// An expectation as the decision JSON it stands for.
fn expect_json(expect: &Expect) -> Value {
    match expect {
        Expect::Order(order) => json!({ "order": order }),
        Expect::Pricing(want) => json!({ "pricing": want
            .iter()
            .map(|p| if *p == PriceExpect::Accept { "accept" } else { "reject" })
            .collect::<Vec<_>>() }),
        Expect::RetrySame(ms) => json!({ "retry-same": ms }),
        Expect::NextOffer => json!("next-offer"),
        Expect::SkipProvider(p) => json!({ "skip-provider": p }),
        Expect::Wait(ms) => json!({ "wait": ms }),
        Expect::GiveUp(text) => json!({ "give-up": format!("…{text}…") }),
        Expect::Error(text) => json!({ "error": format!("…{text}…") }),
    }
}
