//! Lambda Cloud wire types (OpenAPI 1.10.0): the `{"data": …}` envelope, instance types with
//! the regions that have capacity, the launch and terminate bodies, instances, SSH keys and the
//! `{"error": {code, message, suggestion}}` body.
//!
//! Responses are read leniently; request bodies carry only documented fields. Not behaviour.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `{"data": T}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Data<T> {
    pub data: T,
}

/// `GET /instance-types`: keyed by type name.
pub(crate) type InstanceTypes = BTreeMap<String, TypeEntry>;

/// One instance type and where it has capacity now.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct TypeEntry {
    pub instance_type: InstanceType,
    #[serde(default)]
    pub regions_with_capacity_available: Vec<Region>,
}

/// An instance type.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct InstanceType {
    pub name: String,
    #[serde(default)]
    pub gpu_description: String,
    #[serde(default)]
    pub price_cents_per_hour: f64,
    #[serde(default)]
    pub specs: Specs,
}

/// Hardware of an instance type.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Specs {
    #[serde(default)]
    pub gpus: u32,
    #[serde(default)]
    pub storage_gib: u32,
}

/// A region.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Region {
    pub name: String,
}

/// A tag on an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Tag {
    pub key: String,
    pub value: String,
}

/// `POST /instance-operations/launch`. `Debug` redacts the `user_data`.
#[derive(Clone, Serialize)]
pub(crate) struct Launch {
    pub region_name: String,
    pub instance_type_name: String,
    pub ssh_key_names: Vec<String>,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    pub tags: Vec<Tag>,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("region_name", &self.region_name)
            .field("instance_type_name", &self.instance_type_name)
            .field("ssh_key_names", &self.ssh_key_names)
            .field("name", &self.name)
            .field("user_data", &crate::common::redacted(&self.user_data))
            .field("tags", &self.tags)
            .finish()
    }
}

/// The launch answer.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Launched {
    #[serde(default)]
    pub instance_ids: Vec<String>,
}

/// `POST /instance-operations/terminate`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Terminate {
    pub instance_ids: Vec<String>,
}

/// An instance.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Instance {
    pub id: String,
    pub name: Option<String>,
    pub ip: Option<String>,
    #[serde(default)]
    pub status: String,
    pub region: Option<Region>,
    pub instance_type: Option<InstanceType>,
    #[serde(default)]
    pub tags: Option<Vec<Tag>>,
}

/// An SSH key (only the name is read).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SshKey {
    pub name: String,
}

/// `{"error": {...}}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ErrorBody {
    pub error: LambdaError,
}

/// Lambda's error object; handle it by `code`, never by `message`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct LambdaError {
    pub code: String,
    #[serde(default)]
    pub message: String,
    pub suggestion: Option<String>,
}
