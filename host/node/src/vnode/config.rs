//! How the virtual node presents itself: name, taint, labels, limits, kubelet endpoint.

use serde::{Deserialize, Serialize};

/// The taint that keeps Pods off the node unless they tolerate it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TaintConfig {
    /// The taint key.
    pub key: String,
    /// The taint value.
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl Default for TaintConfig {
    fn default() -> Self {
        Self {
            key: "virtual-kubelet.io/provider".into(),
            value: "neocloud".into(),
            effect: "NoSchedule".into(),
        }
    }
}

/// The node's identity and limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeConfig {
    /// The Node's name; the node authenticates as `system:node:<name>`.
    pub name: String,
    /// The taint on the node.
    #[serde(default)]
    pub taint: TaintConfig,
    /// The enabled providers, shown as labels `cloud.aibrix.ai/provider-<name>=true`: the
    /// file's top-level `providers`, never read from `node:` (where it was once silently
    /// overwritten; now it is refused as an unknown field).
    #[serde(default, skip_deserializing)]
    pub providers: Vec<String>,
    /// The most Pods the node accepts at once (`status.allocatable.pods`).
    #[serde(default = "default_max_pods")]
    pub max_pods: u32,
    /// A ceiling on `nvidia.com/gpu` whatever the catalog offers.
    #[serde(default = "default_max_gpus")]
    pub max_gpus: u32,
    /// The address the API server uses to reach the kubelet API (logs); default `POD_IP`, else
    /// `127.0.0.1`.
    #[serde(default = "default_address")]
    pub address: String,
    /// The kubelet API port.
    #[serde(default = "default_kubelet_port")]
    pub kubelet_port: u16,
    /// How often the Lease is renewed while healthy; its duration is four times this.
    #[serde(default = "default_lease_renew_seconds")]
    pub lease_renew_seconds: u32,
}

fn default_max_pods() -> u32 {
    110
}
fn default_max_gpus() -> u32 {
    64
}
/// `POD_IP` (set from the Pod's IP in the shipped Deployment), else loopback.
fn default_address() -> String {
    std::env::var("POD_IP")
        .ok()
        .filter(|ip| !ip.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into())
}
fn default_kubelet_port() -> u16 {
    10250
}
fn default_lease_renew_seconds() -> u32 {
    10
}

impl NodeConfig {
    /// A configuration with every default and the given name.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            taint: TaintConfig::default(),
            providers: Vec::new(),
            max_pods: default_max_pods(),
            max_gpus: default_max_gpus(),
            address: default_address(),
            kubelet_port: default_kubelet_port(),
            lease_renew_seconds: default_lease_renew_seconds(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_taint_is_the_virtual_kubelet_one() {
        let cfg = NodeConfig::named("n");
        assert_eq!(cfg.taint.key, "virtual-kubelet.io/provider");
        assert_eq!(cfg.taint.value, "neocloud");
        assert_eq!(cfg.taint.effect, "NoSchedule");
        assert_eq!(cfg.kubelet_port, 10250);
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let err = serde_json::from_str::<NodeConfig>(r#"{"name":"n","maxGpu":4}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `maxGpu`"), "{err}");
    }
}
