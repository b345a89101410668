use super::*;

const HOST: &str = "127.0.0.1";

fn stored(data: &BTreeMap<String, Vec<u8>>, rotate: bool) -> Option<Stored<'_>> {
    Some(Stored { data, rotate })
}

fn created(tls_host: Option<&str>) -> RunnerIdentity {
    match plan(None, tls_host).expect("plan") {
        Plan::Create(identity) => identity,
        other => panic!("expected Create, got {other:?}"),
    }
}

#[test]
fn a_missing_secret_is_created_with_a_key_and_a_certificate_for_the_host() {
    let identity = created(Some(HOST));
    let data = identity.to_data();
    assert_eq!(data[KEY].len(), 32);
    assert_eq!(data[TLS_HOST], HOST.as_bytes());
    assert!(String::from_utf8_lossy(&data[TLS_CERT]).contains("BEGIN CERTIFICATE"));
    assert!(identity.tls().expect("tls").check().is_ok());
    let without_tls = created(None).to_data();
    assert_eq!(without_tls.keys().collect::<Vec<_>>(), vec![KEY]);
}

#[test]
fn a_stored_identity_is_used_as_is_by_every_replica() {
    let data = created(Some(HOST)).to_data();
    let first = match plan(stored(&data, false), Some(HOST)).unwrap() {
        Plan::Use(identity) => identity,
        other => panic!("expected Use, got {other:?}"),
    };
    let second = RunnerIdentity::from_data(&data).unwrap();
    assert_eq!(first.keys().key_id(), second.keys().key_id());
    assert_eq!(first.to_data(), data);
    assert_eq!(
        first.tls().unwrap().cert_pem(),
        second.tls().unwrap().cert_pem()
    );
}

#[test]
fn the_rotation_annotation_replaces_key_and_certificate() {
    let data = created(Some(HOST)).to_data();
    let old = RunnerIdentity::from_data(&data).unwrap();
    let Plan::Replace { identity, why } = plan(stored(&data, true), Some(HOST)).unwrap() else {
        panic!("expected Replace");
    };
    assert!(why.contains("rotation"), "{why}");
    assert_ne!(identity.keys().key_id(), old.keys().key_id());
    assert_ne!(
        identity.tls().unwrap().cert_pem(),
        old.tls().unwrap().cert_pem()
    );
}

#[test]
fn a_certificate_for_another_host_is_remade_and_the_key_kept() {
    let data = created(Some("old.example")).to_data();
    let Plan::Replace { identity, why } = plan(stored(&data, false), Some(HOST)).unwrap() else {
        panic!("expected Replace");
    };
    assert!(why.contains("another host"), "{why}");
    assert_eq!(identity.to_data()[KEY], data[KEY]);
    assert_eq!(identity.to_data()[TLS_HOST], HOST.as_bytes());
}

#[test]
fn with_certificate_files_a_stored_certificate_is_left_alone() {
    let data = created(Some(HOST)).to_data();
    assert!(matches!(
        plan(stored(&data, false), None).unwrap(),
        Plan::Use(_)
    ));
}

#[test]
fn a_damaged_secret_is_an_error_naming_the_data_key_not_its_value() {
    let good = created(Some(HOST)).to_data();
    let mut short = good.clone();
    short.insert(KEY.into(), b"secret-bytes".to_vec());
    let mut no_key = good.clone();
    no_key.remove(KEY);
    let mut half_tls = good.clone();
    half_tls.remove(TLS_KEY);
    let mut bad_pem = good.clone();
    bad_pem.insert(
        TLS_KEY.into(),
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n".to_vec(),
    );
    for (data, key, problem) in [
        (short, KEY, "must be 32 bytes, not 12"),
        (no_key, KEY, "is missing"),
        (half_tls, TLS_CERT, "all or none"),
        (bad_pem, TLS_CERT, "private key"),
    ] {
        let err = plan(stored(&data, false), Some(HOST)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(key) && text.contains(problem), "{text}");
        assert!(
            !text.contains("secret-bytes") && !text.contains("AAAA"),
            "{text}"
        );
    }
}

#[test]
fn identity_debug_shows_no_key_material() {
    let identity = created(Some(HOST));
    let shown = format!("{identity:?}");
    let data = identity.to_data();
    assert!(shown.contains(identity.keys().key_id()), "{shown}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    assert!(!shown.contains(&hex::encode(&data[KEY])), "{shown}");
}
