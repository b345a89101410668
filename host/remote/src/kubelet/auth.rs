//! Who may read logs, decided as a kubelet decides (`--authentication-token-webhook`,
//! `--authorization-mode=Webhook`): the caller is the user of a client certificate that chained to
//! the client CA during the handshake, or of a bearer token the API server accepts in a
//! TokenReview; the user may then do what a SubjectAccessReview allows on the node's `proxy`
//! subresource (the kubelet's mapping for `/containerLogs`). Positive answers of both reviews are
//! cached for a short time so that the bursts of `kubectl logs -f` do not hammer the API server.
//!
//! Not TLS (the handshake verified the certificate) and not the reviews' transport: the API
//! server's answers come through [`AccessReview`], which [`KubeAccessReview`] implements.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// The most entries a cache holds; beyond it, expired entries go, then all.
const MAX_CACHED: usize = 4096;

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

/// Authenticates and authorizes requests to one node, with short-lived caches of what the API
/// server accepted.
pub(crate) struct Gate {
    reviews: Arc<dyn AccessReview>,
    node: String,
    tokens: TtlCache<[u8; 32], UserInfo>,
    allowed: TtlCache<(UserInfo, &'static str, &'static str), ()>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Gate {
    pub(crate) fn new(reviews: Arc<dyn AccessReview>, node: String, ttl: Duration) -> Self {
        Self {
            reviews,
            node,
            tokens: TtlCache::new(ttl),
            allowed: TtlCache::new(ttl),
        }
    }

    /// The caller: the certificate's user if the handshake verified one, else the bearer
    /// token's.
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
        if let Some(user) = self.tokens.get(&key) {
            return Ok(user);
        }
        let user = self
            .reviews
            .review_token(token)
            .await?
            .ok_or(Refusal::Unauthenticated)?;
        self.tokens.insert(key, user.clone());
        Ok(user)
    }

    /// Whether `user` may `verb` this node's `subresource` (`proxy` for logs, `stats` for
    /// `/stats/*`, `metrics` for `/metrics/*`, as the kubelet maps its paths).
    pub(crate) async fn authorize(
        &self,
        user: &UserInfo,
        verb: &'static str,
        subresource: &'static str,
    ) -> Result<(), Refusal> {
        let key = (user.clone(), verb, subresource);
        if self.allowed.get(&key).is_some() {
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
        self.allowed.insert(key, ());
        Ok(())
    }
}

/// A map whose entries expire `ttl` after they were inserted.
pub(crate) struct TtlCache<K, V> {
    ttl: Duration,
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The value, if inserted less than `ttl` ago.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock();
        let (value, at) = entries.get(key)?;
        (at.elapsed() < self.ttl).then(|| value.clone())
    }

    pub(crate) fn insert(&self, key: K, value: V) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_CACHED {
            entries.retain(|_, (_, at)| at.elapsed() < self.ttl);
            if entries.len() >= MAX_CACHED {
                entries.clear();
            }
        }
        entries.insert(key, (value, Instant::now()));
    }
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
