//! Who may read logs, decided as a kubelet decides (`--authentication-token-webhook`,
//! `--authorization-mode=Webhook`): the caller is the user of a client certificate that chained to
//! the client CA during the handshake, or of a bearer token the API server accepts in a
//! TokenReview; the user may then do what a SubjectAccessReview allows on the node's `proxy`
//! subresource (the kubelet's mapping for `/containerLogs`), `create` on it for the streaming
//! endpoints whatever the method ([`proxy_verb`]). Answers are cached for a short time so that
//! bursts of `kubectl logs -f` (or of a caller with a bad token) do not hammer the API server:
//! accepted tokens and allowed users for the configured TTL, refused tokens for a few seconds,
//! denials not at all; each cache is bounded in size.
//!
//! Not TLS (the handshake verified the certificate) and not the reviews' transport: the API
//! server's answers come through [`AccessReview`], which [`KubeAccessReview`] implements.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use moka::Expiry;
use moka::future::Cache;
use sha2::{Digest, Sha256};

/// A caller the API server knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserInfo {
    /// The user name (a certificate's common name).
    pub name: String,
    /// The user's uid, when the TokenReview gave one.
    pub uid: Option<String>,
    /// The groups (a certificate's organizations).
    pub groups: Vec<String>,
    /// Extra attributes from the TokenReview, passed on to the SubjectAccessReview.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The answer of a SubjectAccessReview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the user may.
    pub allowed: bool,
    /// The authorizer's reason, often empty when denied by RBAC.
    pub reason: String,
}

/// A review the API server could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to create a {kind}: {message}")]
pub struct ReviewError {
    /// `TokenReview` or `SubjectAccessReview`.
    pub kind: &'static str,
    /// What failed.
    pub message: String,
}

/// The API server's reviews. Both are read-only questions: calling them any number of times,
/// concurrently, changes nothing.
#[async_trait]
pub trait AccessReview: Send + Sync {
    /// Who `token` belongs to (a TokenReview with the API server's audiences); `None` when the
    /// API server does not accept it.
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError>;

    /// Whether `user` may `verb` the `subresource` (`proxy`, `stats`, `metrics`) of node `node`
    /// (a SubjectAccessReview).
    async fn review_access(
        &self,
        user: &UserInfo,
        verb: &str,
        subresource: &str,
        node: &str,
    ) -> Result<Decision, ReviewError>;
}

/// [`AccessReview`] by the API server's `tokenreviews` and `subjectaccessreviews`, which the
/// node's ClusterRole allows it to create.
#[derive(Clone)]
pub struct KubeAccessReview {
    client: kube::Client,
}

impl std::fmt::Debug for KubeAccessReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAccessReview").finish_non_exhaustive()
    }
}

impl KubeAccessReview {
    /// Reviews with `client`, the node's own identity.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl AccessReview for KubeAccessReview {
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ReviewError {
                kind: "TokenReview",
                message: e.to_string(),
            })?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        let user = status.user.unwrap_or_default();
        Ok(Some(UserInfo {
            name: user.username.unwrap_or_default(),
            uid: user.uid,
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        })
        .filter(|u| !u.name.is_empty()))
    }

    async fn review_access(
        &self,
        user: &UserInfo,
        verb: &str,
        subresource: &str,
        node: &str,
    ) -> Result<Decision, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    resource: Some("nodes".into()),
                    subresource: Some(subresource.to_owned()),
                    name: Some(node.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ReviewError {
                kind: "SubjectAccessReview",
                message: e.to_string(),
            })?;
        let status = reviewed.status.unwrap_or_default();
        Ok(Decision {
            allowed: status.allowed,
            reason: status.reason.unwrap_or_default(),
        })
    }
}

/// Why a request is refused; the message is the response body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No client certificate and no accepted bearer token.
    #[error("Unauthorized")]
    Unauthenticated,
    /// The user may not.
    #[error(
        "Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource}, node={node}){}",
        reason_suffix(.reason)
    )]
    Forbidden {
        /// The user.
        user: String,
        /// The verb asked for.
        verb: String,
        /// The node's subresource asked for.
        subresource: String,
        /// The node.
        node: String,
        /// The authorizer's reason.
        reason: String,
    },
    /// A review failed.
    #[error("authorization error: {0}")]
    Review(#[from] ReviewError),
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

impl Refusal {
    /// 401, 403 or 500.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } => StatusCode::FORBIDDEN,
            Self::Review(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The verb a request maps to, as the kubelet maps HTTP methods.
pub(crate) fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    }
}

/// The paths whose first segment opens a stream into a Pod (a command, its terminal, its
/// ports): `exec`, `attach`, `portForward`, and the kubelet's `run`, should it ever be served.
const STREAMING: &[&str] = &["exec", "attach", "portForward", "run"];

/// The verb a request on `nodes/proxy` needs: `create` for a streaming path whatever the HTTP
/// method (the API server sends exec and port-forward as GET or POST, and a GET must not be
/// enough to run a command), otherwise the method's verb. Stricter than the kubelet, which lets
/// `get nodes/proxy` (held by many monitoring ServiceAccounts) exec with a GET.
pub(crate) fn proxy_verb(method: &Method, path: &str) -> &'static str {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    if STREAMING.contains(&first) {
        "create"
    } else {
        verb(method)
    }
}

/// The most entries each cache holds; beyond it the least used go.
const MAX_CACHED: u64 = 4096;

/// How long a token the API server refused is remembered (at most the configured TTL): long
/// enough that a flood of one bad token costs one TokenReview a few seconds, short enough that
/// a token just issued is not refused for long.
const NEGATIVE_TTL: Duration = Duration::from_secs(5);

/// The lifetime of a TokenReview answer: `positive` for a user, `negative` for a refusal.
struct AnswerExpiry {
    positive: Duration,
    negative: Duration,
}

impl Expiry<[u8; 32], Option<UserInfo>> for AnswerExpiry {
    fn expire_after_create(
        &self,
        _token_hash: &[u8; 32],
        answer: &Option<UserInfo>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(if answer.is_some() {
            self.positive
        } else {
            self.negative
        })
    }
}

/// Authenticates and authorizes requests to one node, with short-lived caches of what the API
/// server answered. Tokens are cached by their SHA-256, never as themselves.
pub(crate) struct Gate {
    reviews: Arc<dyn AccessReview>,
    node: String,
    /// TokenReview answers by token hash: a user for the TTL, a refusal for [`NEGATIVE_TTL`].
    tokens: Cache<[u8; 32], Option<UserInfo>>,
    /// Allowed (user, verb, subresource); denials are not cached.
    allowed: Cache<(UserInfo, &'static str, &'static str), ()>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// A gate for `node` whose caches keep answers for `ttl` (refusals of tokens for at most
    /// [`NEGATIVE_TTL`]); a zero `ttl` keeps nothing.
    pub(crate) fn new(reviews: Arc<dyn AccessReview>, node: String, ttl: Duration) -> Self {
        let expiry = AnswerExpiry {
            positive: ttl,
            negative: ttl.min(NEGATIVE_TTL),
        };
        Self {
            reviews,
            node,
            tokens: Cache::builder()
                .max_capacity(MAX_CACHED)
                .expire_after(expiry)
                .build(),
            allowed: Cache::builder()
                .max_capacity(MAX_CACHED)
                .time_to_live(ttl.max(Duration::from_nanos(1)))
                .build(),
        }
    }

    /// The caller: the certificate's user if the handshake verified one, else the bearer
    /// token's. Concurrent requests with the same token wait for one TokenReview.
    pub(crate) async fn authenticate(
        &self,
        certificate: Option<&UserInfo>,
        bearer: Option<&str>,
    ) -> Result<UserInfo, Refusal> {
        if let Some(user) = certificate {
            return Ok(user.clone());
        }
        let token = bearer
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Unauthenticated)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let answer = self
            .tokens
            .try_get_with(key, self.reviews.review_token(token))
            .await
            .map_err(|e| Refusal::Review((*e).clone()))?;
        answer.ok_or(Refusal::Unauthenticated)
    }

    /// Whether `user` may `verb` this node's `subresource` (`proxy` for logs and streams,
    /// `stats` for `/stats/*`, `metrics` for `/metrics/*`, as the kubelet maps its paths).
    pub(crate) async fn authorize(
        &self,
        user: &UserInfo,
        verb: &'static str,
        subresource: &'static str,
    ) -> Result<(), Refusal> {
        let key = (user.clone(), verb, subresource);
        if self.allowed.get(&key).await.is_some() {
            return Ok(());
        }
        let decision = self
            .reviews
            .review_access(user, verb, subresource, &self.node)
            .await?;
        if !decision.allowed {
            return Err(Refusal::Forbidden {
                user: user.name.clone(),
                verb: verb.to_owned(),
                subresource: subresource.to_owned(),
                node: self.node.clone(),
                reason: decision.reason,
            });
        }
        self.allowed.insert(key, ()).await;
        Ok(())
    }
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
