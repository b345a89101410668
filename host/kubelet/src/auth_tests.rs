use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// Accepts the token "good" as alice; allows users in group "admins".
#[derive(Default)]
struct FakeReviews {
    token_reviews: AtomicUsize,
    access_reviews: AtomicUsize,
}

#[async_trait]
impl AccessReview for FakeReviews {
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        self.token_reviews.fetch_add(1, Ordering::SeqCst);
        Ok((token == "good").then(|| user("alice", &["admins"])))
    }

    async fn review_access(
        &self,
        user: &UserInfo,
        verb: &str,
        subresource: &str,
        node: &str,
    ) -> Result<Decision, ReviewError> {
        self.access_reviews.fetch_add(1, Ordering::SeqCst);
        assert_eq!(node, "gpu-node");
        assert_eq!(subresource, "proxy");
        Ok(Decision {
            allowed: verb == "get" && user.groups.iter().any(|g| g == "admins"),
            reason: "only admins".into(),
        })
    }
}

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        name: name.into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        ..Default::default()
    }
}

fn gate() -> (Gate, Arc<FakeReviews>) {
    let reviews = Arc::new(FakeReviews::default());
    let gate = Gate::new(reviews.clone(), "gpu-node".into(), Duration::from_secs(30));
    (gate, reviews)
}

#[tokio::test]
async fn a_caller_without_certificate_or_token_is_unauthenticated() {
    let (gate, reviews) = gate();
    assert_eq!(
        gate.authenticate(None, None).await,
        Err(Refusal::Unauthenticated)
    );
    assert_eq!(
        gate.authenticate(None, Some("")).await,
        Err(Refusal::Unauthenticated)
    );
    assert_eq!(reviews.token_reviews.load(Ordering::SeqCst), 0);
    assert_eq!(Refusal::Unauthenticated.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_certificate_user_needs_no_token_review() {
    let (gate, reviews) = gate();
    let cert = user("kube-apiserver-kubelet-client", &["system:masters"]);
    let who = gate.authenticate(Some(&cert), Some("bad")).await;
    assert_eq!(who, Ok(cert));
    assert_eq!(reviews.token_reviews.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_accepted_token_is_reviewed_once_and_a_refused_one_too() {
    let (gate, reviews) = gate();
    for _ in 0..3 {
        let who = gate.authenticate(None, Some("good")).await;
        assert_eq!(who, Ok(user("alice", &["admins"])));
    }
    assert_eq!(reviews.token_reviews.load(Ordering::SeqCst), 1);
    for _ in 0..2 {
        let who = gate.authenticate(None, Some("bad")).await;
        assert_eq!(who, Err(Refusal::Unauthenticated));
    }
    assert_eq!(reviews.token_reviews.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_flood_of_one_bad_token_costs_one_token_review() {
    let (gate, reviews) = gate();
    let gate = Arc::new(gate);
    let mut flood = Vec::new();
    for _ in 0..50 {
        let gate = gate.clone();
        flood.push(tokio::spawn(async move {
            gate.authenticate(None, Some("stolen-and-revoked")).await
        }));
    }
    for request in flood {
        assert_eq!(request.await.unwrap(), Err(Refusal::Unauthenticated));
    }
    for _ in 0..50 {
        let who = gate.authenticate(None, Some("stolen-and-revoked")).await;
        assert_eq!(who, Err(Refusal::Unauthenticated));
    }
    assert_eq!(reviews.token_reviews.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_refused_token_is_reviewed_again_once_its_refusal_expires() {
    let reviews = Arc::new(FakeReviews::default());
    let ttl = Duration::from_millis(200);
    let gate = Gate::new(reviews.clone(), "gpu-node".into(), ttl);
    for _ in 0..3 {
        let who = gate.authenticate(None, Some("bad")).await;
        assert_eq!(who, Err(Refusal::Unauthenticated));
    }
    assert_eq!(reviews.token_reviews.load(Ordering::SeqCst), 1);
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    let _ = gate.authenticate(None, Some("bad")).await;
    assert_eq!(reviews.token_reviews.load(Ordering::SeqCst), 2);
}

/// Fails every TokenReview, as an API server that does not answer.
struct FailingReviews(AtomicUsize);

#[async_trait]
impl AccessReview for FailingReviews {
    async fn review_token(&self, _token: &str) -> Result<Option<UserInfo>, ReviewError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(ReviewError {
            kind: "TokenReview",
            message: "connection refused".into(),
        })
    }

    async fn review_access(
        &self,
        _: &UserInfo,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Decision, ReviewError> {
        unreachable!("no token is accepted")
    }
}

#[tokio::test]
async fn a_review_that_failed_is_not_cached_as_a_refusal() {
    let reviews = Arc::new(FailingReviews(AtomicUsize::new(0)));
    let gate = Gate::new(reviews.clone(), "gpu-node".into(), Duration::from_secs(30));
    for _ in 0..2 {
        let refusal = gate.authenticate(None, Some("good")).await.unwrap_err();
        assert_eq!(refusal.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            refusal.to_string().contains("connection refused"),
            "{refusal}"
        );
    }
    assert_eq!(reviews.0.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_allowed_user_is_not_reviewed_again_until_the_decision_expires() {
    let reviews = Arc::new(FakeReviews::default());
    let ttl = Duration::from_millis(200);
    let gate = Gate::new(reviews.clone(), "gpu-node".into(), ttl);
    let alice = user("alice", &["admins"]);
    for _ in 0..5 {
        gate.authorize(&alice, "get", "proxy")
            .await
            .expect("allowed");
    }
    assert_eq!(reviews.access_reviews.load(Ordering::SeqCst), 1);
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    gate.authorize(&alice, "get", "proxy")
        .await
        .expect("allowed");
    assert_eq!(reviews.access_reviews.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_cache_is_keyed_by_user_groups_and_verb() {
    let (gate, reviews) = gate();
    gate.authorize(&user("alice", &["admins"]), "get", "proxy")
        .await
        .expect("allowed");
    let denied = gate.authorize(&user("alice", &[]), "get", "proxy").await;
    assert!(
        matches!(denied, Err(Refusal::Forbidden { .. })),
        "{denied:?}"
    );
    let denied = gate
        .authorize(&user("alice", &["admins"]), "create", "proxy")
        .await;
    assert!(
        matches!(denied, Err(Refusal::Forbidden { .. })),
        "{denied:?}"
    );
    assert_eq!(reviews.access_reviews.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_denial_is_never_cached_and_names_user_verb_node_and_reason() {
    let (gate, reviews) = gate();
    let bob = user("bob", &["viewers"]);
    for _ in 0..2 {
        let refusal = gate
            .authorize(&bob, "get", "proxy")
            .await
            .expect_err("denied");
        assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            refusal.to_string(),
            "Forbidden (user=bob, verb=get, resource=nodes, subresource=proxy, \
             node=gpu-node): only admins"
        );
    }
    assert_eq!(reviews.access_reviews.load(Ordering::SeqCst), 2);
}

#[test]
fn methods_map_to_the_kubelets_verbs() {
    assert_eq!(verb(&Method::GET), "get");
    assert_eq!(verb(&Method::HEAD), "get");
    assert_eq!(verb(&Method::POST), "create");
    assert_eq!(verb(&Method::DELETE), "delete");
}

#[test]
fn streaming_paths_need_create_whatever_the_method() {
    for path in [
        "/exec/ns/pod/main",
        "/attach/ns/pod/main",
        "/portForward/ns/pod",
        "/run/ns/pod/main",
        "//exec/ns/pod/main",
    ] {
        for method in [Method::GET, Method::POST, Method::HEAD, Method::PUT] {
            assert_eq!(proxy_verb(&method, path), "create", "{method} {path}");
        }
    }
    assert_eq!(
        proxy_verb(&Method::GET, "/containerLogs/ns/pod/main"),
        "get"
    );
    assert_eq!(proxy_verb(&Method::GET, "/execs/ns/pod/main"), "get");
    assert_eq!(
        proxy_verb(&Method::DELETE, "/containerLogs/ns/p/c"),
        "delete"
    );
}

#[tokio::test]
async fn a_caller_allowed_only_get_cannot_open_a_stream() {
    let (gate, _) = gate();
    let alice = user("alice", &["admins"]);
    let verb = proxy_verb(&Method::GET, "/exec/ns/pod/main");
    let refusal = gate.authorize(&alice, verb, "proxy").await.unwrap_err();
    assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
    assert!(refusal.to_string().contains("verb=create"), "{refusal}");
}

#[tokio::test]
async fn a_full_cache_stays_within_its_bound() {
    let (gate, reviews) = gate();
    let over = usize::try_from(MAX_CACHED).unwrap() + 100;
    for i in 0..over {
        let _ = gate.authenticate(None, Some(&format!("bad-{i}"))).await;
    }
    gate.tokens.run_pending_tasks().await;
    assert!(gate.tokens.entry_count() <= MAX_CACHED);
    assert_eq!(reviews.token_reviews.load(Ordering::SeqCst), over);
}
