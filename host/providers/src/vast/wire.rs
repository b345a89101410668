//! Vast.ai wire types: offers from `POST /api/v0/bundles/`, the rental body and answer of
//! `PUT /api/v0/asks/{id}/`, instances from `GET /api/v0/instances/{id}/` and the keyset pages of
//! `GET /api/v1/instances/`, and the error bodies (`{"success":false,"error","msg"}`, the bare
//! `{"msg"}` of a bad key, and the `{"detail"}` of a 429).
//!
//! Responses are read leniently (Vast adds and nulls fields freely). Not behaviour.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The search answer.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Offers {
    #[serde(default)]
    pub offers: Vec<VastOffer>,
}

/// One offer (an ask).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct VastOffer {
    pub id: u64,
    #[serde(default)]
    pub gpu_name: String,
    #[serde(default)]
    pub num_gpus: u32,
    /// MB per GPU.
    pub gpu_ram: Option<f64>,
    #[serde(default)]
    pub dph_total: f64,
    pub min_bid: Option<f64>,
    pub reliability2: Option<f64>,
    pub verification: Option<String>,
    pub verified: Option<bool>,
    pub geolocation: Option<String>,
    pub disk_space: Option<f64>,
    pub machine_id: Option<u64>,
}

/// `PUT /api/v0/asks/{id}/`. `Debug` shows the env's names only.
#[derive(Clone, Serialize)]
pub(crate) struct Rent {
    pub client_id: &'static str,
    pub image: String,
    pub disk: f64,
    pub label: String,
    pub env: BTreeMap<String, String>,
    pub runtype: &'static str,
    pub args: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price: Option<f64>,
    pub cancel_unavail: bool,
    pub target_state: &'static str,
    /// `docker login` arguments for a private image: `-u USER -p PASS REGISTRY`. Never logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_login: Option<String>,
}

impl std::fmt::Debug for Rent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rent")
            .field("client_id", &self.client_id)
            .field("image", &self.image)
            .field("disk", &self.disk)
            .field("label", &self.label)
            .field("env", &crate::common::EnvNames(&self.env))
            .field("runtype", &self.runtype)
            .field("args", &self.args)
            .field("price", &self.price)
            .field("cancel_unavail", &self.cancel_unavail)
            .field("target_state", &self.target_state)
            .field("image_login (redacted)", &self.image_login.is_some())
            .finish()
    }
}

/// Success or error body of a call that may create or destroy something.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Outcome {
    pub success: Option<bool>,
    pub error: Option<String>,
    pub msg: Option<String>,
    pub detail: Option<String>,
    /// The instance id; error bodies may carry it too (a stopped instance after a low bid).
    pub new_contract: Option<u64>,
}

/// `GET /api/v0/instances/{id}/`: one object under the plural key, `null` if unknown.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct One {
    pub instances: Option<VastInstance>,
}

/// One page of `GET /api/v1/instances/`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Page {
    #[serde(default)]
    pub instances: Vec<VastInstance>,
    pub next_token: Option<String>,
}

/// An instance.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct VastInstance {
    pub id: u64,
    pub label: Option<String>,
    pub actual_status: Option<String>,
    pub intended_status: Option<String>,
    pub cur_state: Option<String>,
    pub status_msg: Option<String>,
    pub gpu_name: Option<String>,
    pub num_gpus: Option<u32>,
    pub gpu_ram: Option<f64>,
    pub dph_total: Option<f64>,
    pub geolocation: Option<String>,
    pub public_ipaddr: Option<String>,
    pub ports: Option<Value>,
    pub start_date: Option<f64>,
    /// Rented with a bid (interruptible).
    pub is_bid: Option<bool>,
}
