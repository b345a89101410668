//! How Lambda Cloud failures are classified: by the error `code` (never the message), falling
//! back to the HTTP status when the body is not Lambda's error envelope.
//!
//! Not transport failures (see `http`).

use neocloud_core::FailureClass;

use super::wire::ErrorBody;
use crate::http::{Call, Http, Reply, class_of_status, excerpt};
use crate::provider::ProviderError;

/// The capacity code.
pub(crate) const INSUFFICIENT_CAPACITY: &str = "instance-operations/launch/insufficient-capacity";

/// The class of a Lambda error code, if the code is known.
pub(crate) fn code_class(code: &str) -> Option<FailureClass> {
    Some(match code {
        INSUFFICIENT_CAPACITY => FailureClass::Capacity,
        "global/quota-exceeded" => FailureClass::Quota,
        "global/invalid-api-key" | "global/account-inactive" | "global/forbidden" => {
            FailureClass::Auth
        }
        "global/invalid-address" => FailureClass::Quota,
        "global/invalid-parameters"
        | "global/object-does-not-exist"
        | "global/not-found"
        | "global/conflict"
        | "global/duplicate"
        | "instance-operations/launch/file-system-in-wrong-region" => FailureClass::InvalidRequest,
        "global/internal-error" => FailureClass::Transient,
        code if code.starts_with("provider/") => FailureClass::Transient,
        _ => return None,
    })
}

/// A classified error from a non-2xx reply.
pub(crate) fn error(http: &Http, call: Call<'_>, reply: &Reply) -> ProviderError {
    let parsed: Option<ErrorBody> = serde_json::from_str(&reply.body).ok();
    let status_class = class_of_status(reply.status);
    let mut error = match parsed {
        Some(body) => {
            let e = body.error;
            let class = match reply.status.as_u16() {
                429 => FailureClass::RateLimited,
                _ => code_class(&e.code).unwrap_or(status_class),
            };
            let mut message = e.message.trim_end_matches('.').to_lowercase();
            if let Some(s) = e.suggestion {
                message = format!("{message} ({})", s.trim_end_matches('.').to_lowercase());
            }
            http.coded_error(call, class, message, e.code)
        }
        None => http
            .error(
                call,
                status_class,
                format!("http {}: {}", reply.status.as_u16(), excerpt(&reply.body)),
            )
            .with_code(reply.status.as_u16().to_string()),
    };
    if let Some(after) = reply.retry_after {
        error = error.with_retry_after(after);
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_codes_have_the_expected_classes() {
        assert_eq!(
            code_class(INSUFFICIENT_CAPACITY),
            Some(FailureClass::Capacity)
        );
        assert_eq!(
            code_class("global/quota-exceeded"),
            Some(FailureClass::Quota)
        );
        assert_eq!(
            code_class("global/invalid-api-key"),
            Some(FailureClass::Auth)
        );
        assert_eq!(
            code_class("global/object-does-not-exist"),
            Some(FailureClass::InvalidRequest)
        );
        assert_eq!(
            code_class("provider/internal-unavailable"),
            Some(FailureClass::Transient)
        );
        assert_eq!(code_class("something/new"), None);
    }
}
