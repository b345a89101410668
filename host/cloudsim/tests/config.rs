//! The documented example config starts all three simulators as described.

mod common;

use std::path::Path;

use common::{call, client};
use neocloud_cloudsim::{CloudSim, CloudSimConfig};
use reqwest::StatusCode;

#[tokio::test]
async fn the_example_config_starts_three_simulators_with_its_market_and_scenario() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("cloudsim.example.yaml");
    let mut config = CloudSimConfig::from_file(&path).unwrap();
    assert_eq!(config.vast.faults.len(), 2);
    config.runpod.port = 0;
    config.lambda.port = 0;
    config.vast.port = 0;
    let sim = CloudSim::start(config).await.unwrap();
    let ids: Vec<u64> = sim.vast.offers().iter().map(|o| o.id).collect();
    assert_eq!(ids, vec![1001, 1002]);
    let list = format!("{}/api/v1/instances/", sim.vast.base_url());
    let (status, _) = call(client().get(list).bearer_auth(sim.vast.api_key())).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the scenario's rate limit is armed"
    );
    let url = format!("{}/instance-types", sim.lambda.base_url());
    let (_, types) = call(client().get(url).bearer_auth(sim.lambda.api_key())).await;
    assert_eq!(types["data"].as_object().unwrap().len(), 2);
}

#[tokio::test]
async fn two_simulators_on_one_fixed_port_are_refused() {
    let mut config = CloudSimConfig::default();
    config.runpod.port = 18_999;
    config.vast.port = 18_999;
    let error = CloudSim::start(config).await.unwrap_err();
    assert!(error.to_string().contains("share a port"), "{error}");
}
