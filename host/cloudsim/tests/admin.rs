//! The admin API's answers as JSON: every object has each key once, and the offers list the id
//! in effect (the one `PUT` and `DELETE /_admin/offers/{id}` take).

mod common;

use std::fmt;

use common::{call, client};
use neocloud_cloudsim::{CloudSim, CloudSimConfig, SimConfig};
use reqwest::StatusCode;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

/// The keys of one JSON object, in order and with repeats, as written on the wire (a
/// `serde_json::Value` would keep only the last of two equal keys).
struct Keys(Vec<String>);

impl<'de> serde::Deserialize<'de> for Keys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = Keys;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some((key, _)) = map.next_entry::<String, IgnoredAny>()? {
                    keys.push(key);
                }
                Ok(Keys(keys))
            }
        }
        d.deserialize_map(KeysVisitor)
    }
}

fn fast() -> CloudSimConfig {
    CloudSimConfig {
        runpod: SimConfig::fast(),
        lambda: SimConfig::fast(),
        vast: SimConfig::fast(),
    }
}

#[tokio::test]
async fn every_offer_of_the_admin_api_names_each_key_once_and_its_id_works() {
    let sims = CloudSim::start(fast()).await.unwrap();
    let admins = [
        ("runpod", sims.runpod.admin_url()),
        ("lambda", sims.lambda.admin_url()),
        ("vast", sims.vast.admin_url()),
    ];
    for (sim, admin) in admins {
        let raw = client()
            .get(format!("{admin}/offers"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let offers: Vec<Keys> = serde_json::from_str(&raw).unwrap();
        assert!(!offers.is_empty(), "{sim}: no offers");
        for Keys(keys) in &offers {
            let mut unique = keys.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), keys.len(), "{sim}: a key repeats in {keys:?}");
            assert!(keys.contains(&"id".to_owned()), "{sim}: {keys:?}");
        }
        let (_, parsed) = call(client().get(format!("{admin}/offers"))).await;
        let id = parsed[0]["id"].as_u64().expect("a numeric id");
        let put = client()
            .put(format!("{admin}/offers/{id}"))
            .json(&serde_json::json!({"available": 0}));
        assert_eq!(call(put).await.0, StatusCode::NO_CONTENT, "{sim}");
    }
}
