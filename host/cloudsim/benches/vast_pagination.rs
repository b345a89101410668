//! Lists 1,000 seeded Vast instances through `GET /api/v1/instances/` pagination (40 pages of
//! 25) and reports the time per full listing and per page round trip. Run with
//! `cargo bench -p neocloud-cloudsim --bench vast_pagination`; results go to stderr.
//!
//! This measures the simulator and raw HTTP only; the adapter benchmark in `neocloud-providers`
//! compares its overhead against these numbers.

use std::time::{Duration, Instant};

use neocloud_cloudsim::{SimConfig, VastSim};
use serde_json::Value;

const INSTANCES: usize = 1_000;
const ROUNDS: usize = 20;

async fn list_all(client: &reqwest::Client, sim: &VastSim) -> (usize, usize) {
    let url = format!("{}/api/v1/instances/", sim.base_url());
    let (mut seen, mut pages, mut token) = (0, 0, None::<String>);
    loop {
        let mut query = vec![("limit", "25".to_string())];
        if let Some(token) = &token {
            query.push(("after_token", Value::String(token.clone()).to_string()));
        }
        let request = client.get(&url).bearer_auth(sim.api_key()).query(&query);
        let body: Value = request.send().await.unwrap().json().await.unwrap();
        pages += 1;
        seen += body["instances"].as_array().map_or(0, Vec::len);
        match body["next_token"].as_str() {
            Some(next) => token = Some(next.to_string()),
            None => return (seen, pages),
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let sim = VastSim::start(SimConfig::fast()).await.unwrap();
        sim.seed_instances(INSTANCES, "bench-");
        let client = reqwest::Client::new();
        let (seen, pages) = list_all(&client, &sim).await;
        assert_eq!(seen, INSTANCES, "every seeded instance is listed once");
        let mut times: Vec<Duration> = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let started = Instant::now();
            list_all(&client, &sim).await;
            times.push(started.elapsed());
        }
        times.sort();
        let median = times[ROUNDS / 2];
        eprintln!(
            "vast_pagination: {INSTANCES} instances, {pages} pages; full listing median {median:?} \
             (min {:?}, max {:?}); per page {:?}",
            times[0],
            times[ROUNDS - 1],
            median / pages as u32
        );
    });
}
