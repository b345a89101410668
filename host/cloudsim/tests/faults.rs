//! Every fault kind over real HTTP, armed through the admin API, the Rust API or a scenario
//! file, with the ledger proving what was (and was not) created.

mod common;

use std::time::{Duration, Instant};

use common::{call, client};
use neocloud_cloudsim::{
    CloudSim, CloudSimConfig, FaultKind, FaultRule, LambdaSim, RunpodSim, SimConfig, VastSim,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn a40(name: &str) -> Value {
    json!({"name": name, "image": "img", "gpu": {"id": "NVIDIA A40", "count": 1}})
}

async fn create_pod(sim: &RunpodSim, name: &str) -> reqwest::Result<reqwest::Response> {
    let url = format!("{}/v2/pods", sim.base_url());
    client()
        .post(url)
        .bearer_auth(sim.api_key())
        .json(&a40(name))
        .send()
        .await
}

async fn list_pod_names(sim: &RunpodSim) -> Vec<String> {
    let url = format!("{}/v2/pods", sim.base_url());
    let (_, body) = call(client().get(url).bearer_auth(sim.api_key())).await;
    body["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

async fn arm(admin_url: &str, rule: Value) {
    let (status, body) = call(client().post(format!("{admin_url}/faults")).json(&rule)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn a_lost_response_closes_the_connection_after_the_pod_is_created() {
    let sim = RunpodSim::start(SimConfig::fast()).await.unwrap();
    arm(
        &sim.admin_url(),
        json!({"route": "POST /v2/pods", "count": 1, "fault": {"kind": "lost_response"}}),
    )
    .await;
    let error = create_pod(&sim, "lost")
        .await
        .expect_err("no response arrives");
    assert!(!error.is_status(), "{error}");
    assert_eq!(
        list_pod_names(&sim).await,
        vec!["lost"],
        "the pod exists and can be found by name"
    );
    let ledger = sim.ledger();
    assert_eq!(ledger.named("lost").len(), 1, "created exactly once");
    assert!(ledger.duplicate_live_names().is_empty());
    assert_eq!(
        create_pod(&sim, "next").await.unwrap().status(),
        StatusCode::CREATED,
        "the fault was used up"
    );
}

#[tokio::test]
async fn an_error_after_create_returns_5xx_but_the_instance_exists() {
    let sim = VastSim::start(SimConfig::fast()).await.unwrap();
    sim.add_fault(FaultRule::next(
        "PUT /api/v0/asks/{id}/",
        1,
        FaultKind::ErrorAfterCreate { status: 502 },
    ));
    let ask = sim.offers()[0].id;
    let url = format!("{}/api/v0/asks/{ask}/", sim.base_url());
    let (status, _) = call(
        client()
            .put(url)
            .bearer_auth(sim.api_key())
            .json(&json!({"image": "x", "label": "vk-5xx"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let filters = json!({"label": {"eq": "vk-5xx"}}).to_string();
    let list = format!("{}/api/v1/instances/", sim.base_url());
    let (_, body) = call(
        client()
            .get(list)
            .bearer_auth(sim.api_key())
            .query(&[("select_filters", filters)]),
    )
    .await;
    assert_eq!(body["instances"].as_array().unwrap().len(), 1);
    assert_eq!(sim.ledger().live().len(), 1);
}

#[tokio::test]
async fn a_server_error_creates_nothing_and_uses_the_provider_error_body() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    sim.add_fault(FaultRule::next(
        "POST /api/v1/instance-operations/launch",
        1,
        FaultKind::ServerError { status: 503 },
    ));
    let url = format!("{}/instance-operations/launch", sim.base_url());
    let body = json!({"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["sim-ssh-key"]});
    let (status, answer) = call(client().post(&url).bearer_auth(sim.api_key()).json(&body)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer["error"]["code"], "provider/internal-unavailable");
    assert!(sim.ledger().entries.is_empty());
    assert_eq!(
        call(client().post(&url).bearer_auth(sim.api_key()).json(&body))
            .await
            .0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn rate_limited_requests_get_429_with_retry_after_in_each_dialect() {
    let sim = CloudSim::start(CloudSimConfig::default()).await.unwrap();
    let limited = FaultRule {
        route: None,
        count: Some(1),
        fault: FaultKind::RateLimited {
            retry_after_secs: 7,
        },
    };
    let urls = [
        (
            sim.runpod.add_fault(limited.clone()),
            format!("{}/v2/pods", sim.runpod.base_url()),
            sim.runpod.api_key(),
        ),
        (
            sim.lambda.add_fault(limited.clone()),
            format!("{}/instances", sim.lambda.base_url()),
            sim.lambda.api_key(),
        ),
        (
            sim.vast.add_fault(limited.clone()),
            format!("{}/api/v1/instances/", sim.vast.base_url()),
            sim.vast.api_key(),
        ),
    ];
    let mut bodies = Vec::new();
    for (_, url, key) in urls {
        let response = client().get(url).bearer_auth(key).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], "7");
        bodies.push(response.json::<Value>().await.unwrap());
    }
    assert_eq!(
        bodies[0]["detail"],
        "rate limit exceeded for the minute window"
    );
    assert_eq!(bodies[1]["error"]["code"], "global/rate-limited");
    assert_eq!(
        bodies[2]["detail"],
        "API requests too frequent endpoint threshold=4.5"
    );
}

#[tokio::test]
async fn a_slow_fault_delays_the_response() {
    let sim = RunpodSim::start(SimConfig::fast()).await.unwrap();
    sim.add_fault(FaultRule::next(
        "GET /v2/pods",
        1,
        FaultKind::Slow { delay_ms: 300 },
    ));
    let started = Instant::now();
    let url = format!("{}/v2/pods", sim.base_url());
    assert_eq!(
        call(client().get(&url).bearer_auth(sim.api_key())).await.0,
        StatusCode::OK
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    // It delayed its one request and is spent: no later request meets it.
    let armed = sim.faults();
    assert!(armed.is_empty(), "{armed:?}");
}

#[tokio::test]
async fn capacity_exhausted_gives_each_providers_capacity_error_and_rents_nothing() {
    let sim = CloudSim::start(CloudSimConfig::default()).await.unwrap();
    for rule_route in [
        "POST /v2/pods",
        "POST /api/v1/instance-operations/launch",
        "PUT /api/v0/asks/{id}/",
    ] {
        let rule = FaultRule::next(rule_route, 1, FaultKind::CapacityExhausted);
        sim.runpod.add_fault(rule.clone());
        sim.lambda.add_fault(rule.clone());
        sim.vast.add_fault(rule);
    }
    let (status, body) = call(create_pod_request(&sim.runpod)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with("There are no longer any instances")
    );
    let launch = json!({"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["sim-ssh-key"]});
    let url = format!("{}/instance-operations/launch", sim.lambda.base_url());
    let (_, body) = call(
        client()
            .post(url)
            .bearer_auth(sim.lambda.api_key())
            .json(&launch),
    )
    .await;
    assert_eq!(
        body["error"]["code"],
        "instance-operations/launch/insufficient-capacity"
    );
    let url = format!(
        "{}/api/v0/asks/{}/",
        sim.vast.base_url(),
        sim.vast.offers()[0].id
    );
    let (status, body) = call(
        client()
            .put(url)
            .bearer_auth(sim.vast.api_key())
            .json(&json!({"image": "x"})),
    )
    .await;
    assert_eq!(
        (
            status,
            body["msg"].as_str().unwrap().contains("no_such_ask")
        ),
        (StatusCode::NOT_FOUND, true)
    );
    assert!(sim.ledger().entries.is_empty());
}

fn create_pod_request(sim: &RunpodSim) -> reqwest::RequestBuilder {
    client()
        .post(format!("{}/v2/pods", sim.base_url()))
        .bearer_auth(sim.api_key())
        .json(&a40("c"))
}

#[tokio::test]
async fn an_offer_that_vanishes_between_search_and_rental_is_410_and_leaves_search() {
    let sim = VastSim::start(SimConfig::fast()).await.unwrap();
    let ask = sim.offers()[2].id;
    arm(
        &sim.admin_url(),
        json!({"route": "PUT /api/v0/asks/{id}/", "count": 1, "fault": {"kind": "offer_vanishes"}}),
    )
    .await;
    let url = format!("{}/api/v0/asks/{ask}/", sim.base_url());
    let body = json!({"image": "x", "cancel_unavail": true});
    let (status, answer) = call(client().put(url).bearer_auth(sim.api_key()).json(&body)).await;
    assert_eq!(
        (status, answer["error"].clone()),
        (StatusCode::GONE, json!("no_such_ask"))
    );
    let (_, found) = call(
        client()
            .post(format!("{}/api/v0/bundles/", sim.base_url()))
            .json(&json!({"id": {"eq": ask}})),
    )
    .await;
    assert_eq!(found["offers"], json!([]));
    assert!(sim.ledger().entries.is_empty());
}

#[tokio::test]
async fn a_forced_low_bid_on_vast_leaves_a_stopped_instance_to_destroy() {
    let sim = VastSim::start(SimConfig::fast()).await.unwrap();
    let offer = sim.offers()[0].clone();
    sim.add_fault(FaultRule::next(
        "PUT /api/v0/asks/{id}/",
        1,
        FaultKind::BidTooLow,
    ));
    let url = format!("{}/api/v0/asks/{}/", sim.base_url(), offer.id);
    let body = json!({"image": "x", "price": offer.config.price_per_hour});
    let (status, answer) = call(client().put(url).bearer_auth(sim.api_key()).json(&body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let id = answer["new_contract"].as_u64().unwrap();
    assert_eq!(sim.ledger().live()[0].instance_id, id.to_string());
}

#[tokio::test]
async fn the_admin_api_lists_counts_down_and_clears_faults() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    let admin = sim.admin_url();
    arm(&admin, json!({"route": "GET /api/v1/instances", "count": 2, "fault": {"kind": "server_error", "status": 500}})).await;
    let url = format!("{}/instances", sim.base_url());
    assert_eq!(
        call(client().get(&url).bearer_auth(sim.api_key())).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let (_, armed) = call(client().get(format!("{admin}/faults"))).await;
    assert_eq!(
        (armed[0]["count"].clone(), armed[0]["hits"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(
        call(client().delete(format!("{admin}/faults"))).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(client().get(&url).bearer_auth(sim.api_key())).await.0,
        StatusCode::OK
    );
    let (status, _) = call(
        client()
            .post(format!("{admin}/faults"))
            .json(&json!({"fault": {"kind": "nope"}})),
    )
    .await;
    assert!(status.is_client_error());
}

#[tokio::test]
async fn the_admin_ledger_reports_live_instances_duplicates_and_cost() {
    let sim = RunpodSim::start(SimConfig::fast()).await.unwrap();
    for _ in 0..2 {
        assert_eq!(
            create_pod(&sim, "twin").await.unwrap().status(),
            StatusCode::CREATED
        );
    }
    let (status, ledger) = call(client().get(format!("{}/ledger", sim.admin_url()))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ledger["live"], 2);
    assert_eq!(ledger["duplicate_live_names"], json!(["twin"]));
    assert_eq!(ledger["entries"][0]["price_per_hour"], 0.40);
    assert!(ledger["total_cost_usd"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn a_scenario_file_arms_faults_and_sets_the_market_at_start() {
    let yaml = r#"
runpod:
  api_key: rp-key
  faults:
    - route: POST /v2/pods
      count: 1
      fault: {kind: capacity_exhausted}
vast:
  timing: {provisioning_ms: 10, starting_ms: 10, terminating_ms: 10}
  offers:
    - {id: 42, gpu: GTX 1070, region: "Oslo, NO", price_per_hour: 0.05, capacity: 1}
"#;
    let dir = std::env::temp_dir().join(format!("cloudsim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("scenario.yaml");
    std::fs::write(&path, yaml).unwrap();
    let sim = CloudSim::start(CloudSimConfig::from_file(&path).unwrap())
        .await
        .unwrap();
    assert_eq!(sim.runpod.api_key(), "rp-key");
    assert_eq!(sim.runpod.faults().len(), 1);
    assert_eq!(
        call(create_pod_request(&sim.runpod)).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        sim.vast.offers().iter().map(|o| o.id).collect::<Vec<_>>(),
        vec![42]
    );
    assert!(
        CloudSimConfig::from_yaml("vast: {bogus: 1}").is_err(),
        "unknown fields are rejected"
    );
}

#[tokio::test]
async fn a_failed_instance_shows_each_providers_never_ready_status_and_stays_billed() {
    let sim = CloudSim::start(CloudSimConfig::default()).await.unwrap();
    let (_, pod) = call(create_pod_request(&sim.runpod)).await;
    let pod_id = pod["id"].as_str().unwrap().to_string();
    let launch = json!({"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["sim-ssh-key"]});
    let url = format!("{}/instance-operations/launch", sim.lambda.base_url());
    let (_, launched) = call(
        client()
            .post(url)
            .bearer_auth(sim.lambda.api_key())
            .json(&launch),
    )
    .await;
    let lambda_id = launched["data"]["instance_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!(
        "{}/api/v0/asks/{}/",
        sim.vast.base_url(),
        sim.vast.offers()[0].id
    );
    let (_, rented) = call(
        client()
            .put(url)
            .bearer_auth(sim.vast.api_key())
            .json(&json!({"image": "x"})),
    )
    .await;
    let vast_id = rented["new_contract"].as_u64().unwrap();
    for (admin, id) in [
        (sim.runpod.admin_url(), pod_id.clone()),
        (sim.lambda.admin_url(), lambda_id.clone()),
        (sim.vast.admin_url(), vast_id.to_string()),
    ] {
        assert_eq!(
            call(client().post(format!("{admin}/instances/{id}/fail")))
                .await
                .0,
            StatusCode::NO_CONTENT
        );
    }
    let get = |url: String, key: &str| client().get(url).bearer_auth(key.to_string());
    let (_, pod) = call(get(
        format!("{}/v2/pods/{pod_id}", sim.runpod.base_url()),
        sim.runpod.api_key(),
    ))
    .await;
    assert_eq!(pod["status"], "ERROR");
    let (_, instance) = call(get(
        format!("{}/instances/{lambda_id}", sim.lambda.base_url()),
        sim.lambda.api_key(),
    ))
    .await;
    assert_eq!(instance["data"]["status"], "unhealthy");
    let (_, instance) = call(get(
        format!("{}/api/v0/instances/{vast_id}/", sim.vast.base_url()),
        sim.vast.api_key(),
    ))
    .await;
    assert_eq!(instance["instances"]["actual_status"], "exited");
    assert_eq!(
        sim.ledger().live().len(),
        3,
        "broken instances are billed until deleted"
    );
    assert!(!sim.vast.fail("1"), "unknown ids are refused");
}
