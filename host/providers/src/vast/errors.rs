//! How Vast.ai failures are classified: by the `error` field and the numeric code in `msg`
//! ("error 410/3907: no_such_ask …"), then by status. A vanished ask is capacity, a bid below
//! the minimum is price-exceeded, a full account is quota, a bad key is auth (the bundles
//! endpoint answers it with a 404 and a bare `msg`).
//!
//! Not transport failures (see `http`) and not the destroy of a half-created instance.

use neocloud_core::FailureClass;

use super::wire::Outcome;
use crate::http::{Call, Http, Reply, class_of_status, excerpt};
use crate::provider::ProviderError;

/// The numeric code in "error 410/3907: …".
pub(crate) fn numeric_code(msg: &str) -> Option<&str> {
    let rest = msg.strip_prefix("error ")?;
    let (_, after) = rest.split_once('/')?;
    let code = after.split(':').next()?;
    (!code.is_empty() && code.bytes().all(|b| b.is_ascii_digit())).then_some(code)
}

/// The class of a Vast error body with its status.
pub(crate) fn class(status: u16, body: &Outcome) -> FailureClass {
    let error = body.error.as_deref().unwrap_or_default();
    let msg = body.msg.as_deref().unwrap_or_default().to_lowercase();
    if status == 429 || error == "rate_limit_exceeded" {
        FailureClass::RateLimited
    } else if error == "no_such_ask" || msg.contains("no_such_ask") {
        FailureClass::Capacity
    } else if error == "invalid_price"
        && (msg.contains("below the minimum") || body.new_contract.is_some())
    {
        FailureClass::PriceExceeded
    } else if error == "auth_error" || msg.contains("invalid user key") {
        FailureClass::Auth
    } else if msg.contains("limit reached")
        || msg.contains("insufficient credit")
        || msg.contains("balance")
    {
        FailureClass::Quota
    } else if status >= 500 {
        FailureClass::Transient
    } else if matches!(
        error,
        "invalid_args"
            | "invalid_price"
            | "invalid_request"
            | "invalid_token"
            | "no_ssh_key_for_vm"
    ) {
        FailureClass::InvalidRequest
    } else {
        class_of_status(
            reqwest::StatusCode::from_u16(status).unwrap_or(reqwest::StatusCode::BAD_REQUEST),
        )
    }
}

/// A classified error from a non-2xx reply (or a 2xx with `success: false`).
pub(crate) fn error(http: &Http, call: Call<'_>, reply: &Reply) -> ProviderError {
    let body: Outcome = serde_json::from_str(&reply.body).unwrap_or_default();
    let text = body
        .msg
        .clone()
        .or(body.detail.clone())
        .unwrap_or_else(|| excerpt(&reply.body));
    let code = numeric_code(&text)
        .map(str::to_owned)
        .or(body.error.clone())
        .unwrap_or_else(|| reply.status.as_u16().to_string());
    let message = text
        .split_once(": ")
        .filter(|(head, _)| head.starts_with("error "))
        .map_or(text.as_str(), |(_, rest)| rest)
        .to_lowercase();
    let mut error = http.coded_error(call, class(reply.status.as_u16(), &body), message, code);
    if let Some(after) = reply.retry_after {
        error = error.with_retry_after(after);
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: serde_json::Value) -> Outcome {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_numeric_code_is_read_from_the_message() {
        assert_eq!(
            numeric_code("error 410/3907: no_such_ask Instance type 1 is no longer available."),
            Some("3907")
        );
        assert_eq!(numeric_code("Invalid user key"), None);
    }

    #[test]
    fn vanished_asks_low_bids_bad_keys_and_full_accounts_are_told_apart() {
        let gone =
            body(serde_json::json!({"error": "no_such_ask", "msg": "error 410/3907: no_such_ask"}));
        assert_eq!(class(410, &gone), FailureClass::Capacity);
        let gone404 = body(
            serde_json::json!({"error": "invalid_args", "msg": "error 404/3603: no_such_ask Instance type by id 1 is not available."}),
        );
        assert_eq!(class(404, &gone404), FailureClass::Capacity);
        let low = body(
            serde_json::json!({"error": "invalid_price", "msg": "error 400/3467: bid price 0.1 is below the minimum bid 0.2", "new_contract": 7}),
        );
        assert_eq!(class(400, &low), FailureClass::PriceExceeded);
        assert_eq!(
            class(404, &body(serde_json::json!({"msg": "Invalid user key"}))),
            FailureClass::Auth
        );
        let full = body(
            serde_json::json!({"error": "invalid_args", "msg": "error 400/3467: instance limit reached"}),
        );
        assert_eq!(class(400, &full), FailureClass::Quota);
        let bad = body(
            serde_json::json!({"error": "invalid_args", "msg": "error 400/3467: unexpected field 'x'"}),
        );
        assert_eq!(class(400, &bad), FailureClass::InvalidRequest);
        assert_eq!(
            class(
                429,
                &body(serde_json::json!({"detail": "API requests too frequent"}))
            ),
            FailureClass::RateLimited
        );
        assert_eq!(class(502, &Outcome::default()), FailureClass::Transient);
    }
}
