//! Errors of the Wasm engine: loading a policy, and running one decision.
//!
//! Not for CEL errors (see `crate::cel`). A guest's own `policy-error` is a value here
//! ([`WasmError::Guest`]), a trap is classified by type into a [`TrapKind`].

use super::bindings::ErrorCode;

/// Why a guest was stopped by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrapKind {
    /// The epoch deadline passed.
    Timeout,
    /// Linear memory or a table tried to grow past the policy's budget.
    OutOfMemory,
    /// The Wasm stack limit was reached.
    StackOverflow,
    /// The fuel budget was used up.
    OutOfFuel,
    /// Any other trap (unreachable, out-of-bounds access, ...), with wasmtime's description.
    Other(String),
}

impl TrapKind {
    /// Short, stable label for metrics and events.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::OutOfMemory => "out-of-memory",
            Self::StackOverflow => "stack-overflow",
            Self::OutOfFuel => "out-of-fuel",
            Self::Other(_) => "trap",
        }
    }
}

impl std::fmt::Display for TrapKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Other(what) => write!(f, "trap: {what}"),
            other => f.write_str(other.label()),
        }
    }
}

/// A role a policy can implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Placement,
    Fallback,
    Pricing,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Placement => "placement",
            Self::Fallback => "fallback",
            Self::Pricing => "pricing",
        })
    }
}

/// Everything that can go wrong loading or running a Wasm policy.
#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    #[error("failed to configure the wasm engine: {0}")]
    Engine(String),
    /// The I/O error is in the message and deliberately not a `source`, so that a report of
    /// the whole chain does not say it twice.
    #[error("failed to read policy file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("failed to fetch policy from {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("refused policy from {source_name}: {size} bytes is more than the {max} allowed")]
    TooLarge {
        source_name: String,
        size: u64,
        max: u64,
    },
    #[error("refused policy url {url}: a url source needs a sha256 digest")]
    MissingDigest { url: String },
    #[error("refused policy from {source_name}: sha256 is {actual}, expected {expected}")]
    DigestMismatch {
        source_name: String,
        expected: String,
        actual: String,
    },
    #[error(
        "policy {policy} (sha256:{digest}) is not Wasm: it begins with {start}, not the Wasm magic 0061736d (hex)"
    )]
    NotWasm {
        policy: String,
        digest: String,
        /// The first bytes, at most four, in hex (or `nothing` for an empty file).
        start: String,
    },
    #[error(
        "policy {policy} (sha256:{digest}) is a core Wasm module, not a component; \
         make it a component with `wasm-tools component new` against the neocloud:policy@0.1.0 WIT"
    )]
    CoreModule { policy: String, digest: String },
    #[error("failed to compile policy {policy} (sha256:{digest}): {message}")]
    Compile {
        policy: String,
        digest: String,
        message: String,
    },
    #[error(
        "policy {policy} (sha256:{digest}) exports none of the neocloud:policy@0.1.0 roles (placement, fallback, pricing); it exports [{exports}]"
    )]
    WrongWorld {
        policy: String,
        digest: String,
        exports: String,
    },
    #[error("failed to link policy {policy} (sha256:{digest}): {message}")]
    Link {
        policy: String,
        digest: String,
        message: String,
    },
    #[error("policy {policy} does not implement the {role} role")]
    NotImplemented { policy: String, role: Role },
    #[error("policy {policy} failed to instantiate: {message}")]
    Instantiate { policy: String, message: String },
    #[error("policy {policy} was stopped: {kind}")]
    Trap { policy: String, kind: TrapKind },
    #[error("policy {policy} returned an error ({code:?}): {message}")]
    Guest {
        policy: String,
        code: ErrorCode,
        message: String,
    },
    #[error("policy {policy} returned an invalid answer: {reason}")]
    InvalidOutput { policy: String, reason: String },
}

impl WasmError {
    /// Short, stable label for metrics and events.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Engine(_) => "engine",
            Self::Read { .. } | Self::Fetch { .. } => "source",
            Self::MissingDigest { .. } | Self::DigestMismatch { .. } => "digest",
            Self::TooLarge { .. } => "too-large",
            Self::Compile { .. } | Self::CoreModule { .. } | Self::NotWasm { .. } => "compile",
            Self::WrongWorld { .. } | Self::NotImplemented { .. } => "wrong-world",
            Self::Link { .. } | Self::Instantiate { .. } => "link",
            Self::Trap { kind, .. } => kind.label(),
            Self::Guest { .. } => "guest-error",
            Self::InvalidOutput { .. } => "invalid-output",
        }
    }

    /// Whether trying again later may succeed (a fetch can; a broken policy cannot).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Fetch { .. })
    }
}
