//! How an operator describes a remote cluster: where its kubeconfig is, which namespace the
//! node's Pods run in there, and what its GPUs cost (a chargeback table, since a cluster has no
//! price list of its own).
//!
//! Not for connecting: [`crate::KubeTarget`] does that with the kubeconfig the node read.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One remote cluster. Its `name` is the region of its offers, so a Pod's
/// `cloud.aibrix.ai/regions` and a policy can choose among clusters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoteCluster {
    /// A DNS label naming the cluster; the region of its offers and the first part of its
    /// instance ids (`<name>/<pod>`).
    pub name: String,
    /// The namespace the node creates its Pods and Secrets in, on the remote cluster.
    pub namespace: String,
    /// Where the kubeconfig for the remote cluster is.
    pub kubeconfig: KubeconfigSource,
    /// USD per GPU-hour by GPU product, as NVIDIA's GPU feature discovery labels nodes
    /// (`nvidia.com/gpu.product`, e.g. `NVIDIA-A100-SXM4-80GB`) or as a model name the node
    /// knows (`A100 SXM 80GB`). A product without a price is not offered.
    pub gpu_prices: BTreeMap<String, f64>,
    /// USD per hour added to every Pod run there (the cluster's fixed chargeback), default 0.
    #[serde(default)]
    pub surcharge_per_hour: f64,
    /// Accept a kubeconfig that sets `insecure-skip-tls-verify: true` (default false: such a
    /// kubeconfig is refused, since anyone on the path could then act as the cluster).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_insecure_skip_tls_verify: bool,
}

/// Where a remote cluster's kubeconfig is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeconfigSource {
    /// A Secret in the node's own cluster: `namespace/name`, or `name` in the node's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The key of the Secret holding the kubeconfig, default `kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A file on the node's own filesystem (for development and tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// A configuration error, naming the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// The field's path, e.g. `remoteClusters[1].gpuPrices["H100"]`.
    pub field: String,
    /// What is wrong with its value.
    pub message: String,
}

fn error(field: String, message: String) -> ConfigError {
    ConfigError { field, message }
}

pub use neocloud_core::translate::is_dns_label;

/// The namespace and name a Secret reference (`name` or `namespace/name`) names; a bare name is
/// in `own_namespace`.
pub fn split_secret_ref<'a>(secret: &'a str, own_namespace: &'a str) -> (&'a str, &'a str) {
    secret.split_once('/').unwrap_or((own_namespace, secret))
}

impl KubeconfigSource {
    /// The Secret's namespace (defaulting to `own_namespace`), name and key.
    pub fn secret_ref<'a>(&'a self, own_namespace: &'a str) -> Option<(&'a str, &'a str, &'a str)> {
        let (namespace, name) = split_secret_ref(self.secret.as_deref()?, own_namespace);
        Some((namespace, name, self.key.as_deref().unwrap_or("kubeconfig")))
    }
}

/// Checks every cluster; `field` is the list's own path (`remoteClusters`). Names must be
/// distinct DNS labels, namespaces DNS labels, exactly one kubeconfig source, prices finite and
/// positive, the surcharge finite and not negative.
pub fn validate(clusters: &[RemoteCluster], field: &str) -> Result<(), ConfigError> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, c) in clusters.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if !is_dns_label(&c.name) {
            return Err(error(
                format!("{at}.name"),
                format!(
                    "{:?} is not a DNS label (a-z, 0-9, '-', at most 63)",
                    c.name
                ),
            ));
        }
        if !seen.insert(c.name.as_str()) {
            return Err(error(
                format!("{at}.name"),
                format!("{:?} names two clusters", c.name),
            ));
        }
        if !is_dns_label(&c.namespace) {
            return Err(error(
                format!("{at}.namespace"),
                format!("{:?} is not a namespace name", c.namespace),
            ));
        }
        match (&c.kubeconfig.secret, &c.kubeconfig.path) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(error(
                    format!("{at}.kubeconfig"),
                    "give exactly one of secret and path".to_owned(),
                ));
            }
            (Some(s), None) => {
                if !is_secret_ref(s) {
                    return Err(error(
                        format!("{at}.kubeconfig.secret"),
                        format!("{s:?} is not a Secret name or namespace/name"),
                    ));
                }
            }
            (None, Some(_)) => {
                if c.kubeconfig.key.is_some() {
                    return Err(error(
                        format!("{at}.kubeconfig.key"),
                        "a key is only for a secret".to_owned(),
                    ));
                }
            }
        }
        validate_prices(&c.gpu_prices, c.surcharge_per_hour, &at)?;
    }
    Ok(())
}

/// Checks a price table and surcharge at `at` (`remoteClusters[0]`, `nvke`): at least one
/// product, every price finite and positive, the surcharge finite and not negative.
pub fn validate_prices(
    prices: &BTreeMap<String, f64>,
    surcharge_per_hour: f64,
    at: &str,
) -> Result<(), ConfigError> {
    if prices.is_empty() {
        return Err(error(
            format!("{at}.gpuPrices"),
            "is empty: no GPU of this cluster could be offered".to_owned(),
        ));
    }
    for (product, price) in prices {
        if product.trim().is_empty() {
            return Err(error(
                format!("{at}.gpuPrices"),
                "has an empty product name".to_owned(),
            ));
        }
        if !price.is_finite() || *price <= 0.0 {
            return Err(error(
                format!("{at}.gpuPrices[{product:?}]"),
                format!("{price} is not a positive price in USD per GPU-hour"),
            ));
        }
    }
    if !surcharge_per_hour.is_finite() || surcharge_per_hour < 0.0 {
        return Err(error(
            format!("{at}.surchargePerHour"),
            format!("{surcharge_per_hour} is not a price in USD per hour"),
        ));
    }
    Ok(())
}

/// Whether `s` names a Secret: `name` or `namespace/name`, each a DNS label.
pub fn is_secret_ref(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() <= 2 && parts.iter().all(|p| is_dns_label(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str) -> RemoteCluster {
        RemoteCluster {
            name: name.to_owned(),
            namespace: "burst".to_owned(),
            kubeconfig: KubeconfigSource {
                secret: Some("gpu-west-kubeconfig".to_owned()),
                key: None,
                path: None,
            },
            gpu_prices: BTreeMap::from([("NVIDIA-A100-SXM4-80GB".to_owned(), 1.9)]),
            surcharge_per_hour: 0.0,
            allow_insecure_skip_tls_verify: false,
        }
    }

    #[test]
    fn a_good_configuration_is_accepted_and_the_secret_defaults_to_our_namespace() {
        let c = cluster("gpu-west");
        validate(std::slice::from_ref(&c), "remoteClusters").unwrap();
        assert_eq!(
            c.kubeconfig.secret_ref("aibrix-system"),
            Some(("aibrix-system", "gpu-west-kubeconfig", "kubeconfig"))
        );
        let mut other = c.kubeconfig.clone();
        other.secret = Some("infra/west".to_owned());
        other.key = Some("config".to_owned());
        assert_eq!(other.secret_ref("x"), Some(("infra", "west", "config")));
    }

    #[test]
    fn bad_values_are_refused_naming_the_field_and_the_value() {
        let check = |edit: &dyn Fn(&mut RemoteCluster), field: &str, value: &str| {
            let mut c = cluster("gpu-west");
            edit(&mut c);
            let e = validate(&[c], "remoteClusters").unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.message.contains(value), "{e}");
        };
        check(
            &|c| c.name = "GPU West".into(),
            "remoteClusters[0].name",
            "\"GPU West\"",
        );
        check(
            &|c| c.namespace = "a/b".into(),
            "remoteClusters[0].namespace",
            "\"a/b\"",
        );
        check(
            &|c| c.kubeconfig.path = Some("/k".into()),
            "remoteClusters[0].kubeconfig",
            "exactly one",
        );
        check(
            &|c| c.kubeconfig.secret = Some("a/b/c".into()),
            "remoteClusters[0].kubeconfig.secret",
            "\"a/b/c\"",
        );
        check(
            &|c| {
                c.gpu_prices.insert("H100".into(), -2.0);
            },
            "remoteClusters[0].gpuPrices[\"H100\"]",
            "-2",
        );
        check(
            &|c| c.gpu_prices.clear(),
            "remoteClusters[0].gpuPrices",
            "empty",
        );
        check(
            &|c| c.surcharge_per_hour = f64::NAN,
            "remoteClusters[0].surchargePerHour",
            "NaN",
        );
        let e = validate(&[cluster("a"), cluster("a")], "remoteClusters").unwrap_err();
        assert_eq!(e.field, "remoteClusters[1].name");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let yaml = r#"{"name": "a", "namespace": "b", "kubeconfig": {"path": "/k"}, "gpuPrices": {"A40": 1}, "price": 3}"#;
        let e = serde_json::from_str::<RemoteCluster>(yaml).unwrap_err();
        assert!(e.to_string().contains("price"), "{e}");
    }
}
