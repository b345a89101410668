//! Adapter-specific behaviour against the simulators, beyond the shared conformance suite:
//! Lambda's capacity pre-check, launch spacing and launch body; account quotas on each cloud;
//! RunPod validation errors; Vast's fresh price check; keys kept out of Debug output.

use std::time::{Duration, Instant};

use neocloud_cloudsim::{FaultKind, FaultRule, LambdaSim, RunpodSim, SimConfig, VastSim};
use neocloud_core::{CapacityType, FailureClass, Offer, OfferQuery};
use neocloud_providers::{
    ApiKey, Boot, ContainerBoot, CreateRequest, LambdaConfig, LambdaProvider, Provider,
    RunpodConfig, RunpodProvider, VastConfig, VastProvider,
};
use serde_json::Value;

mod private_images;

const SSH_KEY: &str = neocloud_cloudsim::config::DEFAULT_SSH_KEY;

fn query() -> OfferQuery {
    OfferQuery {
        gpu_models: vec![],
        gpu_count: 1,
        capacity: Some(CapacityType::OnDemand),
    }
}

fn request(name: &str, offer: &Offer) -> CreateRequest {
    let mut workload = neocloud_fixtures::workload();
    workload.gpu.count = offer.gpu_count;
    CreateRequest {
        external_name: name.into(),
        offer: offer.clone(),
        workload,
        env: vec![],
        bid_per_hour: None,
        boot: None,
        registry_login: None,
    }
}

async fn cheapest(p: &dyn Provider) -> Offer {
    let offers = p.list_offers(&query()).await.unwrap();
    offers
        .into_iter()
        .min_by(|a, b| a.price_per_hour.total_cmp(&b.price_per_hour))
        .unwrap()
}

fn lambda_config(sim: &LambdaSim) -> LambdaConfig {
    let mut config = LambdaConfig::new(ApiKey::new(sim.api_key()), SSH_KEY);
    config.base_url = sim.base_url();
    config.launch_interval_ms = 0;
    config
}

fn runpod(sim: &RunpodSim) -> RunpodProvider {
    let mut config = RunpodConfig::new(ApiKey::new(sim.api_key()));
    config.base_url = sim.base_url();
    RunpodProvider::new(config).unwrap()
}

fn vast(sim: &VastSim) -> VastProvider {
    let mut config = VastConfig::new(ApiKey::new(sim.api_key()));
    config.base_url = sim.base_url();
    VastProvider::new(config).unwrap()
}

#[tokio::test]
async fn lambda_refuses_a_launch_the_capacity_check_says_cannot_succeed_without_sending_it() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    let p = LambdaProvider::new(lambda_config(&sim)).unwrap();
    let offer = cheapest(&p).await;
    for o in sim
        .offers()
        .iter()
        .filter(|o| offer.id == format!("{}/{}", o.config.gpu, o.config.region))
    {
        sim.set_capacity(o.id, 0);
    }
    sim.add_fault(FaultRule::next(
        "POST /api/v1/instance-operations/launch",
        1,
        FaultKind::ServerError { status: 500 },
    ));
    let error = p.create(&request("nc-precheck", &offer)).await.unwrap_err();
    assert_eq!(error.class, FailureClass::Capacity);
    assert_eq!(
        error.code.as_deref(),
        Some("instance-operations/launch/insufficient-capacity")
    );
    assert!(
        error
            .message
            .contains("regions with capacity available: us-west-1"),
        "{error}"
    );
    assert_eq!(sim.faults()[0].hits, 0, "launch was never called");
}

#[tokio::test]
async fn lambda_spaces_launches_by_the_configured_interval_and_sends_name_tag_and_one_ssh_key() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    let mut config = lambda_config(&sim);
    config.launch_interval_ms = 400;
    let p = LambdaProvider::new(config).unwrap();
    let offer = cheapest(&p).await;
    let started = Instant::now();
    let first = p.create(&request("nc-space-1", &offer)).await.unwrap();
    p.create(&request("nc-space-2", &offer)).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let url = format!("{}/instances/{}", sim.base_url(), first.id);
    let raw: Value = reqwest::Client::new()
        .get(url)
        .bearer_auth(sim.api_key())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(raw["data"]["name"], "nc-space-1");
    assert_eq!(raw["data"]["ssh_key_names"], serde_json::json!([SSH_KEY]));
    assert_eq!(
        raw["data"]["tags"],
        serde_json::json!([{"key": "neocloud:external-name", "value": "nc-space-1"}])
    );
}

#[tokio::test]
async fn lambda_launches_spaced_by_the_server_limit_are_never_refused_and_the_wait_is_reported() {
    // The simulator counts launches as they arrive, as Lambda does: one per window.
    let sim = LambdaSim::start(SimConfig {
        launch_rate_limit: neocloud_cloudsim::RateLimit {
            max_requests: 1,
            window_ms: 300,
        },
        ..SimConfig::fast()
    })
    .await
    .unwrap();
    let mut config = lambda_config(&sim);
    config.launch_interval_ms = 300;
    let p = LambdaProvider::new(config).unwrap();
    let offer = cheapest(&p).await;
    assert_eq!(p.create_wait(), None, "nothing launched yet");
    for i in 0..3 {
        p.create(&request(&format!("nc-spaced-{i}"), &offer))
            .await
            .unwrap();
        let (wait, why) = p.create_wait().expect("a launch was just answered");
        assert!(wait <= Duration::from_millis(300), "{wait:?}");
        assert!(why.contains("launch spacing"), "{why}");
    }
    assert_eq!(
        sim.refused_launches(),
        0,
        "a launch arrived inside the window"
    );
}

#[tokio::test]
async fn a_lambda_launch_answered_429_is_sent_again_after_the_wait_and_rents_once() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    sim.add_fault(FaultRule::next(
        "POST /api/v1/instance-operations/launch",
        2,
        FaultKind::RateLimited {
            retry_after_secs: 0,
        },
    ));
    let mut config = lambda_config(&sim);
    config.launch_interval_ms = 50;
    let p = LambdaProvider::new(config).unwrap();
    let offer = cheapest(&p).await;
    let made = p.create(&request("nc-429", &offer)).await.unwrap();
    assert!(
        sim.faults().is_empty(),
        "both 429s were met: {:?}",
        sim.faults()
    );
    assert_eq!(sim.ledger().live().len(), 1, "{:?}", sim.ledger().live());
    assert_eq!(p.list_ours("nc-429").await.unwrap().len(), 1);
    assert_eq!(made.external_name, "nc-429");
}

#[tokio::test]
async fn a_lambda_launch_refused_429_more_times_than_the_http_layer_retries_is_rate_limited() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    sim.add_fault(FaultRule::next(
        "POST /api/v1/instance-operations/launch",
        10,
        FaultKind::RateLimited {
            retry_after_secs: 0,
        },
    ));
    let mut config = lambda_config(&sim);
    config.launch_interval_ms = 10;
    let sends = config.http.max_attempts;
    let p = LambdaProvider::new(config).unwrap();
    let offer = cheapest(&p).await;
    let error = p.create(&request("nc-429s", &offer)).await.unwrap_err();
    assert_eq!(error.class, FailureClass::RateLimited, "{error}");
    assert_eq!(sim.faults()[0].hits, u64::from(sends));
    assert!(p.list_ours("nc-429s").await.unwrap().is_empty());
}

#[tokio::test]
async fn lambda_health_names_an_ssh_key_the_account_does_not_have() {
    let sim = LambdaSim::start(SimConfig::fast()).await.unwrap();
    let mut config = lambda_config(&sim);
    config.ssh_key_name = "missing-key".into();
    let error = LambdaProvider::new(config)
        .unwrap()
        .health()
        .await
        .unwrap_err();
    assert_eq!(error.class, FailureClass::InvalidRequest);
    assert!(error.message.contains("missing-key"), "{error}");
}

#[tokio::test]
async fn a_full_account_is_classified_as_quota_on_every_cloud() {
    let full = || SimConfig {
        quota: Some(0),
        ..SimConfig::fast()
    };
    let rp = RunpodSim::start(full()).await.unwrap();
    let lb = LambdaSim::start(full()).await.unwrap();
    let vs = VastSim::start(full()).await.unwrap();
    let providers: Vec<Box<dyn Provider>> = vec![
        Box::new(runpod(&rp)),
        Box::new(LambdaProvider::new(lambda_config(&lb)).unwrap()),
        Box::new(vast(&vs)),
    ];
    for p in providers {
        let offer = cheapest(&*p).await;
        let error = p.create(&request("nc-quota", &offer)).await.unwrap_err();
        assert_eq!(error.class, FailureClass::Quota, "{error}");
    }
    assert!(
        rp.ledger().entries.is_empty()
            && lb.ledger().entries.is_empty()
            && vs.ledger().entries.is_empty()
    );
}

#[tokio::test]
async fn runpod_validation_errors_are_invalid_requests_with_the_status_as_code() {
    let sim = RunpodSim::start(SimConfig::fast()).await.unwrap();
    let p = runpod(&sim);
    let mut offer = cheapest(&p).await;
    offer.id = "NVIDIA Imaginary/SECURE/CA-MTL-1".into();
    let error = p.create(&request("nc-422", &offer)).await.unwrap_err();
    assert_eq!(error.class, FailureClass::InvalidRequest, "{error}");
    assert_eq!(error.code.as_deref(), Some("422"));
    assert!(error.message.contains("not a known gpu type id"), "{error}");
}

#[tokio::test]
async fn vast_checks_the_fresh_price_against_the_max_price_before_renting() {
    let sim = VastSim::start(SimConfig::fast()).await.unwrap();
    let p = vast(&sim);
    let offer = cheapest(&p).await;
    let mut too_cheap = request("nc-max", &offer);
    too_cheap.workload.max_price_per_hour = Some(offer.price_per_hour / 2.0);
    let error = p.create(&too_cheap).await.unwrap_err();
    assert_eq!(error.class, FailureClass::PriceExceeded, "{error}");
    sim.remove_offer(offer.id.parse().unwrap());
    too_cheap.workload.max_price_per_hour = Some(offer.price_per_hour);
    let error = p.create(&too_cheap).await.unwrap_err();
    assert_eq!(error.class, FailureClass::Capacity, "{error}");
    assert!(sim.ledger().entries.is_empty());
}

#[tokio::test]
async fn keys_never_appear_in_debug_output_of_configs_or_adapters() {
    let key = "sk-THIS-IS-SECRET";
    let runpod = RunpodConfig::new(ApiKey::new(key));
    let lambda = LambdaConfig::new(ApiKey::new(key), "k");
    let vast = VastConfig::new(ApiKey::new(key));
    let shown = format!(
        "{runpod:?} {lambda:?} {vast:?} {:?} {:?} {:?}",
        RunpodProvider::new(runpod.clone()).unwrap(),
        LambdaProvider::new(lambda.clone()).unwrap(),
        VastProvider::new(vast.clone()).unwrap()
    );
    assert!(!shown.contains(key), "{shown}");
    assert!(shown.contains("[redacted]"));
}

#[tokio::test]
async fn config_files_with_unknown_fields_are_refused() {
    let bad = serde_json::json!({"api_key": "k", "base_url": "http://x", "bogus": 1});
    assert!(serde_json::from_value::<RunpodConfig>(bad.clone()).is_err());
    assert!(serde_json::from_value::<VastConfig>(bad).is_err());
    let ok = serde_json::json!({"api_key": "k", "ssh_key_name": "s", "http": {"timeout_ms": 5}});
    assert_eq!(
        serde_json::from_value::<LambdaConfig>(ok)
            .unwrap()
            .http
            .timeout_ms,
        5
    );
}

/// A rental that boots the runner: the Pod's command gives way to the runner's start command,
/// and the runner's variables join the Pod's environment (which stays).
fn booted(name: &str, offer: &Offer) -> CreateRequest {
    let mut r = request(name, offer);
    r.env = vec![("POD_VAR".into(), "kept".into())];
    r.boot = Some(Boot {
        user_data: "#cloud-config\n".into(),
        container: Some(ContainerBoot {
            command: vec![
                "sh".into(),
                "-c".into(),
                "exec /tmp/neocloud-runner --x 'a b'".into(),
            ],
            env: vec![("NEOCLOUD_BOOTSTRAP_TOKEN".into(), "tok".into())],
        }),
    });
    r
}

async fn raw(url: String, key: &str) -> Value {
    reqwest::Client::new()
        .get(url)
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn runpod_and_vast_start_the_runner_in_place_of_the_pod_command() {
    let sim = RunpodSim::start(SimConfig::fast()).await.unwrap();
    let p = runpod(&sim);
    let offer = cheapest(&p).await;
    let pod = p.create(&booted("nc-boot-1", &offer)).await.unwrap();
    let got = raw(
        format!("{}/v2/pods/{}", sim.base_url(), pod.id),
        sim.api_key(),
    )
    .await;
    let args = got["args"].as_str().expect("args");
    assert_eq!(
        shlex::split(args).unwrap(),
        ["sh", "-c", "exec /tmp/neocloud-runner --x 'a b'"],
        "{got}"
    );
    assert_eq!(got["env"]["POD_VAR"], "kept", "{got}");
    assert_eq!(got["env"]["NEOCLOUD_BOOTSTRAP_TOKEN"], "tok", "{got}");

    let sim = VastSim::start(SimConfig::fast()).await.unwrap();
    let p = vast(&sim);
    let offer = cheapest(&p).await;
    let instance = p.create(&booted("nc-boot-2", &offer)).await.unwrap();
    let got = raw(
        format!(
            "{}/api/v0/instances/{}/?owner=me",
            sim.base_url(),
            instance.id
        ),
        sim.api_key(),
    )
    .await;
    let got = &got["instances"];
    assert_eq!(got["image_runtype"], "args", "{got}");
    assert_eq!(
        got["image_args"],
        serde_json::json!(["sh", "-c", "exec /tmp/neocloud-runner --x 'a b'"]),
        "{got}"
    );
    let env = got["extra_env"].to_string();
    assert!(
        env.contains("POD_VAR") && env.contains("NEOCLOUD_BOOTSTRAP_TOKEN"),
        "{env}"
    );
}
