//! A simulator of NVKE's management API, the part a burst node reads: `GET /api/clusters`, the
//! workload clusters with their `conditions.provisioning` and `conditions.provisioned`, behind a
//! JWT bearer check in Enforcing mode (a missing or wrong token is 401).
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
    state: Arc<Mutex<State_>>,
    task: JoinHandle<()>,
}

impl Drop for NvkeSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NvkeSim {
    /// Serves on a free loopback port, accepting `Authorization: Bearer <token>`.
    pub async fn start(token: &str) -> std::io::Result<NvkeSim> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State_ {
            token: token.to_owned(),
            clusters: Vec::new(),
            requests: 0,
        }));
        let app = Router::new()
            .route("/api/clusters", get(list))
            .with_state(Arc::clone(&state));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(NvkeSim { addr, state, task })
    }

    /// The API's base URL (`http://127.0.0.1:<port>`; NVKE serves plain HTTP).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
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
    axum::Json(json!({ "clusters": clusters })).into_response()
}
