//! The Lambda Cloud simulator over real HTTP: instance types and capacity, strict launch
//! validation, statuses, terminate, rate limiting, quota, auth, preemption and the ledger.

mod common;

use common::{call, client, distinct, poll_until};
use neocloud_cloudsim::config::DEFAULT_SSH_KEY;
use neocloud_cloudsim::{LambdaSim, RateLimit, SimConfig};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn sim() -> LambdaSim {
    LambdaSim::start(SimConfig::fast()).await.unwrap()
}

fn launch_body(name: &str) -> Value {
    json!({"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": [DEFAULT_SSH_KEY],
           "name": name, "tags": [{"key": "vk-pod-uid", "value": "123"}], "user_data": "#cloud-config\n"})
}

async fn launch(sim: &LambdaSim, body: &Value) -> (StatusCode, Value) {
    let url = format!("{}/instance-operations/launch", sim.base_url());
    call(client().post(url).bearer_auth(sim.api_key()).json(body)).await
}

async fn get(sim: &LambdaSim, id: &str) -> (StatusCode, Value) {
    call(
        client()
            .get(format!("{}/instances/{id}", sim.base_url()))
            .bearer_auth(sim.api_key()),
    )
    .await
}

async fn terminate(sim: &LambdaSim, ids: &[&str]) -> (StatusCode, Value) {
    let url = format!("{}/instance-operations/terminate", sim.base_url());
    call(
        client()
            .post(url)
            .bearer_auth(sim.api_key())
            .json(&json!({"instance_ids": ids})),
    )
    .await
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn instance_types_list_only_regions_with_capacity() {
    let sim = sim().await;
    let url = format!("{}/instance-types", sim.base_url());
    let (status, body) = call(client().get(url).bearer_auth(sim.api_key())).await;
    assert_eq!(status, StatusCode::OK);
    let a10 = &body["data"]["gpu_1x_a10"];
    assert_eq!(a10["instance_type"]["price_cents_per_hour"], 75);
    let regions: Vec<&str> = a10["regions_with_capacity_available"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(regions, vec!["us-east-1", "us-west-1"]);
    assert_eq!(
        body["data"]["gpu_1x_gh200"]["regions_with_capacity_available"],
        json!([])
    );
}

#[tokio::test]
async fn a_launched_instance_boots_then_becomes_active_with_its_name_and_tags() {
    let sim = LambdaSim::start(common::observable()).await.unwrap();
    let (status, body) = launch(&sim, &launch_body("vk-1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["data"]["instance_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let seen = poll_until(
        || async { get(&sim, &id).await.1["data"]["status"].clone() },
        |s| s == "active",
    )
    .await;
    assert_eq!(distinct(seen), vec![json!("booting"), json!("active")]);
    let (_, body) = get(&sim, &id).await;
    assert_eq!(body["data"]["name"], "vk-1");
    assert_eq!(
        body["data"]["tags"],
        json!([{"key": "vk-pod-uid", "value": "123"}])
    );
    assert!(body["data"]["ip"].is_string());
    let (_, list) = call(
        client()
            .get(format!("{}/instances", sim.base_url()))
            .bearer_auth(sim.api_key()),
    )
    .await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn launch_rejects_bad_bodies_with_invalid_parameters_naming_the_field() {
    let sim = sim().await;
    let cases = [
        ("bogus", json!({"bogus": 1})),
        ("region_name", json!({"region_name": null})),
        ("ssh_key_names", json!({"ssh_key_names": ["a", "b"]})),
        ("name", json!({"name": "n".repeat(65)})),
        ("tags", json!({"tags": [{"key": "Bad", "value": "x"}]})),
        ("hostname", json!({"hostname": "-bad"})),
        ("quantity", json!({"quantity": "one"})),
    ];
    for (field, patch) in cases {
        let mut body = launch_body("v");
        for (key, value) in patch.as_object().unwrap() {
            if value.is_null() {
                body.as_object_mut().unwrap().remove(key);
            } else {
                body[key] = value.clone();
            }
        }
        let (status, answer) = launch(&sim, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {answer}");
        assert_eq!(error_code(&answer), "global/invalid-parameters", "{field}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("'{field}'")),
            "{field}: {answer}"
        );
    }
    assert!(sim.ledger().entries.is_empty());
}

#[tokio::test]
async fn launch_with_an_unregistered_ssh_key_is_object_does_not_exist() {
    let sim = sim().await;
    let mut body = launch_body("v");
    body["ssh_key_names"] = json!(["nope"]);
    let (status, answer) = launch(&sim, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&answer), "global/object-does-not-exist");
}

#[tokio::test]
async fn launches_beyond_capacity_fail_with_insufficient_capacity_until_one_is_terminated() {
    let sim = sim().await;
    let mut body = launch_body("h");
    body["instance_type_name"] = json!("gpu_1x_h100_sxm5");
    let (_, first) = launch(&sim, &body).await;
    let id = first["data"]["instance_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let (status, answer) = launch(&sim, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        error_code(&answer),
        "instance-operations/launch/insufficient-capacity"
    );
    assert_eq!(
        answer["error"]["message"],
        "Not enough capacity to fulfill launch request."
    );
    assert_eq!(terminate(&sim, &[&id]).await.0, StatusCode::OK);
    assert_eq!(launch(&sim, &body).await.0, StatusCode::OK);
}

#[tokio::test]
async fn terminate_moves_to_terminating_then_the_instance_is_gone_and_unbilled() {
    let sim = sim().await;
    let (_, body) = launch(&sim, &launch_body("t")).await;
    let id = body["data"]["instance_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = terminate(&sim, &[&id]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["data"]["terminated_instances"][0]["status"],
        "terminating"
    );
    let cost = sim.ledger().entries[0].cost_usd;
    poll_until(
        || async { json!(get(&sim, &id).await.0.as_u16()) },
        |s| s == 404,
    )
    .await;
    let (_, body) = get(&sim, &id).await;
    assert_eq!(error_code(&body), "global/object-does-not-exist");
    let (status, body) = terminate(&sim, &[&id]).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::NOT_FOUND, "global/object-does-not-exist")
    );
    let ledger = sim.ledger();
    assert!(ledger.live().is_empty());
    assert_eq!(
        ledger.entries[0].cost_usd, cost,
        "nothing is billed after termination"
    );
}

#[tokio::test]
async fn launches_are_rate_limited_to_one_per_window_with_retry_after() {
    let config = SimConfig {
        launch_rate_limit: RateLimit {
            max_requests: 1,
            window_ms: 12_000,
        },
        ..SimConfig::fast()
    };
    let sim = LambdaSim::start(config).await.unwrap();
    assert_eq!(launch(&sim, &launch_body("a")).await.0, StatusCode::OK);
    let url = format!("{}/instance-operations/launch", sim.base_url());
    let response = client()
        .post(url)
        .bearer_auth(sim.api_key())
        .json(&launch_body("b"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=12).contains(&retry), "retry-after {retry}");
    assert_eq!(sim.ledger().entries.len(), 1);
}

#[tokio::test]
async fn the_quota_stops_launches_with_quota_exceeded() {
    let sim = LambdaSim::start(SimConfig {
        quota: Some(1),
        ..SimConfig::fast()
    })
    .await
    .unwrap();
    assert_eq!(launch(&sim, &launch_body("a")).await.0, StatusCode::OK);
    let (status, body) = launch(&sim, &launch_body("b")).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::BAD_REQUEST, "global/quota-exceeded")
    );
}

#[tokio::test]
async fn a_wrong_key_is_invalid_api_key_and_basic_auth_with_the_key_works() {
    let sim = sim().await;
    let url = format!("{}/instances", sim.base_url());
    let (status, body) = call(client().get(&url).bearer_auth("wrong")).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNAUTHORIZED, "global/invalid-api-key")
    );
    let (status, _) = call(client().get(&url).basic_auth(sim.api_key(), Some(""))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_preempted_instance_reports_preempted_and_stops_billing() {
    let sim = sim().await;
    let (_, body) = launch(&sim, &launch_body("p")).await;
    let id = body["data"]["instance_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert!(sim.preempt(&id));
    assert_eq!(get(&sim, &id).await.1["data"]["status"], "preempted");
    let billed = sim.ledger().entries[0].billed_seconds;
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    assert_eq!(sim.ledger().entries[0].billed_seconds, billed);
    assert_eq!(
        sim.ledger().live().len(),
        1,
        "preempted instances still need a terminate"
    );
}

/// A stand-in runner: records its arguments and pid, then sleeps until killed.
fn fake_runner(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("fake-runner");
    let body = format!(
        "#!/bin/sh\necho $$ > {dir}/pid\necho \"$@\" > {dir}/args.tmp && mv {dir}/args.tmp {dir}/args\nexec sleep 30\n",
        dir = dir.display()
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

fn runner_launch_body() -> Value {
    let user_data = "#cloud-config\nruncmd:\n  - [systemd-run, --unit=r, /usr/local/bin/neocloud-runner, --callback-url, 'https://node:8443']\n";
    let mut body = launch_body("nc-runner");
    body["user_data"] = json!(user_data);
    body
}

async fn wait_for(path: &std::path::Path, present: bool) -> bool {
    for _ in 0..100 {
        if path.exists() == present {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn user_data_runner_starts_when_active_and_dies_with_the_instance() {
    let dir = tempfile::tempdir().unwrap();
    let config = SimConfig::fast().with_user_data_runner(fake_runner(dir.path()));
    let sim = LambdaSim::start(config).await.unwrap();
    let (status, body) = launch(&sim, &runner_launch_body()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["data"]["instance_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        wait_for(&dir.path().join("args"), true).await,
        "runner started"
    );
    let (_, instance) = get(&sim, &id).await;
    assert_eq!(instance["data"]["status"], "active");
    let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
    assert_eq!(args.trim(), "--callback-url https://node:8443");
    let pid = std::fs::read_to_string(dir.path().join("pid")).unwrap();
    let proc_dir = std::path::PathBuf::from(format!("/proc/{}", pid.trim()));
    assert!(proc_dir.exists(), "runner alive while the instance is");
    let (status, _) = terminate(&sim, &[&id]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        wait_for(&proc_dir, false).await,
        "runner killed with its instance"
    );
}

#[tokio::test]
async fn user_data_runs_nothing_unless_opted_in() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = SimConfig::fast();
    config.runner_binary = Some(fake_runner(dir.path()));
    let sim = LambdaSim::start(config).await.unwrap();
    let (status, _) = launch(&sim, &runner_launch_body()).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert!(!dir.path().join("pid").exists());
}
