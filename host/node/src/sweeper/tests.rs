//! Tests of `sweeper`.

use super::*;
use neocloud_core::GpuModel;

const PREFIX: &str = "ncn-test-";

fn instance(name: &str, created_at: Option<DateTime<Utc>>) -> InstanceState {
    InstanceState {
        provider: ProviderId::Runpod,
        id: "pod-1".into(),
        external_name: name.into(),
        phase: InstancePhase::Running,
        provider_status: "RUNNING".into(),
        message: None,
        gpu: GpuModel::Unknown {
            provider_name: "A40".into(),
            reported_memory_gib: None,
        },
        gpu_count: 1,
        price_per_hour: 0.4,
        region: "CA-MTL-1".into(),
        endpoints: vec![],
        public_ip: None,
        created_at,
        interruptible: false,
        exit_code: None,
        ready: None,
    }
}

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
}

fn bound(names: &[&str]) -> HashSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

const GRACE: Duration = Duration::from_secs(600);

#[test]
fn an_unbound_instance_older_than_the_grace_period_is_an_orphan() {
    let i = instance("ncn-test-a", Some(at(0)));
    let v = judge(
        &i,
        PREFIX,
        &bound(&["ncn-test-b"]),
        at(1000),
        at(600),
        GRACE,
    );
    assert_eq!(v, Verdict::Orphan);
}

#[test]
fn an_unbound_instance_younger_than_the_grace_period_is_kept() {
    let i = instance("ncn-test-a", Some(at(1)));
    let v = judge(&i, PREFIX, &bound(&[]), at(1000), at(600), GRACE);
    assert_eq!(v, Verdict::InGrace);
}

#[test]
fn a_bound_instance_is_kept_however_old() {
    let i = instance("ncn-test-a", Some(at(-100_000)));
    let v = judge(
        &i,
        PREFIX,
        &bound(&["ncn-test-a"]),
        at(0),
        at(0),
        Duration::ZERO,
    );
    assert_eq!(v, Verdict::Bound);
}

#[test]
fn an_instance_created_after_the_binding_list_is_kept_even_with_no_grace() {
    let i = instance("ncn-test-a", Some(at(5)));
    let v = judge(&i, PREFIX, &bound(&[]), at(5), at(4), Duration::ZERO);
    assert_eq!(v, Verdict::InGrace);
    let v = judge(&i, PREFIX, &bound(&[]), at(5), at(5), Duration::ZERO);
    assert_eq!(
        v,
        Verdict::Orphan,
        "created at the list instant is before it"
    );
}

#[test]
fn without_a_creation_time_the_age_runs_from_first_sight() {
    let i = instance("ncn-test-a", None);
    let v = judge(&i, PREFIX, &bound(&[]), at(0), at(599), GRACE);
    assert_eq!(v, Verdict::InGrace);
    let v = judge(&i, PREFIX, &bound(&[]), at(0), at(600), GRACE);
    assert_eq!(v, Verdict::Orphan);
}

#[test]
fn instances_without_our_prefix_or_already_terminated_are_not_ours() {
    let other = instance("ncn-testx-a", Some(at(0)));
    let v = judge(&other, PREFIX, &bound(&[]), at(0), at(10_000), GRACE);
    assert_eq!(v, Verdict::NotOurs);
    let mut gone = instance("ncn-test-a", Some(at(0)));
    gone.phase = InstancePhase::Terminated;
    let v = judge(&gone, PREFIX, &bound(&[]), at(0), at(10_000), GRACE);
    assert_eq!(v, Verdict::NotOurs);
}

#[test]
fn first_sight_is_remembered_and_forgotten_when_an_instance_is_gone() {
    let map = Mutex::new(HashMap::new());
    let seen_now = |instances: &[InstanceState]| {
        let now = Utc::now();
        let mut seen = map.lock().unwrap();
        remember(&mut seen, ProviderId::Runpod, instances, now)
    };
    let mut a = instance("ncn-test-a", None);
    a.id = "a".into();
    let first = seen_now(std::slice::from_ref(&a));
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(seen_now(std::slice::from_ref(&a)), first);
    seen_now(&[]);
    assert!(map.lock().unwrap().is_empty());
    assert!(seen_now(std::slice::from_ref(&a))[0] > first[0]);
}

#[test]
fn the_config_reads_humane_names_and_defaults() {
    let c: SweeperConfig =
        serde_json::from_str(r#"{"intervalSeconds": 60, "dryRun": true}"#).unwrap();
    assert_eq!(c.interval, Duration::from_secs(60));
    assert_eq!(c.grace, Duration::from_secs(600));
    assert!(c.dry_run);
    let d: SweeperConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(d, SweeperConfig::default());
    assert_eq!(d.interval, Duration::from_secs(300));
}

#[test]
fn bad_configs_are_refused_by_field() {
    let e = serde_json::from_str::<SweeperConfig>(r#"{"intervalSeconds": 0}"#).unwrap_err();
    assert!(e.to_string().contains("sweeper.intervalSeconds: 0"), "{e}");
    let e = serde_json::from_str::<SweeperConfig>(r#"{"grace": 5}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `grace`"), "{e}");
}
