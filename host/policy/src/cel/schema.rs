//! The input views CEL expressions are written against (`workload`, `offer`, `attempts`), and
//! the static schema used to check field names and infer types when an expression loads.
//!
//! These are flat views built by the caller from its domain types; this module does not know
//! the domain types and does not convert them.

use std::collections::BTreeMap;

/// The workload as CEL sees it: the variable `workload`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CelWorkload {
    /// GPUs per instance.
    pub gpu_count: i64,
    /// Acceptable GPU models; empty means any.
    pub gpu_models: Vec<String>,
    /// Maximum USD per hour for the instance; 0.0 when the Pod set none.
    pub max_price: f64,
    /// `on-demand`, `spot` or `any`.
    pub capacity_type: String,
    /// Acceptable regions; empty means any.
    pub regions: Vec<String>,
    /// The container image.
    pub image: String,
    /// The Pod's annotations.
    pub annotations: BTreeMap<String, String>,
}

/// The GPU of an offer: the value of `offer.gpu`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CelGpu {
    /// Normalised model name, such as `H100` or `A100-80GB`.
    pub model: String,
    /// Memory of one GPU in GiB.
    pub memory_gib: i64,
}

/// One offer as CEL sees it: the variable `offer`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CelOffer {
    /// `runpod`, `lambda`, `vast`, `kube` or `fake`.
    pub provider: String,
    /// The provider's offer id.
    pub id: String,
    pub gpu: CelGpu,
    /// GPUs in the instance.
    pub gpu_count: i64,
    /// USD per hour for the instance.
    pub price_per_hour: f64,
    pub spot: bool,
    pub region: String,
    /// 0.0 to 1.0; 1.0 when unknown.
    pub reliability: f64,
    /// Whether the provider marks the host as verified; true where it has no such notion.
    pub verified: bool,
    pub disk_gib: i64,
}

/// One past rental attempt: an element of the list `attempts`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CelAttempt {
    pub provider: String,
    pub offer_id: String,
    /// `capacity`, `quota`, `auth`, `rate-limited`, `invalid-request`, `transient`,
    /// `price-exceeded`, `timeout`, `preempted` or `lost`.
    pub failure_class: String,
    pub message: String,
}

/// Everything one evaluation sees.
#[derive(Clone, Copy, Debug)]
pub struct CelInput<'a> {
    pub workload: &'a CelWorkload,
    pub offer: &'a CelOffer,
    pub attempts: &'a [CelAttempt],
}

/// The static type of a value, as far as the load-time checker knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Bool,
    Int,
    Double,
    String,
    ListString,
    MapString,
    Workload,
    Offer,
    Gpu,
    Attempt,
    ListAttempt,
    /// Not known before evaluation.
    Dyn,
}

impl Ty {
    /// The CEL name of the type, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Double => "double",
            Ty::String => "string",
            Ty::ListString => "list(string)",
            Ty::MapString => "map(string, string)",
            Ty::Workload => "workload",
            Ty::Offer => "offer",
            Ty::Gpu => "gpu",
            Ty::Attempt => "attempt",
            Ty::ListAttempt => "list(attempt)",
            Ty::Dyn => "dyn",
        }
    }

    /// Whether the type is numeric, as a rank must be.
    pub fn is_number(self) -> bool {
        matches!(self, Ty::Int | Ty::Double)
    }
}

/// The declared variables and their types.
pub const VARIABLES: [(&str, Ty); 3] = [
    ("workload", Ty::Workload),
    ("offer", Ty::Offer),
    ("attempts", Ty::ListAttempt),
];

/// The type of a declared variable, if `name` is one.
pub fn variable_type(name: &str) -> Option<Ty> {
    VARIABLES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The type of `field` on a value of type `on`: `Some(None)` when `on` has no fixed fields
/// (maps, dyn), `None` when `on` is a record without that field.
pub fn field_type(on: Ty, field: &str) -> Option<Option<Ty>> {
    let fields: &[(&str, Ty)] = match on {
        Ty::Workload => &WORKLOAD_FIELDS,
        Ty::Offer => &OFFER_FIELDS,
        Ty::Gpu => &GPU_FIELDS,
        Ty::Attempt => &ATTEMPT_FIELDS,
        Ty::MapString => return Some(Some(Ty::String)),
        Ty::Dyn => return Some(None),
        _ => return None,
    };
    fields
        .iter()
        .find(|(n, _)| *n == field)
        .map(|(_, t)| Some(*t))
}

/// Field names of a record type, for "did you mean" style messages.
pub fn field_names(on: Ty) -> Vec<&'static str> {
    let fields: &[(&str, Ty)] = match on {
        Ty::Workload => &WORKLOAD_FIELDS,
        Ty::Offer => &OFFER_FIELDS,
        Ty::Gpu => &GPU_FIELDS,
        Ty::Attempt => &ATTEMPT_FIELDS,
        _ => &[],
    };
    fields.iter().map(|(n, _)| *n).collect()
}

const WORKLOAD_FIELDS: [(&str, Ty); 7] = [
    ("gpu_count", Ty::Int),
    ("gpu_models", Ty::ListString),
    ("max_price", Ty::Double),
    ("capacity_type", Ty::String),
    ("regions", Ty::ListString),
    ("image", Ty::String),
    ("annotations", Ty::MapString),
];

const OFFER_FIELDS: [(&str, Ty); 10] = [
    ("provider", Ty::String),
    ("id", Ty::String),
    ("gpu", Ty::Gpu),
    ("gpu_count", Ty::Int),
    ("price_per_hour", Ty::Double),
    ("spot", Ty::Bool),
    ("region", Ty::String),
    ("reliability", Ty::Double),
    ("verified", Ty::Bool),
    ("disk_gib", Ty::Int),
];

const GPU_FIELDS: [(&str, Ty); 2] = [("model", Ty::String), ("memory_gib", Ty::Int)];

const ATTEMPT_FIELDS: [(&str, Ty); 4] = [
    ("provider", Ty::String),
    ("offer_id", Ty::String),
    ("failure_class", Ty::String),
    ("message", Ty::String),
];
