//! A simulator of NVKE's management API, the part a burst node reads: `GET /api/clusters`, the
//! workload clusters with their `conditions.provisioning` and `conditions.provisioned`, behind a
//! JWT bearer check in Enforcing mode (a missing or wrong token is 401). It serves HTTPS with a
//! self-signed certificate for 127.0.0.1, as the TLS proxy a deployment puts in front of NVKE's
//! plain HTTP would; clients trust [`NvkeSim::ca_pem`].
//!
//! Each cluster is provisioning until its configured delay has passed, then provisioned. The
//! list's shape (`{"clusters": [{"id", "name", "kubernetesVersion", "conditions"}]}`) follows the
//! get-cluster reference quoted in `reference/nvke.md`; NVKE's OpenAPI is not available here.
//! Not a cluster provisioner: kubeconfigs are the test's business.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::Mutex;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One workload cluster.
#[derive(Debug, Clone)]
struct Cluster {
    id: String,
    name: String,
    provisioned_at: Instant,
}

struct State_ {
    token: String,
    clusters: Vec<Cluster>,
    requests: u64,
    /// Bytes of filler added to each answer (a fault: an answer too large to read).
    padding: usize,
    /// Whether answers are held back forever (a fault: an API that never answers).
    stalled: bool,
}

/// `Debug` redacts the API token.
impl std::fmt::Debug for State_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State_")
            .field("token", &"<redacted>")
            .field("clusters", &self.clusters)
            .field("requests", &self.requests)
            .finish()
    }
}

/// A running NVKE management API on 127.0.0.1.
#[derive(Debug)]
pub struct NvkeSim {
    addr: SocketAddr,
    ca_pem: String,
    state: Arc<Mutex<State_>>,
    task: JoinHandle<()>,
}

impl Drop for NvkeSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NvkeSim {
    /// Serves HTTPS on a free loopback port, accepting `Authorization: Bearer <token>`.
    pub async fn start(token: &str) -> std::io::Result<NvkeSim> {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = tcp.local_addr()?;
        let (listener, ca_pem) = TlsListener::self_signed(tcp)?;
        let state = Arc::new(Mutex::new(State_ {
            token: token.to_owned(),
            clusters: Vec::new(),
            requests: 0,
            padding: 0,
            stalled: false,
        }));
        let app = Router::new()
            .route("/api/clusters", get(list))
            .with_state(Arc::clone(&state));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(NvkeSim {
            addr,
            ca_pem,
            state,
            task,
        })
    }

    /// The API's base URL, `https://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The self-signed certificate (PEM) the API serves, which clients trust as its CA.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Adds `bytes` of filler to every answer from now on.
    pub fn set_padding(&self, bytes: usize) {
        self.state.lock().padding = bytes;
    }

    /// Holds every answer back forever from now on (or answers again, with `false`).
    pub fn set_stalled(&self, stalled: bool) {
        self.state.lock().stalled = stalled;
    }

    /// Adds a workload cluster that is provisioning for `after`, then provisioned.
    pub fn add_cluster(&self, id: &str, name: &str, after: Duration) {
        self.state.lock().clusters.push(Cluster {
            id: id.to_owned(),
            name: name.to_owned(),
            provisioned_at: Instant::now() + after,
        });
    }

    /// Accepts another token from now on (the old one is refused).
    pub fn set_token(&self, token: &str) {
        self.state.lock().token = token.to_owned();
    }

    /// How many list requests were answered (any status).
    pub fn requests(&self) -> u64 {
        self.state.lock().requests
    }
}

async fn list(State(state): State<Arc<Mutex<State_>>>, headers: HeaderMap) -> Response {
    if state.lock().stalled {
        std::future::pending::<()>().await;
    }
    let mut s = state.lock();
    s.requests += 1;
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if presented != Some(s.token.as_str()) {
        let message = if presented.is_none() {
            "missing bearer token"
        } else {
            "token rejected: signature or issuer not accepted"
        };
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"code": 401, "message": message})),
        )
            .into_response();
    }
    let now = Instant::now();
    let clusters: Vec<_> = s
        .clusters
        .iter()
        .map(|c| {
            let provisioned = now >= c.provisioned_at;
            json!({
                "id": c.id,
                "name": c.name,
                "kubernetesVersion": "1.36.3",
                "conditions": {"provisioning": !provisioned, "provisioned": provisioned},
            })
        })
        .collect();
    let padding = " ".repeat(s.padding);
    axum::Json(json!({ "clusters": clusters, "padding": padding })).into_response()
}

/// Accepts TCP connections and completes a TLS handshake on each; a failed handshake is
/// dropped and the next connection accepted.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl TlsListener {
    /// A listener serving a fresh self-signed certificate for 127.0.0.1, and that certificate.
    fn self_signed(tcp: tokio::net::TcpListener) -> std::io::Result<(Self, String)> {
        let invalid = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])
            .map_err(|e| invalid(&e))?;
        let key =
            rustls::pki_types::PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(&e))?
            .with_no_client_auth()
            .with_single_cert(vec![certified.cert.der().clone()], key.into())
            .map_err(|e| invalid(&e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Ok((Self { tcp, acceptor }, certified.cert.pem()))
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            let handshake = self.acceptor.accept(stream);
            if let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(5), handshake).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
