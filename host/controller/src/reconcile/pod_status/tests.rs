//! Tests of `pod_status`.

use super::*;

fn instance(ip: Option<&str>) -> neocloud_core::InstanceState {
    neocloud_core::InstanceState {
        provider: neocloud_core::ProviderId::Vast,
        id: "1".into(),
        external_name: "e".into(),
        phase: neocloud_core::InstancePhase::Running,
        provider_status: "running".into(),
        message: None,
        gpu: neocloud_core::GpuModel::from_provider("A40", None),
        gpu_count: 1,
        price_per_hour: 0.5,
        region: "r".into(),
        endpoints: Vec::new(),
        public_ip: ip.map(str::to_owned),
        created_at: None,
        interruptible: false,
        exit_code: None,
        ready: None,
    }
}

#[test]
fn the_instance_ip_becomes_the_pod_ip_and_stays_and_restarts_never_drop() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "main", "image": "i"}]}
    }))
    .unwrap();
    let want = DesiredPod::running().on(&instance(Some("203.0.113.7")), 2);
    let body = apply_body(&pod, &want, "10.0.0.1", "2026-12-04T10:00:00Z");
    assert_eq!(body["status"]["podIP"], "203.0.113.7");
    assert_eq!(body["status"]["podIPs"], json!([{"ip": "203.0.113.7"}]));
    assert_eq!(body["status"]["containerStatuses"][0]["restartCount"], 2);
    assert!(!is_current(&pod, &want));

    // A later status that knows no IP (the Pod ended) keeps it, and the count.
    let mut written = pod.clone();
    written.status = Some(serde_json::from_value(body["status"].clone()).unwrap());
    assert!(is_current(&written, &want));
    let ended = DesiredPod::failed("Error", "exited");
    let body = apply_body(&written, &ended, "10.0.0.1", "2026-12-04T10:05:00Z");
    assert_eq!(body["status"]["podIP"], "203.0.113.7");
    assert_eq!(body["status"]["containerStatuses"][0]["restartCount"], 2);

    // Something that is not an address is never written.
    let bad = DesiredPod::running().on(&instance(Some("1.2.3.4\nrm")), 0);
    assert_eq!(bad.pod_ip, None);
    let body = apply_body(&pod, &bad, "10.0.0.1", "2026-12-04T10:00:00Z");
    assert!(body["status"].get("podIP").is_none(), "{body}");
}

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"containers": [{"name": "main", "image": "cuda:12"}]}
    }))
    .unwrap()
}

fn with_status(pod: &Pod, body: &Value) -> Pod {
    let mut p = pod.clone();
    p.status = Some(serde_json::from_value(body["status"].clone()).unwrap());
    p
}

#[test]
fn a_pending_pod_says_why_in_its_reason_message_and_container() {
    let want = DesiredPod::pending("NoOffer", "no offer under $0.10/h");
    let body = apply_body(&pod(), &want, "10.0.0.1", "2026-12-03T07:00:00Z");
    let s = &body["status"];
    assert_eq!(s["phase"], "Pending");
    assert_eq!(s["reason"], "NoOffer");
    assert_eq!(
        s["containerStatuses"][0]["state"]["waiting"]["reason"],
        "NoOffer"
    );
    assert_eq!(s["conditions"][2]["status"], "False");
}

#[test]
fn a_written_status_is_current_and_a_new_reason_is_not() {
    let want = DesiredPod::pending("Planning", "choosing an offer");
    let body = apply_body(&pod(), &want, "10.0.0.1", "2026-12-03T07:00:00Z");
    let written = with_status(&pod(), &body);
    assert!(is_current(&written, &want));
    assert!(!is_current(&written, &DesiredPod::running()));
    assert!(!is_current(
        &written,
        &DesiredPod::pending("Provisioning", "renting")
    ));
    assert!(!is_current(&pod(), &want));
}

#[test]
fn a_running_container_is_ready_and_started_as_its_probes_say() {
    let probed = |ready, started| DesiredPod {
        probed: Some(Probed { ready, started }),
        ..DesiredPod::running()
    };
    let body = apply_body(
        &pod(),
        &probed(false, true),
        "10.0.0.1",
        "2026-12-03T07:00:00Z",
    );
    let s = &body["status"];
    assert_eq!(s["containerStatuses"][0]["ready"], false);
    assert_eq!(s["containerStatuses"][0]["started"], true);
    assert_eq!(s["conditions"][1]["status"], "False", "ContainersReady");
    assert_eq!(s["conditions"][2]["status"], "False", "Ready");
    let written = with_status(&pod(), &body);
    assert!(is_current(&written, &probed(false, true)));
    assert!(
        !is_current(&written, &probed(true, true)),
        "readiness changed"
    );
    assert!(
        !is_current(&written, &DesiredPod::running()),
        "no probes: ready"
    );
    let ready = apply_body(
        &written,
        &probed(true, true),
        "10.0.0.1",
        "2026-12-03T07:00:05Z",
    );
    assert_eq!(ready["status"]["conditions"][2]["status"], "True");
}

#[test]
fn running_keeps_the_start_and_transition_times_it_already_reported() {
    let first = apply_body(
        &pod(),
        &DesiredPod::running(),
        "10.0.0.1",
        "2026-12-03T07:00:00Z",
    );
    let written = with_status(&pod(), &first);
    let again = apply_body(
        &written,
        &DesiredPod::running(),
        "10.0.0.1",
        "2026-12-03T08:00:00Z",
    );
    let s = &again["status"];
    assert_eq!(
        s["containerStatuses"][0]["state"]["running"]["startedAt"],
        "2026-12-03T07:00:00Z"
    );
    assert_eq!(s["startTime"], "2026-12-03T07:00:00Z");
    assert_eq!(
        s["conditions"][2]["lastTransitionTime"],
        "2026-12-03T07:00:00Z"
    );
    assert_eq!(s["containerStatuses"][0]["ready"], true);
}

#[test]
fn a_failed_pod_reports_a_terminated_container_with_the_reason() {
    let want = DesiredPod::failed("Capacity", "gave up after 3 attempts");
    let body = apply_body(&pod(), &want, "10.0.0.1", "2026-12-03T07:00:00Z");
    let t = &body["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (t["reason"].as_str(), t["exitCode"].as_i64()),
        (Some("Capacity"), Some(1))
    );
    assert!(is_current(&with_status(&pod(), &body), &want));
}

#[test]
fn a_container_backing_off_says_crash_loop_and_keeps_its_last_state_once_running_again() {
    let last = LastState {
        exit_code: 3,
        reason: "Error".into(),
        started_at: "2026-12-05T10:00:00Z".into(),
        finished_at: "2026-12-05T10:00:02Z".into(),
    };
    let message = "back-off 10s restarting failed container=main pod=train_ml(u)";
    let waiting = DesiredPod {
        container: Container::BackOff {
            message: message.into(),
        },
        restarts: 0,
        last_state: Some(last.clone()),
        ..DesiredPod::running()
    };
    let body = apply_body(&pod(), &waiting, "10.0.0.1", "2026-12-05T10:00:03Z");
    let c = &body["status"]["containerStatuses"][0];
    assert_eq!(body["status"]["phase"], "Running");
    assert_eq!(c["ready"], false);
    assert_eq!(c["state"]["waiting"]["reason"], CRASH_LOOP);
    assert_eq!(c["state"]["waiting"]["message"], message);
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 3);
    assert_eq!(
        c["lastState"]["terminated"]["finishedAt"],
        "2026-12-05T10:00:02Z"
    );
    let written = with_status(&pod(), &body);
    assert!(is_current(&written, &waiting));

    // Restarted: running since the runner says, one restart, the last state kept.
    let running = DesiredPod {
        restarts: 1,
        started_at: Some("2026-12-05T10:00:12Z".into()),
        ..DesiredPod::running()
    };
    assert!(!is_current(&written, &running));
    let body = apply_body(&written, &running, "10.0.0.1", "2026-12-05T10:00:13Z");
    let c = &body["status"]["containerStatuses"][0];
    assert_eq!(c["state"]["running"]["startedAt"], "2026-12-05T10:00:12Z");
    assert_eq!(c["restartCount"], 1);
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 3);
    let again = with_status(&pod(), &body);
    assert!(is_current(&again, &running));
    // The next end is news.
    let next = DesiredPod {
        last_state: Some(LastState {
            finished_at: "2026-12-05T10:00:14Z".into(),
            ..last
        }),
        ..running
    };
    assert!(!is_current(&again, &next));
}
