//! The RunPod simulator over real HTTP: REST v2 validation, statuses, capacity, actions,
//! delete, catalog, auth; GraphQL spot pods, errors with HTTP 200, and preemption.

mod common;

use common::{call, client, distinct, poll_until};
use neocloud_cloudsim::{RunpodSim, SimConfig};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn sim() -> RunpodSim {
    RunpodSim::start(SimConfig::fast()).await.unwrap()
}

fn pod_body(name: &str) -> Value {
    json!({"name": name, "image": "runpod/pytorch:1.0.2", "gpu": {"id": "NVIDIA A40", "count": 1},
           "cloud": "SECURE", "dataCenterIds": ["CA-MTL-1"], "disk": 50, "env": {"K": "V"},
           "ports": ["22/tcp", "8888/http"], "startSsh": true})
}

async fn create(sim: &RunpodSim, body: &Value) -> (StatusCode, Value) {
    call(
        client()
            .post(format!("{}/v2/pods", sim.base_url()))
            .bearer_auth(sim.api_key())
            .json(body),
    )
    .await
}

async fn get(sim: &RunpodSim, id: &str) -> (StatusCode, Value) {
    call(
        client()
            .get(format!("{}/v2/pods/{id}", sim.base_url()))
            .bearer_auth(sim.api_key()),
    )
    .await
}

async fn gql(sim: &RunpodSim, query: &str) -> (StatusCode, Value) {
    let url = format!("{}/graphql", sim.base_url());
    call(
        client()
            .post(url)
            .bearer_auth(sim.api_key())
            .json(&json!({"query": query})),
    )
    .await
}

#[tokio::test]
async fn a_pod_goes_provisioning_starting_running_and_gets_runtime_only_when_running() {
    let sim = RunpodSim::start(common::observable()).await.unwrap();
    let (status, pod) = create(&sim, &pod_body("vk-1")).await;
    assert_eq!(status, StatusCode::CREATED, "{pod}");
    assert_eq!(pod["status"], "PROVISIONING");
    assert_eq!(pod["runtime"], Value::Null);
    assert_eq!(pod["ssh"]["direct"], Value::Null);
    let id = pod["id"].as_str().unwrap().to_string();
    let seen = poll_until(
        || async { get(&sim, &id).await.1["status"].clone() },
        |s| s == "RUNNING",
    )
    .await;
    assert_eq!(
        distinct(seen),
        vec![json!("PROVISIONING"), json!("STARTING"), json!("RUNNING")]
    );
    let (_, running) = get(&sim, &id).await;
    assert!(running["runtime"]["ports"].is_array());
    assert!(running["ssh"]["direct"]["port"].is_number());
    assert_eq!(running["cost"], 0.40);
    assert_eq!(running["dataCenterId"], "CA-MTL-1");
}

#[tokio::test]
async fn unknown_missing_and_mistyped_fields_get_422_problem_json_naming_them() {
    let sim = sim().await;
    let mut body = pod_body("x");
    body["bogus"] = json!(1);
    body["gpu"]["count"] = json!("2");
    body.as_object_mut().unwrap().remove("name");
    let url = format!("{}/v2/pods", sim.base_url());
    let response = client()
        .post(url)
        .bearer_auth(sim.api_key())
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["status"], 422);
    let errors: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        errors.contains(&"$: additional properties 'bogus' not allowed"),
        "{errors:?}"
    );
    assert!(errors.contains(&"$: missing property 'name'"), "{errors:?}");
    assert!(
        errors.contains(&"$.gpu.count: got string, want integer"),
        "{errors:?}"
    );
    assert!(sim.ledger().entries.is_empty());
}

#[tokio::test]
async fn cross_field_rules_are_400s() {
    let sim = sim().await;
    let mut both = pod_body("x");
    both["cpu"] = json!({"id": "cpu3c"});
    let (status, body) = create(&sim, &both).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["detail"].as_str().unwrap().contains("'gpu' or 'cpu'"));
    let mut mounts = pod_body("x");
    mounts["mounts"] = json!({"network": [{"volumeId": "v", "path": "/a"}], "persistent": {"size": 20, "path": "/b"}});
    assert_eq!(create(&sim, &mounts).await.0, StatusCode::BAD_REQUEST);
    let mut zone = pod_body("x");
    zone["dataCenterIds"] = json!(["CA-MTL-1", "XX-NOPE-1"]);
    let (status, body) = create(&sim, &zone).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["errors"][0]
            .as_str()
            .unwrap()
            .starts_with("$.dataCenterIds[1]")
    );
}

#[tokio::test]
async fn asking_for_more_gpus_than_are_free_is_a_400_recognised_by_its_text() {
    let sim = sim().await;
    let mut body = pod_body("big");
    body["gpu"]["count"] = json!(7);
    let (status, problem) = create(&sim, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .starts_with("There are no longer any instances available")
    );
    assert!(problem.get("errors").is_none());
}

#[tokio::test]
async fn delete_is_204_then_404_and_billing_stops_at_termination() {
    let sim = sim().await;
    let id = create(&sim, &pod_body("d")).await.1["id"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!("{}/v2/pods/{id}", sim.base_url());
    assert_eq!(
        call(client().delete(&url).bearer_auth(sim.api_key()))
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(get(&sim, &id).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        call(client().delete(&url).bearer_auth(sim.api_key()))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    let cost = sim.ledger().entries[0].cost_usd;
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    let entry = &sim.ledger().entries[0];
    assert!(!entry.is_live());
    assert_eq!(entry.cost_usd, cost);
}

#[tokio::test]
async fn stop_exits_the_pod_with_zero_cost_and_a_second_stop_conflicts() {
    let sim = sim().await;
    let id = create(&sim, &pod_body("s")).await.1["id"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!("{}/v2/pods/{id}/action", sim.base_url());
    let stop = json!({"action": "stop"});
    let (status, pod) = call(client().post(&url).bearer_auth(sim.api_key()).json(&stop)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (pod["status"].clone(), pod["cost"].clone()),
        (json!("EXITED"), json!(0.0))
    );
    assert_eq!(
        call(client().post(&url).bearer_auth(sim.api_key()).json(&stop))
            .await
            .0,
        StatusCode::CONFLICT
    );
    let (status, _) = call(
        client()
            .post(&url)
            .bearer_auth(sim.api_key())
            .json(&json!({"action": "start"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(
        client()
            .post(&url)
            .bearer_auth(sim.api_key())
            .json(&json!({"action": "fly"})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn the_catalog_needs_product_with_availability_and_reports_it_per_gpu() {
    let sim = sim().await;
    let base = format!("{}/v2/catalog/gpus", sim.base_url());
    let (status, _) = call(
        client()
            .get(format!("{base}?include=AVAILABILITY"))
            .bearer_auth(sim.api_key()),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = call(
        client()
            .get(format!("{base}?include=AVAILABILITY&product=POD"))
            .bearer_auth(sim.api_key()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let gpus = body["gpus"].as_array().unwrap();
    let l4 = gpus.iter().find(|g| g["id"] == "NVIDIA L4").unwrap();
    assert_eq!(l4["availability"], "NONE");
    let h100 = gpus
        .iter()
        .find(|g| g["id"] == "NVIDIA H100 80GB HBM3")
        .unwrap();
    assert_eq!(h100["availability"], "HIGH");
    assert_eq!(h100["price"]["secure"], 2.99);
}

#[tokio::test]
async fn a_missing_or_wrong_bearer_token_is_401() {
    let sim = sim().await;
    let url = format!("{}/v2/pods", sim.base_url());
    let (status, body) = call(client().get(&url)).await;
    assert_eq!(
        (status, body["detail"].clone()),
        (StatusCode::UNAUTHORIZED, json!("missing bearer token"))
    );
    assert_eq!(
        call(client().get(&url).bearer_auth("nope")).await.0,
        StatusCode::UNAUTHORIZED
    );
}

const RENT: &str = r#"mutation { podRentInterruptable(input: {name: "spot-1", imageName: "img", gpuTypeId: "NVIDIA H100 80GB HBM3",
    cloudType: SECURE, gpuCount: 1, bidPerGpu: BID, env: [{key: "K", value: "V"}], ports: "22/tcp"}) { id desiredStatus podType costPerHr env machine { podHostId } } }"#;

#[tokio::test]
async fn a_spot_pod_is_rented_through_graphql_at_its_bid() {
    let sim = sim().await;
    let (status, body) = gql(&sim, &RENT.replace("BID", "1.8")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let pod = &body["data"]["podRentInterruptable"];
    assert_eq!(pod["podType"], "INTERRUPTABLE");
    assert_eq!(pod["costPerHr"], 1.8);
    assert_eq!(pod["env"], json!(["K=V"]));
    assert_eq!(
        pod.as_object().unwrap().len(),
        6,
        "only the six selected fields: {pod}"
    );
    let (_, listed) = gql(&sim, "query { myself { pods { id name desiredStatus } } }").await;
    assert_eq!(listed["data"]["myself"]["pods"][0]["name"], "spot-1");
    assert!(sim.ledger().entries[0].spot);
}

#[tokio::test]
async fn a_bid_too_low_is_an_error_with_http_200_and_creates_nothing() {
    let sim = sim().await;
    let (status, body) = gql(&sim, &RENT.replace("BID", "0.1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["data"]["podRentInterruptable"], Value::Null);
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("minimum bid")
    );
    assert_eq!(body["errors"][0]["path"], json!(["podRentInterruptable"]));
    assert!(sim.ledger().entries.is_empty());
}

#[tokio::test]
async fn graphql_rejects_unknown_input_fields_and_terminating_an_unknown_pod_is_an_error() {
    let sim = sim().await;
    let (status, body) = gql(&sim, &RENT.replace("BID", "1.8, bogus: 1")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("\"bogus\"")
    );
    let (status, body) = gql(&sim, r#"mutation { podTerminate(input: {podId: "nope"}) }"#).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["errors"][0]["message"], "pod not found to terminate");
}

#[tokio::test]
async fn a_preempted_spot_pod_shows_exited_in_graphql_and_v2() {
    let sim = sim().await;
    let (_, body) = gql(&sim, &RENT.replace("BID", "1.8")).await;
    let id = body["data"]["podRentInterruptable"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!("{}/instances/{id}/preempt", sim.admin_url());
    assert_eq!(call(client().post(url)).await.0, StatusCode::NO_CONTENT);
    let query = format!(
        r#"query {{ pod(input: {{podId: "{id}"}}) {{ desiredStatus runtime {{ uptimeInSeconds }} }} }}"#
    );
    let (_, body) = gql(&sim, &query).await;
    assert_eq!(
        body["data"]["pod"],
        json!({"desiredStatus": "EXITED", "runtime": null})
    );
    assert_eq!(get(&sim, &id).await.1["status"], "EXITED");
}

#[tokio::test]
async fn spot_pods_are_preempted_after_the_configured_delay() {
    let config = SimConfig {
        preempt_spot_after_ms: Some(300),
        ..SimConfig::fast()
    };
    let sim = RunpodSim::start(config).await.unwrap();
    let (_, body) = gql(&sim, &RENT.replace("BID", "1.8")).await;
    let id = body["data"]["podRentInterruptable"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let seen = poll_until(
        || async { get(&sim, &id).await.1["status"].clone() },
        |s| s == "EXITED",
    )
    .await;
    assert!(
        seen.contains(&json!("RUNNING")),
        "it ran before it was preempted: {seen:?}"
    );
    let billed = sim.ledger().entries[0].billed_seconds;
    assert!(
        (0.39..0.5).contains(&billed),
        "billed {billed}s: boot 0.1 s + 0.3 s running"
    );
}

#[tokio::test]
async fn graphql_accepts_the_api_key_query_parameter() {
    let sim = sim().await;
    let url = format!("{}/graphql?api_key={}", sim.base_url(), sim.api_key());
    let (status, body) = call(
        client()
            .post(url)
            .json(&json!({"query": "{ myself { pods { id } } }"})),
    )
    .await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({"data": {"myself": {"pods": []}}}))
    );
}

#[tokio::test]
async fn authenticated_responses_carry_ratelimit_headers_and_rejected_ones_do_not() {
    let sim = sim().await;
    let url = format!("{}/v2/pods", sim.base_url());
    let ok = client()
        .get(&url)
        .bearer_auth(sim.api_key())
        .send()
        .await
        .unwrap();
    assert!(
        ok.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"minute\";r=")
    );
    assert!(
        ok.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("q=60;w=60")
    );
    let denied = client().get(&url).send().await.unwrap();
    assert!(denied.headers().get("ratelimit").is_none());
}

async fn pod_action(sim: &RunpodSim, id: &str, action: &str) -> (StatusCode, Value) {
    let url = format!("{}/v2/pods/{id}/action", sim.base_url());
    call(
        client()
            .post(url)
            .bearer_auth(sim.api_key())
            .json(&json!({"action": action})),
    )
    .await
}

#[tokio::test]
async fn a_start_command_runner_runs_while_the_pod_runs_with_its_env() {
    use common::{fake_container_runner, recorded_runner, runner_script, wait_for_path};
    let dir = tempfile::tempdir().unwrap();
    let config = SimConfig::fast().with_user_data_runner(fake_container_runner(dir.path()));
    let sim = RunpodSim::start(config).await.unwrap();
    let script = runner_script(&["--callback-url", "https://node:8443", "--name", "pod a"]);
    let mut body = pod_body("nc-runner");
    body["args"] = json!(shlex::try_join(["sh", "-c", script.as_str()]).unwrap());
    body["env"] = json!({"NEOCLOUD_BOOTSTRAP_TOKEN": "tok en", "NEOCLOUD_RUNNER_CREDENTIAL": "c"});
    let (status, pod) = create(&sim, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{pod}");
    let id = pod["id"].as_str().unwrap().to_string();
    let args_file = dir.path().join("args");
    assert!(wait_for_path(&args_file, true).await, "runner started");
    assert_eq!(get(&sim, &id).await.1["status"], "RUNNING");
    let (proc_dir, args, token, env) = recorded_runner(dir.path());
    assert_eq!(
        args,
        ["--callback-url", "https://node:8443", "--name", "pod a"]
    );
    assert_eq!(token, "tok en");
    assert!(
        env.lines().any(|l| l == "NEOCLOUD_RUNNER_CREDENTIAL=c"),
        "{env}"
    );
    assert!(proc_dir.exists(), "runner alive while the pod runs");

    // Stopping the pod kills it; starting it again runs the start command again.
    assert_eq!(pod_action(&sim, &id, "stop").await.0, StatusCode::OK);
    assert!(
        wait_for_path(&proc_dir, false).await,
        "runner killed on stop"
    );
    std::fs::remove_file(&args_file).unwrap();
    assert_eq!(pod_action(&sim, &id, "start").await.0, StatusCode::OK);
    assert!(
        wait_for_path(&args_file, true).await,
        "runner started again"
    );
    let (proc_dir, ..) = recorded_runner(dir.path());
    assert!(proc_dir.exists());

    let url = format!("{}/v2/pods/{id}", sim.base_url());
    let (status, _) = call(client().delete(&url).bearer_auth(sim.api_key())).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(
        wait_for_path(&proc_dir, false).await,
        "runner killed with its pod"
    );
}

#[tokio::test]
async fn a_pod_s_own_start_command_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let runner = common::fake_container_runner(dir.path());
    let sim = RunpodSim::start(SimConfig::fast().with_user_data_runner(runner))
        .await
        .unwrap();
    let mut body = pod_body("own");
    body["args"] = json!("python -m http.server 8888");
    let (status, pod) = create(&sim, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{pod}");
    let id = pod["id"].as_str().unwrap().to_string();
    poll_until(
        || async { get(&sim, &id).await.1["status"].clone() },
        |s| s == "RUNNING",
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!dir.path().join("pid").exists());
}
