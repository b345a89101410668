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

/// What the memory store holds: data, the rotation ask, the version.
type Held = (BTreeMap<String, Vec<u8>>, bool, u64);

/// A store in memory, with another replica that may write between a read and a write.
#[derive(Default)]
struct Memory {
    stored: parking_lot::Mutex<Option<Held>>,
    /// Writes of another replica, applied one per write of ours, just before it.
    rivals: parking_lot::Mutex<Vec<BTreeMap<String, Vec<u8>>>>,
    writes: std::sync::atomic::AtomicUsize,
    broken: bool,
}

impl Memory {
    fn rival_writes_first(&self) {
        let next = self.rivals.lock().pop();
        if let Some(data) = next {
            let mut stored = self.stored.lock();
            let version = stored.as_ref().map_or(0, |s| s.2 + 1);
            *stored = Some((data, false, version));
        }
    }
}

impl IdentityStore for Memory {
    type Version = u64;

    async fn read(&self) -> Result<Option<Found<u64>>, StoreError> {
        if self.broken {
            return Err(StoreError::Failed("connection refused".into()));
        }
        Ok(self
            .stored
            .lock()
            .clone()
            .map(|(data, rotate, version)| Found {
                data,
                rotate,
                version,
            }))
    }

    async fn create(&self, data: BTreeMap<String, Vec<u8>>) -> Result<(), StoreError> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.rival_writes_first();
        let mut stored = self.stored.lock();
        if stored.is_some() {
            return Err(StoreError::Conflict);
        }
        *stored = Some((data, false, 0));
        Ok(())
    }

    async fn replace(
        &self,
        version: u64,
        data: BTreeMap<String, Vec<u8>>,
    ) -> Result<(), StoreError> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.rival_writes_first();
        let mut stored = self.stored.lock();
        match stored.as_ref() {
            Some((_, _, now)) if *now == version => {
                *stored = Some((data, false, version + 1));
                Ok(())
            }
            _ => Err(StoreError::Conflict),
        }
    }
}

#[tokio::test]
async fn a_replica_that_loses_the_race_to_create_uses_what_won() {
    let store = Memory::default();
    let theirs = created(Some(HOST)).to_data();
    store.rivals.lock().push(theirs.clone());
    let ours = load_or_create(&store, Some(HOST)).await.expect("loaded");
    assert_eq!(ours.to_data(), theirs, "the winner's identity is used");
    assert_eq!(store.writes.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The next start reads it and writes nothing.
    let again = load_or_create(&store, Some(HOST)).await.expect("loaded");
    assert_eq!(again.to_data(), theirs);
    assert_eq!(store.writes.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn rotation_replaces_the_key_once_and_drops_the_ask() {
    let store = Memory::default();
    let old = created(Some(HOST)).to_data();
    *store.stored.lock() = Some((old.clone(), true, 7));
    let new = load_or_create(&store, Some(HOST)).await.expect("rotated");
    assert_ne!(new.to_data()[KEY], old[KEY]);
    let stored = store.stored.lock().clone().expect("stored");
    assert_eq!((stored.0, stored.1, stored.2), (new.to_data(), false, 8));
}

#[tokio::test]
async fn a_store_that_keeps_changing_or_fails_is_an_error_without_the_data() {
    // Rotation is asked at every read, and another replica writes before each of our writes:
    // every round loses its race.
    let store = Memory::default();
    let rival = created(None).to_data();
    *store.stored.lock() = Some((rival.clone(), true, 0));
    for _ in 0..ROUNDS {
        store.rivals.lock().push(rival.clone());
    }
    struct Rotating(Memory);
    impl IdentityStore for Rotating {
        type Version = u64;
        async fn read(&self) -> Result<Option<Found<u64>>, StoreError> {
            let found = self.0.read().await?;
            Ok(found.map(|f| Found { rotate: true, ..f }))
        }
        async fn create(&self, data: BTreeMap<String, Vec<u8>>) -> Result<(), StoreError> {
            self.0.create(data).await
        }
        async fn replace(&self, v: u64, data: BTreeMap<String, Vec<u8>>) -> Result<(), StoreError> {
            self.0.replace(v, data).await
        }
    }
    let err = load_or_create(&Rotating(store), None).await.unwrap_err();
    assert_eq!(err, IdentityError::StillChanging(ROUNDS));

    let broken = Memory {
        broken: true,
        ..Memory::default()
    };
    let err = load_or_create(&broken, None).await.unwrap_err();
    assert_eq!(err.to_string(), "failed to read it: connection refused");
}
