//! The kubelet API's HTTPS server: `GET /healthz` for anyone, and for authenticated, authorized
//! callers `GET /containerLogs/{namespace}/{pod}/{container}`, streamed (chunked) so that a
//! follower gets each line as it arrives. Every other path is a 404 (after authorization, as on a
//! kubelet). Errors are plain text, which the API server hands on to `kubectl logs`.
//!
//! `/exec`, `/attach` and `/portForward` upgrade to SPDY and are served by [`super::streams`];
//! they need `create` on `nodes/proxy` whatever the HTTP method ([`proxy_verb`]).
//! Connections are served within the configured
//! [`ServeLimits`](neocloud_remote::serving::ServeLimits); an upgraded connection keeps its place
//! under the connection cap until its SPDY session ends, and every SPDY session is a tracked task
//! that shutdown ends.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use axum::routing::get;
use futures::StreamExt;
use futures::future::BoxFuture;
use neocloud_remote::serving::{ConnectionSlot, ServerStopped, Tasks, first_to_end};
use neocloud_remote::tls::{TlsListener, TlsMaterial};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use super::auth::{AccessReview, Gate, Refusal, UserInfo, proxy_verb, verb};
use super::request::{RequestError, parse_path, parse_query};
use super::spdy::{self, Connection};
use super::streams::{self, ExecOptions, StreamTarget};
use super::workloads::Workloads;
use super::{KubeletConfig, KubeletError, x509};
use neocloud_protocol::session::SessionRequest;

/// How long [`KubeletServer::shutdown`] lets open log streams finish before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The caller of one connection: its address and the user of its verified client certificate.
#[derive(Debug, Clone)]
struct Peer {
    addr: SocketAddr,
    certificate: Option<UserInfo>,
}

impl Peer {
    /// The peer of a handshaken connection.
    fn of(stream: &TlsStream<TcpStream>, addr: SocketAddr) -> Self {
        let (_, session) = stream.get_ref();
        let certificate = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| x509::subject(leaf))
            .map(|(name, groups)| UserInfo {
                name,
                groups,
                ..Default::default()
            });
        Self { addr, certificate }
    }
}

pub(super) struct App {
    gate: Gate,
    pub(super) source: Arc<dyn Workloads>,
    node: String,
    /// Every connection and SPDY session, ended at shutdown.
    pub(super) tasks: Tasks,
    streams: spdy::Limits,
    /// The relays admitted to `/relay/{uid}/{port}`; `None`: the route answers 404.
    pub(super) relays: Option<Arc<crate::relay::RelayTable>>,
}

/// A running kubelet API server.
#[derive(Debug)]
pub struct KubeletServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    accepting: JoinHandle<()>,
    tasks: Tasks,
}

impl KubeletServer {
    /// Binds `config.listen` and serves HTTPS with `tls`, trusting client certificates of
    /// `config.client_ca_pem`, checking tokens and access with `reviews`, and reading logs from
    /// `source`.
    pub async fn start(
        config: KubeletConfig,
        tls: &TlsMaterial,
        reviews: Arc<dyn AccessReview>,
        source: Arc<dyn Workloads>,
    ) -> Result<Self, KubeletError> {
        let server_config = tls.server_config(config.client_ca_pem.as_deref())?;
        let tcp = TcpListener::bind(config.listen).await.map_err(|e| {
            KubeletError::Bind(format!("failed to listen on {}: {e}", config.listen))
        })?;
        let (listener, accepting) = TlsListener::new(tcp, server_config, "kubelet")?;
        let local_addr = axum::serve::Listener::local_addr(&listener)
            .map_err(|e| KubeletError::Bind(e.to_string()))?;
        let gate = Gate::new(reviews, config.node_name.clone(), config.auth_cache_ttl);
        let node = config.node_name.clone();
        let tasks = Tasks::default();
        let app = Arc::new(App {
            gate,
            source,
            node,
            tasks: tasks.clone(),
            streams: config.streams,
            relays: config.relays.clone(),
        });
        let (stop, stopped) = watch::channel(false);
        let serve = neocloud_remote::serving::serve(
            listener,
            routes(app),
            config.serve,
            Peer::of,
            stopped,
            tasks.clone(),
        );
        let task = tokio::spawn(serve);
        tracing::info!(addr = %local_addr, node = %config.node_name, "kubelet: serving the kubelet API");
        Ok(Self {
            local_addr,
            stop,
            task,
            accepting,
            tasks,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until one of the server's tasks ends by itself (a panic), which it says; never
    /// returns while the server works. Dropping the future stops the server.
    pub async fn serve(mut self) -> ServerStopped {
        let tasks = vec![
            ("HTTP service", &mut self.task),
            ("TLS accept loop", &mut self.accepting),
        ];
        first_to_end("kubelet", tasks).await
    }

    /// Stops accepting, gives open requests and SPDY sessions a few seconds to finish, then
    /// cuts them; returns once every connection and session task has ended.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        self.tasks.shut_down(SHUTDOWN_GRACE).await;
    }

    /// How many connections and SPDY sessions are being served.
    pub fn open_connections(&self) -> usize {
        self.tasks.running()
    }
}

impl Drop for KubeletServer {
    fn drop(&mut self) {
        self.task.abort();
        self.accepting.abort();
        self.tasks.stop();
    }
}

fn routes(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(metrics_resource))
        .route("/relay/{uid}/{port}", get(crate::relay::route::relay))
        .fallback(container_logs)
        .with_state(app)
}

fn text(status: StatusCode, message: String) -> Response {
    let mut response = plain(Body::from(message));
    *response.status_mut() = status;
    response
}

/// A 200 with a text body.
fn plain(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Every other path: the streaming endpoints (exec, attach, port-forward) and container logs.
async fn container_logs(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    request: Request,
) -> Response {
    let (method, uri, headers) = (
        request.method().clone(),
        request.uri().clone(),
        request.headers().clone(),
    );
    // A stream into a Pod needs `create`, whatever the method; logs need the method's verb.
    let needed = proxy_verb(&method, uri.path());
    let stream = streams::parse_stream_path(uri.path());
    let user = match app.admit(&peer, needed, &headers, "proxy").await {
        Ok(user) => user,
        Err(refusal) => {
            tracing::debug!(peer = %peer.addr, path = uri.path(), %refusal, "kubelet: refused");
            return match stream {
                Some(_) => streams::refused(refusal.status(), &refusal.to_string()),
                None => text(refusal.status(), refusal.to_string()),
            };
        }
    };
    if let Some(target) = stream {
        return match target {
            Ok(target) => app.serve_stream(&user, target, request).await,
            Err(e) => streams::refused(StatusCode::NOT_FOUND, &e.to_string()),
        };
    }
    match app.serve_logs(&user, &method, &uri).await {
        Ok(response) => response,
        Err((status, message)) => text(status, message),
    }
}

/// `/stats/summary` (subresource `stats`): the kubelet's Summary API for the Pods whose runner
/// samples their usage; a Pod without a sample is left out, a figure the runner could not read
/// is absent.
async fn stats_summary(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    usage_response(&app, &peer, &method, &headers, "stats", |app| {
        let body = super::usage::summary(&app.node, &app.source.usage()).to_string();
        ("application/json", body)
    })
    .await
}

/// `/metrics/resource` (subresource `metrics`): what metrics-server scrapes, in the Prometheus
/// text format.
async fn metrics_resource(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    usage_response(&app, &peer, &method, &headers, "metrics", |app| {
        let body = super::usage::resource_metrics(&app.source.usage());
        ("text/plain; version=0.0.4", body)
    })
    .await
}

/// The caller admitted for `subresource`, then `render`'s content type and body.
async fn usage_response(
    app: &App,
    peer: &Peer,
    method: &Method,
    headers: &HeaderMap,
    subresource: &'static str,
    render: impl FnOnce(&App) -> (&'static str, String),
) -> Response {
    if let Err(refusal) = app.admit(peer, verb(method), headers, subresource).await {
        return text(refusal.status(), refusal.to_string());
    }
    let (content_type, body) = render(app);
    let mut response = Response::new(Body::from(body));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

impl App {
    /// The caller, if authenticated and allowed to `verb` this node's `subresource`.
    async fn admit(
        &self,
        peer: &Peer,
        verb: &'static str,
        headers: &HeaderMap,
        subresource: &'static str,
    ) -> Result<UserInfo, Refusal> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        let user = self
            .gate
            .authenticate(peer.certificate.as_ref(), bearer)
            .await?;
        self.gate.authorize(&user, verb, subresource).await?;
        Ok(user)
    }

    /// Checks a streaming request and answers 101 with the SPDY connection served in the
    /// background, or refuses it with a `metav1.Status` of the kubelet's status and words
    /// ([`streams::refused`]): a bad request, an unknown Pod or container, a Pod not placed, a
    /// node without a runner, a runner gone ([`Workloads::check_session`]), so that kubectl
    /// shows the refusal as it is rather than as an internal error. What the request opens (a
    /// runner session, the workload's output) is opened once the client's streams are there,
    /// and a failure to open it then is reported on the error stream, as a kubelet reports a
    /// runtime's failure.
    async fn serve_stream(
        &self,
        user: &UserInfo,
        target: StreamTarget,
        mut request: Request,
    ) -> Response {
        let pairs = match Query::<Vec<(String, String)>>::try_from_uri(request.uri()) {
            Ok(pairs) => pairs.0,
            Err(e) => {
                return streams::refused(StatusCode::BAD_REQUEST, &format!("invalid query: {e}"));
            }
        };
        let protocols = match target {
            StreamTarget::PortForward(_) => streams::PORT_FORWARD_PROTOCOLS,
            _ => streams::EXEC_PROTOCOLS,
        };
        let protocol = match streams::negotiate(request.headers(), protocols) {
            Ok(protocol) => protocol,
            Err((status, message)) => return streams::refused(status, &message),
        };
        let Some(upgrade) = request
            .extensions_mut()
            .remove::<hyper::upgrade::OnUpgrade>()
        else {
            return streams::refused(
                StatusCode::BAD_REQUEST,
                "unable to upgrade: the connection cannot be upgraded",
            );
        };
        tracing::debug!(user = user.name, ?target, protocol, "kubelet: streaming");
        // What runs on the SPDY connection once the upgrade completes.
        let serve: Box<dyn FnOnce(Connection) -> BoxFuture<'static, ()> + Send> = match target {
            StreamTarget::Exec(pod, container) => {
                let options = match ExecOptions::parse(&pairs, true) {
                    Ok(options) => options,
                    Err(message) => return streams::refused(StatusCode::BAD_REQUEST, &message),
                };
                if let Err(e) = self.source.check_session(&pod, Some(&container), "exec") {
                    return streams::refused(e.stream_status(), &e.to_string());
                }
                let request = SessionRequest::Exec {
                    command: options.command.clone(),
                    tty: options.tty,
                    stdin: options.stdin,
                };
                let source = self.source.clone();
                let open =
                    Box::pin(
                        async move { source.open_session(&pod, Some(&container), request).await },
                    );
                Box::new(move |conn| Box::pin(streams::serve_exec(conn, open, options)))
            }
            StreamTarget::Attach(pod, container) => {
                let options = match ExecOptions::parse(&pairs, false) {
                    Ok(options) => options,
                    Err(message) => return streams::refused(StatusCode::BAD_REQUEST, &message),
                };
                if let Err(e) = self.source.check_session(&pod, Some(&container), "attach") {
                    return streams::refused(e.stream_status(), &e.to_string());
                }
                let follow = neocloud_remote::callback::LogOptions {
                    follow: true,
                    tail_lines: Some(0),
                    ..Default::default()
                };
                let source = self.source.clone();
                let open = Box::pin(async move { source.logs(&pod, &container, follow).await });
                Box::new(move |conn| Box::pin(streams::serve_attach(conn, open, options)))
            }
            StreamTarget::PortForward(pod) => {
                if let Err(e) = self.source.check_session(&pod, None, "port-forward") {
                    return streams::refused(e.stream_status(), &e.to_string());
                }
                let source = self.source.clone();
                Box::new(move |conn| Box::pin(streams::serve_port_forward(conn, source, pod)))
            }
        };
        let slot = request.extensions().get::<ConnectionSlot>().cloned();
        let limits = self.streams;
        self.tasks.spawn(async move {
            let _slot = slot;
            if let Some(conn) = upgraded(upgrade, limits).await {
                serve(conn).await;
            }
        });
        streams::switching(protocol)
    }

    async fn serve_logs(
        &self,
        user: &UserInfo,
        method: &Method,
        uri: &Uri,
    ) -> Result<Response, (StatusCode, String)> {
        let (pod, container) = parse_path(uri.path()).map_err(|e| match e {
            RequestError::NotFound(_) => (StatusCode::NOT_FOUND, e.to_string()),
            other => (StatusCode::BAD_REQUEST, other.to_string()),
        })?;
        if method != Method::GET {
            let message = format!("method {method} is not allowed on {}", uri.path());
            return Err((StatusCode::METHOD_NOT_ALLOWED, message));
        }
        let pairs = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|e| (StatusCode::BAD_REQUEST, format!("invalid query: {e}")))?
            .0;
        let options = parse_query(&pairs, chrono::Utc::now())
            .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
        tracing::debug!(pod = %pod, container, user = user.name, ?options, "kubelet: logs");
        let stream = self
            .source
            .logs(&pod, &container, options)
            .await
            .map_err(|e| (e.status(), e.to_string()))?;
        Ok(plain(Body::from_stream(stream.map(Ok::<_, Infallible>))))
    }
}

/// The SPDY connection of an upgraded request; `None` (said in the log) when the upgrade failed.
async fn upgraded(upgrade: hyper::upgrade::OnUpgrade, limits: spdy::Limits) -> Option<Connection> {
    match upgrade.await {
        Ok(io) => Some(Connection::with_limits(
            hyper_util::rt::TokioIo::new(io),
            limits,
        )),
        Err(e) => {
            tracing::debug!(error = %e, "kubelet: the connection was not upgraded");
            None
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_header_gives_its_token_and_other_schemes_none() {
        assert_eq!(bearer_token("Bearer abc.def"), Some("abc.def"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic dXNlcjpwdw=="), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod server_tests;
