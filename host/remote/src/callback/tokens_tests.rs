use super::*;

const UID: &str = "0b0e3c1a-7f7e-4d57-9a53-4f7a0c9d2b11";

#[test]
fn bootstrap_token_is_32_random_bytes_in_base64url() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    let a = store.issue(UID, 1).expect("issue");
    let b = store.issue("other", 1).expect("issue");
    let raw = URL_SAFE_NO_PAD.decode(a.expose()).expect("base64url");
    assert_eq!(raw.len(), 32);
    assert!(!a.expose().contains('='));
    assert_ne!(a, b);
}

#[test]
fn bootstrap_token_is_stored_only_as_a_hash() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    let token = store.issue(UID, 1).expect("issue");
    let dump = format!("{store:?}");
    assert!(!dump.contains(token.expose()));
}

#[test]
fn bootstrap_token_exchanges_once_for_its_binding() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    let token = store.issue(UID, 1).expect("issue");
    assert_eq!(store.consume(token.expose()), Ok((UID.to_string(), 1)));
}

#[test]
fn replayed_bootstrap_token_is_refused_as_replayed() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    let token = store.issue(UID, 1).expect("issue");
    store.consume(token.expose()).expect("first use");
    assert_eq!(
        store.consume(token.expose()),
        Err(TokenError::ReplayedBootstrap)
    );
}

#[test]
fn wrong_bootstrap_token_is_refused_as_unknown() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    store.issue(UID, 1).expect("issue");
    let wrong = URL_SAFE_NO_PAD.encode([7u8; 32]);
    assert_eq!(store.consume(&wrong), Err(TokenError::UnknownBootstrap));
    assert_eq!(store.consume(""), Err(TokenError::UnknownBootstrap));
}

#[test]
fn expired_bootstrap_token_is_refused_as_expired() {
    let store = BootstrapTokens::new(Duration::from_secs(60));
    let now = Instant::now();
    let token = store.issue_at(UID, 1, now).expect("issue");
    let later = now + Duration::from_secs(61);
    assert_eq!(
        store.consume_at(token.expose(), later),
        Err(TokenError::ExpiredBootstrap)
    );
}

#[test]
fn reissuing_invalidates_the_previous_bootstrap_token() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    let first = store.issue(UID, 1).expect("issue");
    let second = store.issue(UID, 1).expect("issue");
    assert_eq!(
        store.consume(first.expose()),
        Err(TokenError::UnknownBootstrap)
    );
    assert_eq!(store.consume(second.expose()), Ok((UID.to_string(), 1)));
}

#[test]
fn revoked_bootstrap_token_is_refused() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    let token = store.issue(UID, 1).expect("issue");
    store.revoke(UID);
    store.revoke(UID);
    assert_eq!(
        store.consume(token.expose()),
        Err(TokenError::UnknownBootstrap)
    );
}

#[test]
fn uid_that_cannot_be_a_spiffe_segment_is_refused() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    let err = store.issue("a/b", 1).expect_err("slash");
    assert!(matches!(err, TokenError::InvalidName { .. }));
    assert!(SessionSigner::new("bad domain", DEFAULT_SESSION_TTL).is_err());
}

#[test]
fn constant_time_eq_compares_contents_and_lengths() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"ab"));
    assert!(constant_time_eq(b"", b""));
}

fn signer() -> SessionSigner {
    SessionSigner::new("cluster.local", DEFAULT_SESSION_TTL).expect("signer")
}

#[test]
fn session_names_the_binding_spiffe_id_and_verifies() {
    let signer = signer();
    let session = signer.issue(UID, 1);
    assert_eq!(
        session.spiffe_id,
        format!("spiffe://cluster.local/neocloud/binding/{UID}")
    );
    assert_eq!(
        signer.verify(session.token.expose()),
        Ok((UID.to_string(), 1))
    );
    let claims: Claims = decode_part(session.token.expose().split('.').nth(1).expect("claims"));
    assert_eq!(claims.exp - claims.iat, 15 * 60);
    assert_eq!(claims.jti.len(), 32);
    assert_eq!(claims.rental, 1);
}

#[test]
fn a_session_from_before_rentals_were_named_reads_as_rental_zero() {
    let key = [7u8; 32];
    let signer = SessionSigner::with_key(&key, "cluster.local", DEFAULT_SESSION_TTL).unwrap();
    let claims = serde_json::json!({
        "sub": signer.spiffe_id(UID), "iat": unix_now(), "exp": unix_now() + 900, "jti": "x"
    });
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&key)).unwrap();
    assert_eq!(signer.verify(&token), Ok((UID.to_string(), 0)));
}

#[test]
fn tampered_session_is_refused_as_bad_signature() {
    let signer = signer();
    let token = signer.issue(UID, 1).token;
    let mut parts: Vec<&str> = token.expose().split('.').collect();
    let forged = encode_json(&Claims {
        sub: signer.spiffe_id("another-binding"),
        rental: 1,
        iat: unix_now(),
        exp: unix_now() + 900,
        jti: "x".into(),
    });
    parts[1] = &forged;
    assert_eq!(
        signer.verify(&parts.join(".")),
        Err(TokenError::BadSignature)
    );
}

#[test]
fn session_from_another_process_is_refused_as_bad_signature() {
    let token = signer().issue(UID, 1).token;
    assert_eq!(
        signer().verify(token.expose()),
        Err(TokenError::BadSignature)
    );
}

#[test]
fn expired_session_is_refused_after_the_skew() {
    let signer = signer();
    let now = unix_now();
    let token = signer.issue_at(UID, 1, now - 900 - 31).token;
    assert_eq!(
        signer.verify_at(token.expose(), now),
        Err(TokenError::SessionExpired)
    );
    let within_skew = signer.issue_at(UID, 1, now - 900 - 29).token;
    assert!(signer.verify_at(within_skew.expose(), now).is_ok());
}

#[test]
fn session_issued_in_the_future_is_refused() {
    let signer = signer();
    let now = unix_now();
    let token = signer.issue_at(UID, 1, now + 120).token;
    assert_eq!(
        signer.verify_at(token.expose(), now),
        Err(TokenError::SessionNotYetValid)
    );
}

#[test]
fn session_of_a_foreign_trust_domain_is_refused() {
    let key = [9u8; 32];
    let ours = SessionSigner::with_key(&key, "cluster.local", DEFAULT_SESSION_TTL).expect("ours");
    let theirs =
        SessionSigner::with_key(&key, "evil.example", DEFAULT_SESSION_TTL).expect("theirs");
    let token = theirs.issue(UID, 1).token;
    assert_eq!(
        ours.verify(token.expose()),
        Err(TokenError::ForeignTrustDomain {
            expected: "cluster.local".into()
        })
    );
}

#[test]
fn malformed_sessions_are_refused() {
    let signer = signer();
    for bad in ["", "a.b", "a.b.c.d", "!!.!!.!!", "a.b.c"] {
        let err = signer.verify(bad).expect_err(bad);
        assert!(
            matches!(err, TokenError::MalformedSession | TokenError::BadSignature),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn unsigned_alg_none_session_is_refused() {
    let signer = signer();
    let header = encode_json(&serde_json::json!({"alg": "none", "typ": "JWT"}));
    let claims = encode_json(&Claims {
        sub: signer.spiffe_id(UID),
        rental: 1,
        iat: unix_now(),
        exp: unix_now() + 900,
        jti: "x".into(),
    });
    for token in [format!("{header}.{claims}."), format!("{header}.{claims}")] {
        let refused = signer.verify(&token).expect_err("alg none");
        assert_eq!(refused, TokenError::MalformedSession, "{token}");
    }
}

#[test]
fn a_session_signed_with_another_hmac_algorithm_under_the_same_key_is_refused() {
    let key = [7u8; 32];
    let signer = SessionSigner::with_key(&key, "cluster.local", DEFAULT_SESSION_TTL).unwrap();
    let claims = Claims {
        sub: signer.spiffe_id(UID),
        rental: 1,
        iat: unix_now(),
        exp: unix_now() + 900,
        jti: "x".into(),
    };
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS512);
    let other = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&key)).unwrap();
    assert_eq!(signer.verify(&other), Err(TokenError::MalformedSession));
}

#[test]
fn a_session_without_an_expiry_is_refused() {
    let key = [7u8; 32];
    let signer = SessionSigner::with_key(&key, "cluster.local", DEFAULT_SESSION_TTL).unwrap();
    let claims = serde_json::json!({"sub": signer.spiffe_id(UID), "iat": unix_now(), "jti": "x"});
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&key)).unwrap();
    assert_eq!(signer.verify(&token), Err(TokenError::MalformedSession));
}

/// A token part: base64url JSON.
fn encode_json(value: &impl serde::Serialize) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap())
}

fn decode_part<T: serde::de::DeserializeOwned>(part: &str) -> T {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

#[test]
fn token_debug_and_errors_never_show_the_secret() {
    let store = BootstrapTokens::new(DEFAULT_BOOTSTRAP_TTL);
    let token = store.issue(UID, 1).expect("issue");
    let session = signer().issue(UID, 1);
    let shown = format!("{token:?} {session:?} {:?}", signer());
    assert!(!shown.contains(token.expose()));
    assert!(!shown.contains(session.token.expose()));
    let err = signer()
        .verify(session.token.expose())
        .expect_err("foreign");
    assert!(!err.to_string().contains(session.token.expose()));
}
