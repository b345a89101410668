//! Private images against the simulators configured with a private registry: RunPod pulls with
//! a registry credential made for the rental and deleted with it, Vast with `image_login`, and
//! without the right login both instances fail with the pull refused.

use neocloud_cloudsim::{PrivateRegistry, RunpodSim, SimConfig, VastSim};
use neocloud_core::{InstancePhase, InstanceState, Offer, ProviderId, RegistryCredential};
use neocloud_providers::{CreateRequest, Provider};

use super::{cheapest, raw, request, runpod, vast};

const IMAGE: &str = "registry.example.com/team/model:1";

fn sim_config() -> SimConfig {
    SimConfig {
        private_registries: vec![PrivateRegistry {
            host: "registry.example.com".into(),
            username: "bot".into(),
            password: "s3cret pass".into(),
        }],
        ..SimConfig::fast()
    }
}

fn private(name: &str, offer: &Offer, password: Option<&str>) -> CreateRequest {
    let mut r = request(name, offer);
    r.workload.image = IMAGE.into();
    r.registry_login = password.map(|password| RegistryCredential {
        server: "registry.example.com".into(),
        username: "bot".into(),
        password: password.into(),
    });
    r
}

/// Rents the private image under `name` at the cheapest offer, with `password` if any.
async fn rent(p: &dyn Provider, name: &str, password: Option<&str>) -> InstanceState {
    let offer = cheapest(p).await;
    p.create(&private(name, &offer, password)).await.unwrap()
}

/// The instance's phase once the simulator has had time to start it.
async fn settled(p: &dyn Provider, created: &InstanceState) -> InstanceState {
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    p.get(&created.id)
        .await
        .unwrap()
        .expect("the instance exists")
}

#[tokio::test]
async fn runpod_pulls_a_private_image_with_a_credential_made_for_the_rental_and_deleted_with_it() {
    let sim = RunpodSim::start(sim_config()).await.unwrap();
    let p = runpod(&sim);
    let pod = rent(&p, "ncn-t-private-1", Some("s3cret pass")).await;
    assert_eq!(sim.registry_names(), ["ncn-t-private-1"]);
    let got = raw(
        format!("{}/v2/pods/{}", sim.base_url(), pod.id),
        sim.api_key(),
    )
    .await;
    assert!(got["registry"].is_string(), "{got}");
    assert!(!got.to_string().contains("s3cret"), "{got}");
    assert_eq!(settled(&p, &pod).await.phase, InstancePhase::Running);
    let listed = p.list_credentials("ncn-t-").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1, "ncn-t-private-1");

    p.delete(&pod.id).await.unwrap();
    assert!(sim.registry_names().is_empty());
    p.delete(&pod.id).await.unwrap();
}

#[tokio::test]
async fn runpod_refuses_a_private_image_pulled_without_the_right_login() {
    let sim = RunpodSim::start(sim_config()).await.unwrap();
    let p = runpod(&sim);
    for (name, password) in [("ncn-t-none", None), ("ncn-t-wrong", Some("wrong"))] {
        let pod = rent(&p, name, password).await;
        let state = settled(&p, &pod).await;
        assert_eq!(state.phase, InstancePhase::Failed, "{name}: {state:?}");
        p.delete(&pod.id).await.unwrap();
    }
    assert!(sim.registry_names().is_empty());
}

#[tokio::test]
async fn a_stale_runpod_credential_is_listed_and_deleted_by_id() {
    let sim = RunpodSim::start(sim_config()).await.unwrap();
    let p = runpod(&sim);
    let pod = rent(&p, "ncn-t-stale", Some("s3cret pass")).await;
    // Gone behind the adapter's back: its credential is left for the sweeper.
    let url = format!("{}/v2/pods/{}", sim.base_url(), pod.id);
    let client = reqwest::Client::new();
    client
        .delete(url)
        .bearer_auth(sim.api_key())
        .send()
        .await
        .unwrap();
    let listed = p.list_credentials("ncn-t-").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(p.list_credentials("ncn-other-").await.unwrap().is_empty());
    p.delete_credential(&listed[0].0).await.unwrap();
    p.delete_credential(&listed[0].0).await.unwrap();
    assert!(sim.registry_names().is_empty());
}

#[tokio::test]
async fn vast_pulls_a_private_image_with_image_login_and_refuses_it_without() {
    let sim = VastSim::start(sim_config()).await.unwrap();
    let p = vast(&sim);
    let ok = rent(&p, "ncn-t-vast-1", Some("s3cret pass")).await;
    assert_eq!(settled(&p, &ok).await.phase, InstancePhase::Running);

    let refused = rent(&p, "ncn-t-vast-2", None).await;
    let state = settled(&p, &refused).await;
    assert_eq!(state.phase, InstancePhase::Failed, "{state:?}");
    let message = state.message.unwrap_or_default();
    assert!(message.contains("pull access denied"), "{message}");
}

#[test]
fn a_create_requests_debug_shows_the_registry_but_not_the_login() {
    let offer = neocloud_fixtures::offer(ProviderId::Runpod, "o", "RTX 4090", 1.0);
    let r = private("ncn-t-debug", &offer, Some("s3cret pass"));
    let shown = format!("{r:?}");
    assert!(shown.contains("registry.example.com"), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
}
