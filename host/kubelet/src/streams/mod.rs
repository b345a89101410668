//! `kubectl exec`, `attach` and `port-forward` on the kubelet API, as a kubelet serves them: the
//! API server opens `/exec/{namespace}/{pod}/{container}` (or `/attach/...`, or
//! `/portForward/{namespace}/{pod}`) with `Upgrade: SPDY/3.1` and the stream protocols it speaks
//! in `X-Stream-Protocol-Version`; the node answers 101 and serves the protocol's streams
//! (`remotecommand` v4/v5: `error`, `stdin`, `stdout`, `stderr`, `resize`; `portforward.k8s.io`:
//! an `error` and a `data` stream per forwarded connection).
//!
//! Behind the streams is the Pod's runner: exec and each forwarded connection are one session
//! tunnelled over the runner's own connection to the callback (see
//! `neocloud_protocol::session`); attach follows the workload's output as the callback receives
//! it. Callers are authenticated and authorized as for logs (`nodes/proxy`) before anything is
//! opened.
//!
//! Not SPDY itself ([`super::spdy`]) and not the runner's side of a session.

mod exec;
mod forward;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::request::RequestError;
use super::workloads::PodRef;

pub(crate) use exec::{serve_attach, serve_exec};
pub(crate) use forward::serve_port_forward;

/// The `Upgrade` token of SPDY/3.1.
const SPDY: &str = "SPDY/3.1";
/// The header that lists (request) and names (response) the stream protocol.
const PROTOCOL_HEADER: &str = "x-stream-protocol-version";
/// The remotecommand protocols served, preferred first.
pub(crate) const EXEC_PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// The port-forward protocol.
pub(crate) const PORT_FORWARD_PROTOCOLS: &[&str] = &["portforward.k8s.io"];
/// How long the client has to open the streams it announced (the kubelet's default).
pub(crate) const STREAM_CREATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a streaming path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamTarget {
    /// `/exec/{namespace}/{pod}[/{uid}]/{container}`.
    Exec(PodRef, String),
    /// `/attach/{namespace}/{pod}[/{uid}]/{container}`.
    Attach(PodRef, String),
    /// `/portForward/{namespace}/{pod}[/{uid}]`.
    PortForward(PodRef),
}

/// The target of a streaming path; `None` when the path is not one (so it may be a log path).
pub fn parse_stream_path(path: &str) -> Option<Result<StreamTarget, RequestError>> {
    let (kind, rest) = path.strip_prefix('/')?.split_once('/')?;
    if !matches!(kind, "exec" | "attach" | "portForward") {
        return None;
    }
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.iter().take(2).any(|p| p.is_empty()) || parts.len() < 2 {
        return Some(Err(RequestError::NotFound(path.to_owned())));
    }
    let pod = PodRef {
        namespace: parts[0].to_owned(),
        name: parts[1].to_owned(),
    };
    let container = match parts.len() {
        3 => Some(parts[2]),
        4 => Some(parts[3]),
        _ => None,
    };
    Some(match (kind, parts.len(), container) {
        ("portForward", 2 | 3, _) => Ok(StreamTarget::PortForward(pod)),
        ("exec" | "attach", 3 | 4, Some(c)) if !c.is_empty() => Ok(if kind == "exec" {
            StreamTarget::Exec(pod, c.to_owned())
        } else {
            StreamTarget::Attach(pod, c.to_owned())
        }),
        ("exec" | "attach", 2, _) | ("exec" | "attach", 3 | 4, Some(_)) => {
            Err(RequestError::MissingContainer(path.to_owned()))
        }
        _ => Err(RequestError::NotFound(path.to_owned())),
    })
}

/// Which streams an exec or attach asks for: the kubelet's query parameters `command`
/// (repeated, in order), `input`, `output`, `error` and `tty` (`1` or `true`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// The command and its arguments (exec only).
    pub command: Vec<String>,
    /// The caller sends stdin.
    pub stdin: bool,
    /// The caller reads stdout.
    pub stdout: bool,
    /// The caller reads stderr (never with a TTY, as on a kubelet).
    pub stderr: bool,
    /// On a pseudo-terminal.
    pub tty: bool,
}

impl ExecOptions {
    /// The options of a query given as decoded pairs; `exec` requires a command.
    pub fn parse(pairs: &[(String, String)], exec: bool) -> Result<Self, String> {
        let flag = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .is_some_and(|(_, v)| v == "1" || v.eq_ignore_ascii_case("true"))
        };
        let command: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        let tty = flag("tty");
        let options = Self {
            stdin: flag("input"),
            stdout: flag("output"),
            stderr: flag("error") && !tty,
            tty,
            command: if exec { command } else { Vec::new() },
        };
        if !(options.stdin || options.stdout || flag("error")) {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        if exec && options.command.is_empty() {
            return Err("you must specify at least one command for the container".into());
        }
        Ok(options)
    }
}

/// The protocol of `headers` to speak, or the status and message that refuse the upgrade (as the
/// kubelet's handshake words it).
pub(crate) fn negotiate(
    headers: &HeaderMap,
    served: &'static [&'static str],
) -> Result<&'static str, (StatusCode, String)> {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let connection = headers
        .get(header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let upgrading = connection
        .split(',')
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !upgrading || !upgrade.eq_ignore_ascii_case(SPDY) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!(
                "unable to upgrade: missing upgrade headers in request (Connection: upgrade and \
                 Upgrade: {SPDY} are required, got Connection: {connection:?}, Upgrade: {upgrade:?})"
            ),
        ));
    }
    let offered: Vec<&str> = headers
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    served
        .iter()
        .find(|p| offered.contains(p))
        .copied()
        .ok_or_else(|| {
            (
                StatusCode::FORBIDDEN,
                format!(
                    "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, \
                     server accepts {served:?}"
                ),
            )
        })
}

/// A refused exec, attach or port-forward: `status` with a `metav1.Status` body. A client's SPDY
/// (or WebSocket) upgrade decodes such a body into the API error it returns, so kubectl shows
/// `message` with its status (`Error from server (NotFound): ...`); a plain-text body would
/// reach it as `Internal error occurred: unable to upgrade connection: ...`.
pub(crate) fn refused(status: StatusCode, message: &str) -> Response {
    let reason = match status {
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
        StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        _ => "InternalError",
    };
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status.as_u16(),
    });
    let mut response = Response::new(axum::body::Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The 101 answer that switches to SPDY with `protocol`.
pub(crate) fn switching(protocol: &'static str) -> Response {
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(SPDY));
    headers.insert(PROTOCOL_HEADER, HeaderValue::from_static(protocol));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn streaming_paths_name_their_pod_and_container() {
        let cases = [
            (
                "/exec/ns/p/main",
                StreamTarget::Exec(pod("ns", "p"), "main".into()),
            ),
            (
                "/exec/ns/p/uid-1/main",
                StreamTarget::Exec(pod("ns", "p"), "main".into()),
            ),
            (
                "/attach/ns/p/main",
                StreamTarget::Attach(pod("ns", "p"), "main".into()),
            ),
            (
                "/portForward/ns/p",
                StreamTarget::PortForward(pod("ns", "p")),
            ),
            (
                "/portForward/ns/p/uid-1",
                StreamTarget::PortForward(pod("ns", "p")),
            ),
        ];
        for (path, want) in cases {
            assert_eq!(parse_stream_path(path), Some(Ok(want)), "{path}");
        }
        assert_eq!(parse_stream_path("/containerLogs/ns/p/main"), None);
        assert_eq!(parse_stream_path("/healthz"), None);
        assert_eq!(
            parse_stream_path("/exec/ns/p"),
            Some(Err(RequestError::MissingContainer("/exec/ns/p".into())))
        );
        assert_eq!(
            parse_stream_path("/exec/ns/p/"),
            Some(Err(RequestError::MissingContainer("/exec/ns/p/".into())))
        );
        for bad in [
            "/exec/ns",
            "/exec//p/c",
            "/portForward/ns/p/u/x",
            "/exec/a/b/c/d/e",
        ] {
            assert_eq!(
                parse_stream_path(bad),
                Some(Err(RequestError::NotFound(bad.into()))),
                "{bad}"
            );
        }
    }

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn exec_options_keep_the_command_in_order_and_drop_stderr_with_a_tty() {
        let options = ExecOptions::parse(
            &pairs(&[
                ("command", "sh"),
                ("command", "-c"),
                ("command", "echo 'a b'"),
                ("input", "1"),
                ("output", "1"),
                ("error", "1"),
                ("tty", "true"),
            ]),
            true,
        )
        .expect("valid");
        assert_eq!(options.command, ["sh", "-c", "echo 'a b'"]);
        assert!(options.stdin && options.stdout && options.tty && !options.stderr);

        let err = ExecOptions::parse(&pairs(&[("command", "ls")]), true).expect_err("no streams");
        assert_eq!(err, "you must specify at least 1 of stdin, stdout, stderr");
        let err = ExecOptions::parse(&pairs(&[("output", "1")]), true).expect_err("no command");
        assert_eq!(
            err,
            "you must specify at least one command for the container"
        );
        let attach = ExecOptions::parse(&pairs(&[("output", "1")]), false).expect("attach");
        assert!(attach.command.is_empty() && attach.stdout);
    }

    #[tokio::test]
    async fn a_refusal_is_a_status_with_its_code_reason_and_message() {
        for (code, reason) in [
            (StatusCode::BAD_REQUEST, "BadRequest"),
            (StatusCode::FORBIDDEN, "Forbidden"),
            (StatusCode::NOT_FOUND, "NotFound"),
            (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        ] {
            let response = refused(code, "pod ns/p: \"why\"");
            assert_eq!(response.status(), code);
            let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .expect("body");
            let status: serde_json::Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(
                status,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "message": "pod ns/p: \"why\"", "reason": reason,
                    "code": code.as_u16()})
            );
        }
    }

    #[test]
    fn the_handshake_needs_spdy_and_a_shared_protocol() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        headers.append(
            PROTOCOL_HEADER,
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        headers.append(
            PROTOCOL_HEADER,
            HeaderValue::from_static("v3.channel.k8s.io"),
        );
        assert_eq!(
            negotiate(&headers, EXEC_PROTOCOLS).ok(),
            Some("v4.channel.k8s.io")
        );
        headers.append(
            PROTOCOL_HEADER,
            HeaderValue::from_static("v5.channel.k8s.io"),
        );
        assert_eq!(
            negotiate(&headers, EXEC_PROTOCOLS).ok(),
            Some("v5.channel.k8s.io")
        );

        let refused = negotiate(&headers, PORT_FORWARD_PROTOCOLS).expect_err("no shared");
        assert_eq!(refused.0, StatusCode::FORBIDDEN);

        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        let refused = negotiate(&headers, EXEC_PROTOCOLS).expect_err("not spdy");
        assert_eq!(refused.0, StatusCode::BAD_REQUEST);
    }
}
