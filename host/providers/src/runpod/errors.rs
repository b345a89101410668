//! How RunPod failures are classified: REST v2 problem bodies by status (capacity is a 400 known
//! only by its text), and GraphQL errors, which arrive with HTTP 200, by their message.
//!
//! Not transport failures (see `http`) and not recovery.

use neocloud_core::FailureClass;
use reqwest::StatusCode;

use super::wire::{GqlError, Problem};
use crate::http::{Call, Http, Reply, class_of_status, excerpt};
use crate::provider::{Operation, ProviderError};

/// Phrases RunPod uses when it has no machine for the request (REST, GraphQL and resume).
const CAPACITY_PHRASES: &[&str] = &[
    "no longer any instances available",
    "no instances available",
    "not enough free gpus",
    "no available gpus",
];

/// Whether a RunPod message says there is no capacity.
pub(crate) fn is_capacity_text(message: &str) -> bool {
    let lower = message.to_lowercase();
    CAPACITY_PHRASES.iter().any(|p| lower.contains(p))
}

/// The class of a REST error reply.
pub(crate) fn rest_class(op: Operation, status: StatusCode, detail: &str) -> FailureClass {
    match status.as_u16() {
        400 if is_capacity_text(detail) => FailureClass::Capacity,
        // RunPod's spec: a 403 on create means this pool is closed to the account: skip it.
        403 if op == Operation::Create => FailureClass::Capacity,
        _ => class_of_status(status),
    }
}

/// A classified error from a non-2xx REST reply.
pub(crate) fn rest_error(http: &Http, call: Call<'_>, reply: &Reply) -> ProviderError {
    let problem: Problem = serde_json::from_str(&reply.body).unwrap_or_default();
    let detail = problem
        .detail
        .clone()
        .or(problem.title.clone())
        .unwrap_or_else(|| excerpt(&reply.body));
    let mut message = detail.to_lowercase();
    if !problem.errors.is_empty() {
        let listed: Vec<String> = problem
            .errors
            .iter()
            .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
            .collect();
        message = format!("{message}: {}", listed.join("; ").to_lowercase());
    }
    let class = rest_class(call.op, reply.status, &detail);
    let mut error = http
        .error(call, class, message)
        .with_code(reply.status.as_u16().to_string());
    if let Some(after) = reply.retry_after {
        error = error.with_retry_after(after);
    }
    error
}

/// The class of a GraphQL resolver error, from its message.
pub(crate) fn gql_class(message: &str) -> FailureClass {
    let lower = message.to_lowercase();
    if is_capacity_text(&lower) {
        FailureClass::Capacity
    } else if lower.contains("below the minimum bid") {
        FailureClass::PriceExceeded
    } else if lower.contains("balance") || lower.contains("spend limit") {
        FailureClass::Quota
    } else if lower.contains("unauthorized") || lower.contains("api key") {
        FailureClass::Auth
    } else if lower.contains("something went wrong") || lower.contains("internal") {
        FailureClass::Transient
    } else {
        FailureClass::InvalidRequest
    }
}

/// A classified error from GraphQL `errors` (HTTP 200 or 400).
pub(crate) fn gql_error(http: &Http, call: Call<'_>, errors: &[GqlError]) -> ProviderError {
    let first = errors.first();
    let message = first.map_or("graphql error without a message".to_owned(), |e| {
        e.message.to_lowercase()
    });
    let code = first
        .and_then(|e| e.extensions.as_ref())
        .and_then(|x| x.code.clone())
        .unwrap_or_else(|| "graphql".to_owned());
    http.coded_error(call, gql_class(&message), message, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_400_with_the_capacity_text_is_capacity_and_other_400s_are_invalid_requests() {
        let text = "There are no longer any instances available with the requested specifications. Please refresh and try again.";
        assert_eq!(
            rest_class(Operation::Create, StatusCode::BAD_REQUEST, text),
            FailureClass::Capacity
        );
        let other = "exactly one of 'gpu' or 'cpu' must be set";
        assert_eq!(
            rest_class(Operation::Create, StatusCode::BAD_REQUEST, other),
            FailureClass::InvalidRequest
        );
    }

    #[test]
    fn balance_auth_and_validation_statuses_are_classified() {
        assert_eq!(
            rest_class(Operation::Create, StatusCode::PAYMENT_REQUIRED, ""),
            FailureClass::Quota
        );
        assert_eq!(
            rest_class(Operation::Get, StatusCode::UNAUTHORIZED, ""),
            FailureClass::Auth
        );
        assert_eq!(
            rest_class(Operation::Create, StatusCode::FORBIDDEN, ""),
            FailureClass::Capacity
        );
        assert_eq!(
            rest_class(Operation::ListOurs, StatusCode::FORBIDDEN, ""),
            FailureClass::Auth
        );
        assert_eq!(
            rest_class(
                Operation::Create,
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation failed"
            ),
            FailureClass::InvalidRequest
        );
    }

    #[test]
    fn graphql_messages_are_classified_by_their_text() {
        assert_eq!(
            gql_class("There are not enough free GPUs on the host machine to start this pod."),
            FailureClass::Capacity
        );
        assert_eq!(
            gql_class("Your bid of $0.100/gpu/hr is below the minimum bid of $0.200/gpu/hr"),
            FailureClass::PriceExceeded
        );
        assert_eq!(
            gql_class("Insufficient balance to deploy this pod."),
            FailureClass::Quota
        );
        assert_eq!(
            gql_class("Something went wrong. Please try again later"),
            FailureClass::Transient
        );
        assert_eq!(
            gql_class("gpuTypeId \"X\" is not a valid GPU type"),
            FailureClass::InvalidRequest
        );
    }
}
