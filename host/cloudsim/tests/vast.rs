//! The Vast.ai simulator over real HTTP: search, rental, statuses, spot bids, pagination,
//! destroy, auth, and the ledger.

mod common;

use common::{call, client, distinct, poll_until};
use neocloud_cloudsim::{SimConfig, VastSim};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn sim() -> VastSim {
    VastSim::start(SimConfig::fast()).await.unwrap()
}

async fn search(sim: &VastSim, query: Value) -> (StatusCode, Value) {
    call(
        client()
            .post(format!("{}/api/v0/bundles/", sim.base_url()))
            .json(&query),
    )
    .await
}

async fn rent(sim: &VastSim, ask: u64, body: Value) -> (StatusCode, Value) {
    let url = format!("{}/api/v0/asks/{ask}/", sim.base_url());
    call(client().put(url).bearer_auth(sim.api_key()).json(&body)).await
}

async fn instance(sim: &VastSim, id: u64) -> Value {
    let url = format!("{}/api/v0/instances/{id}/?owner=me", sim.base_url());
    call(client().get(url).bearer_auth(sim.api_key())).await.1["instances"].clone()
}

fn offer_id(sim: &VastSim, gpu: &str) -> u64 {
    sim.offers()
        .iter()
        .find(|o| o.config.gpu == gpu)
        .unwrap()
        .id
}

#[tokio::test]
async fn search_filters_by_gpu_price_and_country_and_orders_by_price() {
    let sim = sim().await;
    let query = json!({"gpu_name": {"in": ["RTX 4090"]}, "num_gpus": {"eq": 1}, "dph_total": {"lte": 0.5},
        "geolocation": {"in": ["US", "CA"]}, "verified": {"eq": true}, "order": [["dph_total", "asc"]]});
    let (status, body) = search(&sim, query).await;
    assert_eq!(status, StatusCode::OK);
    let offers = body["offers"].as_array().unwrap();
    let prices: Vec<f64> = offers
        .iter()
        .map(|o| o["dph_total"].as_f64().unwrap())
        .collect();
    assert_eq!(prices, vec![0.38, 0.40]);
    assert!(
        offers
            .iter()
            .all(|o| o["gpu_name"] == "RTX 4090" && o["rentable"] == true)
    );
}

#[tokio::test]
async fn search_of_type_bid_prices_offers_at_their_minimum_bid() {
    let sim = sim().await;
    let (_, body) = search(
        &sim,
        json!({"gpu_name": {"eq": "H100 SXM"}, "num_gpus": {"eq": 1}, "type": "bid"}),
    )
    .await;
    let offer = &body["offers"][0];
    assert_eq!(offer["dph_total"], offer["min_bid"]);
    assert_eq!(offer["is_bid"], true);
}

#[tokio::test]
async fn search_rejects_an_unknown_field_naming_it() {
    let sim = sim().await;
    let (status, body) = search(&sim, json!({"gpu_nmae": {"eq": "RTX 4090"}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_request");
    assert!(
        body["msg"].as_str().unwrap().contains("'gpu_nmae'"),
        "{body}"
    );
}

#[tokio::test]
async fn a_rented_instance_goes_from_null_to_loading_to_running_under_its_label() {
    let sim = VastSim::start(common::observable()).await.unwrap();
    let ask = offer_id(&sim, "A100 SXM4");
    let body = json!({"client_id": "me", "image": "pytorch/pytorch", "disk": 40, "label": "vk-a",
        "env": {"KEY": "VAL", "-p 8080:8080": "1"}, "onstart": "echo hi", "runtype": "ssh_direct"});
    let (status, created) = rent(&sim, ask, body).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    assert_eq!(created["success"], true);
    let id = created["new_contract"].as_u64().unwrap();
    let seen = poll_until(
        || async { instance(&sim, id).await["actual_status"].clone() },
        |s| s == "running",
    )
    .await;
    assert_eq!(
        distinct(seen),
        vec![Value::Null, json!("loading"), json!("running")]
    );
    let running = instance(&sim, id).await;
    assert_eq!(running["label"], "vk-a");
    assert_eq!(running["extra_env"], json!([["KEY", "VAL"]]));
    assert!(running["ports"]["22/tcp"][0]["HostPort"].is_string());
}

#[tokio::test]
async fn a_create_with_an_unknown_field_is_rejected_naming_it_and_rents_nothing() {
    let sim = sim().await;
    let ask = offer_id(&sim, "A100 SXM4");
    let (status, body) = rent(&sim, ask, json!({"image": "x", "lable": "typo"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_args");
    assert!(body["msg"].as_str().unwrap().contains("'lable'"), "{body}");
    let (_, body) = rent(&sim, ask, json!({"image": "x", "runtype": "bogus"})).await;
    assert!(
        body["msg"].as_str().unwrap().contains("'runtype'"),
        "{body}"
    );
    assert!(sim.ledger().entries.is_empty());
}

#[tokio::test]
async fn renting_a_taken_offer_answers_404_3603_or_410_3907_with_cancel_unavail() {
    let sim = sim().await;
    let ask = offer_id(&sim, "A100 SXM4");
    assert_eq!(
        rent(&sim, ask, json!({"image": "x"})).await.0,
        StatusCode::OK
    );
    let (status, body) = rent(&sim, ask, json!({"image": "x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["msg"]
            .as_str()
            .unwrap()
            .starts_with("error 404/3603: no_such_ask"),
        "{body}"
    );
    let (status, body) = rent(&sim, ask, json!({"image": "x", "cancel_unavail": true})).await;
    assert_eq!(status, StatusCode::GONE);
    assert_eq!(body["error"], "no_such_ask");
    assert!(body["msg"].as_str().unwrap().starts_with("error 410/3907"));
    assert_eq!(sim.ledger().entries.len(), 1);
}

#[tokio::test]
async fn a_bid_below_the_minimum_creates_a_stopped_instance_whose_id_is_in_the_error() {
    let sim = sim().await;
    let ask = offer_id(&sim, "H100 SXM");
    let (status, body) = rent(
        &sim,
        ask,
        json!({"image": "x", "label": "spot", "price": 0.01}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["success"], false);
    let id = body["new_contract"]
        .as_u64()
        .expect("error carries new_contract");
    let stopped = instance(&sim, id).await;
    for field in [
        "actual_status",
        "intended_status",
        "cur_state",
        "next_state",
    ] {
        assert_eq!(stopped[field], "stopped", "{field}");
    }
    let ledger = sim.ledger();
    assert_eq!(
        ledger.live().len(),
        1,
        "the stopped instance is live until destroyed"
    );
    assert_eq!(ledger.entries[0].billed_seconds, 0.0);
    let url = format!("{}/api/v0/instances/{id}/", sim.base_url());
    assert_eq!(
        call(client().delete(url).bearer_auth(sim.api_key()))
            .await
            .0,
        StatusCode::OK
    );
    assert!(sim.ledger().live().is_empty());
}

#[tokio::test]
async fn a_bid_at_the_minimum_rents_an_interruptible_instance() {
    let sim = sim().await;
    let offer = sim
        .offers()
        .into_iter()
        .find(|o| o.config.gpu == "H100 SXM")
        .unwrap();
    let bid = offer.min_bid().unwrap();
    let (status, body) = rent(&sim, offer.id, json!({"image": "x", "price": bid})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let entry = &sim.ledger().entries[0];
    assert!(entry.spot);
    assert_eq!(entry.price_per_hour, bid);
}

async fn list_page(sim: &VastSim, query: &[(&str, String)]) -> (StatusCode, Value) {
    let url = format!("{}/api/v1/instances/", sim.base_url());
    call(client().get(url).bearer_auth(sim.api_key()).query(query)).await
}

async fn list_all(sim: &VastSim, filters: Option<Value>) -> (Vec<u64>, usize) {
    let (mut ids, mut pages, mut token) = (Vec::new(), 0, None::<String>);
    loop {
        let mut query = vec![("limit", "25".to_string())];
        if let Some(filters) = &filters {
            query.push(("select_filters", filters.to_string()));
        }
        if let Some(token) = &token {
            query.push(("after_token", json!(token).to_string()));
        }
        let (status, body) = list_page(sim, &query).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        pages += 1;
        ids.extend(
            body["instances"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_u64().unwrap()),
        );
        match body["next_token"].as_str() {
            Some(next) => token = Some(next.to_string()),
            None => return (ids, pages),
        }
    }
}

#[tokio::test]
async fn listing_follows_next_token_past_one_page_until_it_is_null() {
    let sim = sim().await;
    let seeded = sim.seed_instances(60, "vk-");
    let (ids, pages) = list_all(&sim, None).await;
    assert_eq!(pages, 3);
    assert_eq!(ids, seeded);
    let (ids, _) = list_all(&sim, Some(json!({"label": {"eq": "vk-7"}}))).await;
    assert_eq!(ids, vec![seeded[7]]);
}

#[tokio::test]
async fn listing_one_thousand_instances_takes_forty_pages_and_returns_each_once() {
    let sim = sim().await;
    let seeded = sim.seed_instances(1_000, "bench-");
    let (ids, pages) = list_all(&sim, None).await;
    assert_eq!(pages, 40);
    assert_eq!(ids, seeded);
}

#[tokio::test]
async fn list_limits_are_capped_at_25_and_non_positive_means_5_and_bad_tokens_are_400() {
    let sim = sim().await;
    sim.seed_instances(30, "x");
    let (_, body) = list_page(&sim, &[("limit", "100".into())]).await;
    assert_eq!(body["instances"].as_array().unwrap().len(), 25);
    assert_eq!(body["total_instances"], 30);
    let (_, body) = list_page(&sim, &[("limit", "0".into())]).await;
    assert_eq!(body["instances"].as_array().unwrap().len(), 5);
    let (status, body) = list_page(&sim, &[("after_token", "\"garbage\"".into())]).await;
    assert_eq!(
        (status, body),
        (StatusCode::BAD_REQUEST, json!({"error": "invalid_token"}))
    );
}

#[tokio::test]
async fn destroying_twice_answers_not_found_the_second_time_and_stops_billing_once() {
    let sim = sim().await;
    let ask = offer_id(&sim, "A100 SXM4");
    let id = rent(&sim, ask, json!({"image": "x", "label": "d"})).await.1["new_contract"]
        .as_u64()
        .unwrap();
    let url = format!("{}/api/v0/instances/{id}/", sim.base_url());
    let (status, body) = call(client().delete(&url).bearer_auth(sim.api_key())).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"success": true})));
    let (status, body) = call(client().delete(&url).bearer_auth(sim.api_key())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "not_found");
    assert_eq!(instance(&sim, id).await, Value::Null);
    let cost = sim.ledger().entries[0].cost_usd;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let entry = &sim.ledger().entries[0];
    assert!(entry.terminated_at.is_some());
    assert_eq!(entry.cost_usd, cost, "nothing is billed after termination");
    assert_eq!(
        sim.offers().iter().find(|o| o.id == ask).unwrap().available,
        1
    );
}

#[tokio::test]
async fn a_wrong_key_is_401_auth_error_while_search_works_without_a_key() {
    let sim = sim().await;
    let url = format!("{}/api/v1/instances/", sim.base_url());
    let (status, body) = call(client().get(&url).bearer_auth("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        body,
        json!({"success": false, "error": "auth_error", "msg": "Invalid user key"})
    );
    assert_eq!(search(&sim, json!({})).await.0, StatusCode::OK);
    let bundles = format!("{}/api/v0/bundles/", sim.base_url());
    let (status, body) = call(client().post(bundles).bearer_auth("wrong").json(&json!({}))).await;
    assert_eq!(
        (status, body),
        (StatusCode::NOT_FOUND, json!({"msg": "Invalid user key"}))
    );
}

#[tokio::test]
async fn preemption_stops_the_instance_and_its_billing() {
    let sim = sim().await;
    let ask = offer_id(&sim, "A100 SXM4");
    let id = rent(&sim, ask, json!({"image": "x"})).await.1["new_contract"]
        .as_u64()
        .unwrap();
    let url = format!("{}/instances/{id}/preempt", sim.admin_url());
    assert_eq!(call(client().post(url)).await.0, StatusCode::NO_CONTENT);
    assert_eq!(instance(&sim, id).await["cur_state"], "stopped");
    let billed = sim.ledger().entries[0].billed_seconds;
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    assert_eq!(sim.ledger().entries[0].billed_seconds, billed);
}

#[tokio::test]
async fn raising_an_outbid_instances_bid_restarts_it() {
    let sim = sim().await;
    let offer = sim
        .offers()
        .into_iter()
        .find(|o| o.config.gpu == "H100 SXM")
        .unwrap();
    let id = rent(&sim, offer.id, json!({"image": "x", "price": 0.01}))
        .await
        .1["new_contract"]
        .as_u64()
        .unwrap();
    let url = format!("{}/api/v0/instances/bid_price/{id}/", sim.base_url());
    let body = json!({"client_id": "me", "price": offer.min_bid().unwrap()});
    assert_eq!(
        call(client().put(url).bearer_auth(sim.api_key()).json(&body))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(instance(&sim, id).await["intended_status"], "running");
}

fn runner_rent_body(script: &str) -> Value {
    json!({"client_id": "me", "image": "ubuntu:24.04", "disk": 20, "label": "nc-runner",
           "runtype": "args", "args": ["sh", "-c", script],
           "env": {"NEOCLOUD_BOOTSTRAP_TOKEN": "tok en", "NEOCLOUD_RUNNER_CREDENTIAL": "c",
                   "-p 8443:8443": "1"}})
}

#[tokio::test]
async fn a_start_command_runner_runs_while_the_instance_runs_with_its_env() {
    use common::{fake_container_runner, recorded_runner, runner_script, wait_for_path};
    let dir = tempfile::tempdir().unwrap();
    let config = SimConfig::fast().with_user_data_runner(fake_container_runner(dir.path()));
    let sim = VastSim::start(config).await.unwrap();
    let script = runner_script(&["--callback-url", "https://node:8443", "--name", "it's a b"]);
    let ask = offer_id(&sim, "A100 SXM4");
    let (status, body) = rent(&sim, ask, runner_rent_body(&script)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["new_contract"].as_u64().unwrap();
    assert!(
        wait_for_path(&dir.path().join("args"), true).await,
        "runner started"
    );
    assert_eq!(instance(&sim, id).await["actual_status"], "running");
    let (proc_dir, args, token, env) = recorded_runner(dir.path());
    assert_eq!(
        args,
        ["--callback-url", "https://node:8443", "--name", "it's a b"]
    );
    assert_eq!(token, "tok en");
    assert!(
        env.lines().any(|l| l == "NEOCLOUD_RUNNER_CREDENTIAL=c"),
        "{env}"
    );
    assert!(!env.contains("8443:8443"), "port keys are not env: {env}");
    assert!(proc_dir.exists(), "runner alive while the instance runs");
    let url = format!("{}/api/v0/instances/{id}/", sim.base_url());
    let (status, _) = call(client().delete(url).bearer_auth(sim.api_key())).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        wait_for_path(&proc_dir, false).await,
        "runner killed with its instance"
    );
}

#[tokio::test]
async fn start_command_runners_die_on_preemption_and_with_the_simulator() {
    use common::{fake_container_runner, recorded_runner, runner_script, wait_for_path};
    let dir = tempfile::tempdir().unwrap();
    let config = SimConfig::fast().with_user_data_runner(fake_container_runner(dir.path()));
    let sim = VastSim::start(config).await.unwrap();
    let body = runner_rent_body(&runner_script(&["--executor", "process"]));
    let (status, rented) = rent(&sim, offer_id(&sim, "A100 SXM4"), body).await;
    assert_eq!(status, StatusCode::OK, "{rented}");
    let id = rented["new_contract"].as_u64().unwrap();
    let args_file = dir.path().join("args");
    assert!(wait_for_path(&args_file, true).await, "runner started");
    let (proc_dir, ..) = recorded_runner(dir.path());
    assert!(sim.preempt(&id.to_string()));
    assert!(
        wait_for_path(&proc_dir, false).await,
        "runner killed on preemption"
    );

    std::fs::remove_file(&args_file).unwrap();
    let url = format!("{}/api/v0/instances/{id}/", sim.base_url());
    let request = client().put(url).bearer_auth(sim.api_key());
    let (status, _) = call(request.json(&json!({"state": "running"}))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        wait_for_path(&args_file, true).await,
        "runner started again"
    );
    let (proc_dir, ..) = recorded_runner(dir.path());
    drop(sim);
    assert!(
        wait_for_path(&proc_dir, false).await,
        "runner killed with the simulator"
    );
}
