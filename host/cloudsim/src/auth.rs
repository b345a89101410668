//! Reading credentials from requests: bearer tokens, HTTP Basic (`KEY:`), and `api_key` query
//! parameters, as the providers accept them.
//!
//! Not the decision of what a missing key means: each provider's dialect decides that.

use axum::extract::Request;
use http::header::AUTHORIZATION;

/// What a request presented.
#[derive(Debug, PartialEq)]
pub(crate) enum Presented {
    /// No credentials.
    Nothing,
    /// The right key.
    Valid,
    /// Some other key, or a malformed header.
    Invalid,
}

/// Checks the `Authorization` header (Bearer, or Basic when `basic` is allowed) and, when
/// `query` is allowed, the `api_key` query parameter.
pub(crate) fn presented(req: &Request, key: &str, basic: bool, query: bool) -> Presented {
    if let Some(header) = req.headers().get(AUTHORIZATION) {
        let text = header.to_str().unwrap_or_default();
        return verdict(header_key(text, basic).as_deref() == Some(key));
    }
    if query {
        let params = req.uri().query().unwrap_or_default();
        if let Some(value) = params.split('&').find_map(|p| p.strip_prefix("api_key=")) {
            return verdict(value == key);
        }
    }
    Presented::Nothing
}

fn verdict(valid: bool) -> Presented {
    if valid {
        Presented::Valid
    } else {
        Presented::Invalid
    }
}

fn header_key(text: &str, basic: bool) -> Option<String> {
    if let Some(token) = text.strip_prefix("Bearer ") {
        return Some(token.trim().to_string());
    }
    let encoded = text.strip_prefix("Basic ").filter(|_| basic)?;
    let decoded = decode_base64(encoded.trim())?;
    let user = String::from_utf8(decoded).ok()?;
    Some(
        user.split_once(':')
            .map_or(user.clone(), |(k, _)| k.to_string()),
    )
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits: u32 = 0;
    let mut count = 0;
    let mut out = Vec::new();
    for byte in text.bytes().filter(|b| *b != b'=') {
        let value = ALPHABET.iter().position(|a| *a == byte)? as u32;
        bits = (bits << 6) | value;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(header: Option<&str>, uri: &str) -> Request {
        let mut builder = http::Request::builder().uri(uri);
        if let Some(value) = header {
            builder = builder.header(AUTHORIZATION, value);
        }
        builder.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn bearer_basic_and_query_keys_are_recognised_only_where_allowed() {
        let bearer = request(Some("Bearer k1"), "/");
        assert_eq!(presented(&bearer, "k1", false, false), Presented::Valid);
        // "azE6" is base64 of "k1:"
        let basic = request(Some("Basic azE6"), "/");
        assert_eq!(presented(&basic, "k1", true, false), Presented::Valid);
        assert_eq!(presented(&basic, "k1", false, false), Presented::Invalid);
        let query = request(None, "/graphql?api_key=k1");
        assert_eq!(presented(&query, "k1", false, true), Presented::Valid);
        assert_eq!(presented(&query, "k1", false, false), Presented::Nothing);
        assert_eq!(
            presented(&request(Some("Bearer no"), "/"), "k1", false, false),
            Presented::Invalid
        );
    }
}
