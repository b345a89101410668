//! What the caller does with a policy's outcome, given the policy's `failurePolicy` and `mode`.
//!
//! | mode    | outcome | failurePolicy | verdict                                        |
//! |---------|---------|---------------|------------------------------------------------|
//! | Enforce | answer  | any           | [`Verdict::Apply`]: use the answer             |
//! | Enforce | error   | Fail          | [`Verdict::Failed`]: the decision fails        |
//! | Enforce | error   | Ignore        | [`Verdict::Ignored`]: use the host default     |
//! | Audit   | any     | any           | [`Verdict::Audited`]: report, use host default |
//!
//! Not for running policies or for choosing the host default; the broker owns the defaults.

use std::time::Duration;

use super::config::{FailurePolicy, Mode};
use super::error::WasmError;
use super::host::DecisionLog;

/// The decision the caller acts on.
#[derive(Debug)]
pub enum Verdict<T> {
    /// Enforce mode and the policy answered: apply the answer.
    Apply(T),
    /// Enforce mode, the policy failed and `failurePolicy` is `Fail`: the decision fails with
    /// this error (the Pod is not placed and says why).
    Failed(WasmError),
    /// Enforce mode, the policy failed and `failurePolicy` is `Ignore`: report the error and
    /// use the host default.
    Ignored(WasmError),
    /// Audit mode: report the outcome and use the host default, whatever it was.
    Audited(Result<T, WasmError>),
}

impl<T> Verdict<T> {
    pub(crate) fn new(result: Result<T, WasmError>, failure: FailurePolicy, mode: Mode) -> Self {
        match (mode, result, failure) {
            (Mode::Audit, result, _) => Self::Audited(result),
            (Mode::Enforce, Ok(answer), _) => Self::Apply(answer),
            (Mode::Enforce, Err(error), FailurePolicy::Fail) => Self::Failed(error),
            (Mode::Enforce, Err(error), FailurePolicy::Ignore) => Self::Ignored(error),
        }
    }

    /// The answer to apply, if any (only [`Verdict::Apply`]).
    pub fn applied(&self) -> Option<&T> {
        match self {
            Self::Apply(answer) => Some(answer),
            _ => None,
        }
    }

    /// The policy's error, if it failed (in any mode).
    pub fn error(&self) -> Option<&WasmError> {
        match self {
            Self::Failed(e) | Self::Ignored(e) | Self::Audited(Err(e)) => Some(e),
            Self::Apply(_) | Self::Audited(Ok(_)) => None,
        }
    }

    /// Whether the host default decides ([`Verdict::Ignored`] or [`Verdict::Audited`]).
    pub fn uses_host_default(&self) -> bool {
        matches!(self, Self::Ignored(_) | Self::Audited(_))
    }
}

/// One evaluation: the verdict, what the guest logged, and how long it took (instantiation
/// included).
#[derive(Debug)]
pub struct Evaluation<T> {
    pub verdict: Verdict<T>,
    pub log: DecisionLog,
    pub elapsed: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> WasmError {
        WasmError::InvalidOutput {
            policy: "p".into(),
            reason: "r".into(),
        }
    }

    #[test]
    fn enforce_applies_answers_and_fail_or_ignore_decides_errors() {
        let apply = Verdict::new(Ok(1), FailurePolicy::Fail, Mode::Enforce);
        assert_eq!(apply.applied(), Some(&1));
        let failed = Verdict::<i32>::new(Err(failure()), FailurePolicy::Fail, Mode::Enforce);
        assert!(matches!(failed, Verdict::Failed(_)) && !failed.uses_host_default());
        let ignored = Verdict::<i32>::new(Err(failure()), FailurePolicy::Ignore, Mode::Enforce);
        assert!(matches!(ignored, Verdict::Ignored(_)) && ignored.uses_host_default());
    }

    #[test]
    fn audit_never_applies_nor_fails() {
        let ok = Verdict::new(Ok(1), FailurePolicy::Fail, Mode::Audit);
        assert!(ok.applied().is_none() && ok.uses_host_default());
        let err = Verdict::<i32>::new(Err(failure()), FailurePolicy::Fail, Mode::Audit);
        assert!(matches!(err, Verdict::Audited(Err(_))) && err.error().is_some());
    }
}
