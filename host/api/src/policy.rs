//! `BurstPolicy`: a cluster-scoped placement, fallback and pricing policy, either a Wasm
//! component (a file, a ConfigMap key, an HTTPS URL pinned by sha256, or an OCI artifact pinned
//! by digest, optionally with a required signature) or CEL rules. The API server itself refuses
//! a policy that names both or neither, a URL without a digest or an OCI tag alone; the node
//! reports in the status whether the policy loaded, its digest and every load or compile error.

// kube-derive repeats keys such as `type_` across `printcolumn(...)` entries; clippy takes
// them for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the policy is and how it behaves when it fails.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cloud.aibrix.ai",
    version = "v1alpha1",
    kind = "BurstPolicy",
    status = "BurstPolicyStatus",
    shortname = "bp",
    category = "neocloud",
    printcolumn(name = "Loaded", type_ = "boolean", json_path = ".status.loaded"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(
        name = "Digest",
        type_ = "string",
        json_path = ".status.digest",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("has(self.wasm) != has(self.cel)")
    .message("exactly one of spec.wasm and spec.cel must be set"))]
#[serde(rename_all = "camelCase")]
pub struct BurstPolicySpec {
    /// A Wasm component implementing one or more `neocloud:policy` worlds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasm: Option<WasmSource>,
    /// CEL rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<CelRules>,
    /// What happens when the policy fails (traps, times out, returns nonsense): `Fail` stops the
    /// decision and the Pod says why; `Ignore` falls back to the built-in defaults.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// `Enforce` decides; `Audit` evaluates and reports, and the built-in defaults decide.
    #[serde(default)]
    pub mode: PolicyMode,
    /// How many times a Pod under this policy may be rented again on a new machine (its
    /// machine lost, reclaimed, or ended with no runner to restart the container in place)
    /// before it fails: 0 to 100; the node's default (5) when unset. Restarts in place on the
    /// same machine do not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self <= 100")
        .message("spec.maxReplacements must be at most 100"))]
    pub max_replacements: Option<u32>,
    /// Which in-cluster destinations Pods may name in `cloud.aibrix.ai/egress`: Pods in the
    /// namespaces listed here (whatever policy they choose) may name only destinations that
    /// match one of `allowed`. Unset: this policy limits no one's egress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressRules>,
}

/// The egress destinations Pods of some namespaces may name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EgressRules {
    /// The Pod namespaces these rules govern; `*` governs every namespace.
    pub namespaces: Vec<String>,
    /// Patterns `service.namespace:port`; each of the three parts may be `*` (any). A
    /// destination no pattern matches refuses the Pod that names it. Empty: no egress at all.
    #[serde(default)]
    pub allowed: Vec<String>,
}

/// Where a Wasm component comes from: exactly one of path, configMap, url, oci.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new(
    "[has(self.path), has(self.configMap), has(self.url), has(self.oci)].filter(x, x).size() == 1"
).message("exactly one of path, configMap, url and oci must be set"))]
#[x_kube(validation = Rule::new("!has(self.url) || has(self.sha256)")
    .message("a url must be pinned with sha256"))]
#[x_kube(validation = Rule::new("has(self.oci) || !(has(self.pullSecret) || has(self.registryCa) || has(self.requireSignature))")
    .message("pullSecret, registryCa and requireSignature apply only to an oci source"))]
#[serde(rename_all = "camelCase")]
pub struct WasmSource {
    /// A file on the node's filesystem (for example a mounted volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A key of a ConfigMap holding the component's bytes (`binaryData`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKeyRef>,
    /// An HTTP(S) URL; requires `sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// An OCI artifact pushed by `neocloud-node policy push`:
    /// `<registry>/<repository>@sha256:<manifest digest>`. A tag alone is refused: a tag can
    /// be moved to other bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[^@]+/[^@]+@sha256:[0-9a-f]{64}$')")
        .message("oci must be <registry>/<repository>@sha256:<64 hex digits>: a tag alone is refused"))]
    pub oci: Option<String>,
    /// A `kubernetes.io/dockerconfigjson` Secret with credentials for the OCI registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<SecretRef>,
    /// A ConfigMap key holding the PEM CA certificate(s) the OCI registry's TLS certificate
    /// chains to, when it is not publicly trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_ca: Option<ConfigMapKeyRef>,
    /// Load the OCI artifact only if it carries a cosign signature by one of these keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_signature: Option<SignatureRequirement>,
    /// The component's expected sha256, hex; loading refuses any other bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')")
        .message("sha256 must be 64 lower-case hex digits"))]
    pub sha256: Option<String>,
}

/// A Secret by namespace and name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
}

/// Who must have signed an OCI artifact.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SignatureRequirement {
    /// PEM ECDSA P-256 public keys (`-----BEGIN PUBLIC KEY-----`, as `cosign generate-key-pair`
    /// or `neocloud-node policy keygen` write them); a signature by any one is enough.
    #[x_kube(validation = Rule::new("self.size() > 0")
        .message("requireSignature.publicKeys must list at least one key"))]
    pub public_keys: Vec<String>,
}

/// A key in a ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
    /// The key under `binaryData` (or `data`).
    pub key: String,
}

/// CEL rules over `workload`, `offer` and `attempts`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CelRules {
    /// A boolean expression every chosen offer must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<String>,
    /// A numeric expression; higher ranks first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<String>,
}

/// What a failing policy means for the decision.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// The decision fails and the Pod says why.
    #[default]
    Fail,
    /// The built-in defaults decide instead.
    Ignore,
}

/// Whether the policy decides.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PolicyMode {
    /// The policy decides.
    #[default]
    Enforce,
    /// The policy is evaluated and reported; the defaults decide.
    Audit,
}

/// Whether the policy loaded, and if not, why.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BurstPolicyStatus {
    /// True once the policy compiled and passed validation.
    #[serde(default)]
    pub loaded: bool,
    /// `sha256:<hex>` of what was loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Every compile or load error, with its position.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<PolicyError>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One error found while loading a policy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyError {
    /// The field that holds the faulty source, such as `spec.cel.rank`.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// 1-based line in the source, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// 1-based column in the source, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}
