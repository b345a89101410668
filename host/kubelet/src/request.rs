//! What a `/containerLogs` request asks for: the Pod and container from the path, and the
//! kubelet's query parameters (`follow`, `tailLines`, `limitBytes`, `sinceSeconds`, `sinceTime`,
//! `timestamps`, `previous`, `stream`) as [`LogOptions`](neocloud_remote::callback::LogOptions),
//! validated as the kubelet validates `PodLogOptions`, and every number also against an upper
//! bound (the kubelet has none), so that no value can overflow where it is used. Parameters it
//! does not know are ignored, as the kubelet does.
//!
//! Not HTTP: the server turns a [`RequestError`] into a 400 (or a 404 for an unknown path).

use chrono::{DateTime, Utc};
use neocloud_remote::callback::LogOptions;

use super::workloads::PodRef;

/// The path prefix of the log endpoint.
pub(crate) const CONTAINER_LOGS: &str = "/containerLogs/";

/// Why a request cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The path is not `/containerLogs/{namespace}/{pod}/{container}`.
    #[error("path {0:?} not found")]
    NotFound(String),
    /// The path names a Pod but no container.
    #[error("missing container name in path {0:?}")]
    MissingContainer(String),
    /// A query parameter has a value the kubelet refuses.
    #[error("invalid value {value:?} for query parameter {param}: {reason}")]
    Invalid {
        /// The parameter.
        param: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A query parameter asks for something this node cannot do.
    #[error("query parameter {param}={value} is not supported: {reason}")]
    Unsupported {
        /// The parameter.
        param: &'static str,
        /// Its value.
        value: String,
        /// Why not.
        reason: &'static str,
    },
}

/// The Pod and container of a `/containerLogs/{namespace}/{pod}/{container}` path.
pub fn parse_path(path: &str) -> Result<(PodRef, String), RequestError> {
    let not_found = || RequestError::NotFound(path.to_owned());
    let rest = path.strip_prefix(CONTAINER_LOGS).ok_or_else(not_found)?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [ns, pod, container] if !ns.is_empty() && !pod.is_empty() => {
            if container.is_empty() {
                return Err(RequestError::MissingContainer(path.to_owned()));
            }
            let pod = PodRef {
                namespace: (*ns).to_owned(),
                name: (*pod).to_owned(),
            };
            Ok((pod, (*container).to_owned()))
        }
        [ns, pod] if !ns.is_empty() && !pod.is_empty() => {
            Err(RequestError::MissingContainer(path.to_owned()))
        }
        _ => Err(not_found()),
    }
}

/// The log options of a query, given as decoded `(name, value)` pairs; of a repeated parameter
/// the first value counts. `now` anchors `sinceTime`.
pub fn parse_query(
    pairs: &[(String, String)],
    now: DateTime<Utc>,
) -> Result<LogOptions, RequestError> {
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let since_seconds = get("sinceSeconds")
        .map(|v| int("sinceSeconds", v, &SINCE_SECONDS))
        .transpose()?;
    let since_time = get("sinceTime").map(|v| time(v, now)).transpose()?;
    if let (Some(_), Some(value)) = (since_seconds, get("sinceTime")) {
        return Err(RequestError::Invalid {
            param: "sinceTime",
            value: value.to_owned(),
            reason: "at most one of sinceTime or sinceSeconds may be given",
        });
    }
    check_stream(get("stream"))?;
    Ok(LogOptions {
        follow: flag(get("follow"), "follow")?,
        tail_lines: get("tailLines")
            .map(|v| int("tailLines", v, &TAIL_LINES))
            .transpose()?
            .map(to_usize),
        limit_bytes: get("limitBytes")
            .map(|v| int("limitBytes", v, &LIMIT_BYTES))
            .transpose()?
            .map(to_usize),
        since_seconds: since_seconds.or(since_time),
        timestamps: flag(get("timestamps"), "timestamps")?,
        previous: flag(get("previous"), "previous")?,
    })
}

fn flag(value: Option<&str>, param: &'static str) -> Result<bool, RequestError> {
    value.map_or(Ok(false), |v| boolean(param, v))
}

/// A boolean as the API server's parameter codec reads it: `true`/`false`, `1`/`0`, `t`/`f` in
/// any case; a parameter without a value is true.
fn boolean(param: &'static str, value: &str) -> Result<bool, RequestError> {
    match value.to_ascii_lowercase().as_str() {
        "" | "true" | "t" | "1" => Ok(true),
        "false" | "f" | "0" => Ok(false),
        _ => Err(RequestError::Invalid {
            param,
            value: value.to_owned(),
            reason: "must be true or false",
        }),
    }
}

/// The range of a numeric query parameter, its bounds inclusive.
struct Range {
    min: u64,
    max: u64,
    /// What the error says when the value is outside it.
    reason: &'static str,
}

/// `sinceSeconds`: at least a second, at most a hundred years, so that `now - sinceSeconds` is a
/// time.
const SINCE_SECONDS: Range = Range {
    min: 1,
    max: 100 * 365 * 24 * 3600,
    reason: "must be between 1 and 3153600000 (a hundred years)",
};
/// `tailLines`: any count a log could hold.
const TAIL_LINES: Range = Range {
    min: 0,
    max: 1 << 40,
    reason: "must be between 0 and 1099511627776",
};
/// `limitBytes`: at least a byte, at most a tebibyte.
const LIMIT_BYTES: Range = Range {
    min: 1,
    max: 1 << 40,
    reason: "must be between 1 and 1099511627776",
};

/// A decimal integer within `range`, else an error naming `param` and `value`.
fn int(param: &'static str, value: &str, range: &Range) -> Result<u64, RequestError> {
    let invalid = |reason| RequestError::Invalid {
        param,
        value: value.to_owned(),
        reason,
    };
    let n: i128 = value.parse().map_err(|_| invalid("must be an integer"))?;
    u64::try_from(n)
        .ok()
        .filter(|n| (range.min..=range.max).contains(n))
        .ok_or_else(|| invalid(range.reason))
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// `sinceTime` (RFC 3339) as whole seconds before `now`, rounded up so that no line at or after
/// it is left out; a time in the future reads from now on.
fn time(value: &str, now: DateTime<Utc>) -> Result<u64, RequestError> {
    let since = DateTime::parse_from_rfc3339(value).map_err(|_| RequestError::Invalid {
        param: "sinceTime",
        value: value.to_owned(),
        reason: "must be an RFC 3339 time",
    })?;
    let ago = now.signed_duration_since(since.with_timezone(&Utc));
    let secs = ago.num_seconds() + i64::from(ago.subsec_nanos() > 0);
    Ok(u64::try_from(secs).unwrap_or(0))
}

/// `stream=All` is the default; the node keeps one merged log, so one stream alone is refused.
fn check_stream(value: Option<&str>) -> Result<(), RequestError> {
    match value {
        None | Some("All") => Ok(()),
        Some(v @ ("Stdout" | "Stderr")) => Err(RequestError::Unsupported {
            param: "stream",
            value: v.to_owned(),
            reason: "the node keeps stdout and stderr as one log",
        }),
        Some(v) => Err(RequestError::Invalid {
            param: "stream",
            value: v.to_owned(),
            reason: "must be All, Stdout or Stderr",
        }),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
