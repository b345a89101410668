//! NVKE discovery: the workload clusters an NVKE management plane has provisioned become remote
//! clusters of the `kube` provider, and stop taking new rentals when they are no longer listed
//! as provisioned.
//!
//! Every `intervalSeconds` the node reads its JWT from a Secret (so a rotated token is picked up),
//! lists `GET <url>/api/clusters` with it as a bearer token, and for each cluster whose
//! `conditions.provisioned` is true and `conditions.provisioning` false reads the kubeconfig
//! from the Secret named by the cluster's id (in the node's namespace). A refused token or an
//! unreachable API makes the provider unhealthy with the reason; the clusters already found keep
//! their running Pods.
//!
//! The client speaks HTTPS only (the JWT is a bearer token): an `http://` URL is refused when
//! the configuration is checked, redirects are not followed, every request has a deadline and
//! an answer larger than [`MAX_ANSWER`] is refused rather than read. The management API's
//! certificate is verified against the system roots, or against `caFile` alone when given.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use kube::Client;
use neocloud_core::{FailureClass, ProviderId};
use neocloud_providers::{Operation, ProviderError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{
    ConfigError, KubeconfigSource, RemoteCluster, is_dns_label, is_secret_ref, split_secret_ref,
    validate_prices,
};
use crate::target::{KubeTarget, client_from_kubeconfig, secret_text};

/// The `nvke:` section of the node's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvkeDiscovery {
    /// The management API's base URL, `https://` only, e.g. `https://nvke.example.com` (NVKE
    /// itself serves plain HTTP on NodePort 30080; put TLS in front of it).
    pub url: String,
    /// A PEM file of the CA certificates that sign the management API's certificate; when
    /// given, they alone are trusted for it (not the system roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The Secret holding the JWT: `name` (in the node's namespace) or `namespace/name`.
    pub token_secret: String,
    /// Its key, default `token`.
    #[serde(default = "default_token_key")]
    pub token_key: String,
    /// The namespace the node's Pods go to on every workload cluster.
    pub namespace: String,
    /// USD per GPU-hour by product, as for `remoteClusters`.
    pub gpu_prices: BTreeMap<String, f64>,
    /// USD per hour added to each Pod, default 0.
    #[serde(default)]
    pub surcharge_per_hour: f64,
    /// The key of each cluster's kubeconfig in the Secret named by its id, default `kubeconfig`.
    #[serde(default = "default_kubeconfig_key")]
    pub kubeconfig_key: String,
    /// Seconds between two listings, default 30, at least 1.
    #[serde(default = "default_interval")]
    pub interval_seconds: u64,
}

fn default_token_key() -> String {
    "token".to_owned()
}
fn default_kubeconfig_key() -> String {
    "kubeconfig".to_owned()
}
fn default_interval() -> u64 {
    30
}

fn bad(field: &str, message: String) -> ConfigError {
    ConfigError {
        field: format!("nvke.{field}"),
        message,
    }
}

impl NvkeDiscovery {
    /// Checks the section; errors name the field and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.trim_end_matches('/');
        let parsed = reqwest::Url::parse(url).ok();
        if parsed.as_ref().is_none_or(|u| !u.has_host()) {
            return Err(bad("url", format!("{:?} is not a URL", self.url)));
        }
        if parsed.is_some_and(|u| u.scheme() != "https") {
            return Err(bad(
                "url",
                format!(
                    "{:?} is not an https URL: the bearer token must not travel in clear text \
                     (put TLS in front of NVKE's HTTP port)",
                    self.url
                ),
            ));
        }
        if !is_secret_ref(&self.token_secret) {
            return Err(bad(
                "tokenSecret",
                format!(
                    "{:?} is not a Secret name or namespace/name",
                    self.token_secret
                ),
            ));
        }
        if !is_dns_label(&self.namespace) {
            return Err(bad(
                "namespace",
                format!("{:?} is not a namespace name", self.namespace),
            ));
        }
        if self.interval_seconds == 0 {
            return Err(bad("intervalSeconds", "0 must be at least 1".to_owned()));
        }
        validate_prices(&self.gpu_prices, self.surcharge_per_hour, "nvke")
    }
}

/// A workload cluster as the management API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvkeCluster {
    /// Its id: the name of the Secret with its kubeconfig, and its region in offers.
    pub id: String,
    /// `conditions.provisioned`.
    pub provisioned: bool,
    /// `conditions.provisioning`.
    pub provisioning: bool,
}

impl NvkeCluster {
    /// Provisioned and no longer provisioning: ready for work.
    pub fn ready(&self) -> bool {
        self.provisioned && !self.provisioning
    }
}

/// A condition as a boolean: `true`, or a `"True"` string.
fn truth(v: &Value) -> bool {
    v.as_bool()
        .unwrap_or_else(|| v.as_str().is_some_and(|s| s.eq_ignore_ascii_case("true")))
}

/// The clusters of a `GET /api/clusters` answer: a list, or an object holding it under
/// `clusters` or `items`; conditions as an object of booleans or a list of `{type, status}`.
pub fn parse_clusters(body: &Value) -> Result<Vec<NvkeCluster>, String> {
    let list = body
        .as_array()
        .or_else(|| body.get("clusters").and_then(Value::as_array))
        .or_else(|| body.get("items").and_then(Value::as_array))
        .ok_or_else(|| "the answer holds no list of clusters".to_owned())?;
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("cluster {i} has no id"))?;
            let condition = |name: &str| match c.get("conditions") {
                Some(Value::Object(m)) => m.get(name).is_some_and(truth),
                Some(Value::Array(list)) => list.iter().any(|x| {
                    x.get("type")
                        .and_then(Value::as_str)
                        .is_some_and(|t| t.eq_ignore_ascii_case(name))
                        && x.get("status").is_some_and(truth)
                }),
                _ => false,
            };
            Ok(NvkeCluster {
                id: id.to_owned(),
                provisioned: condition("provisioned"),
                provisioning: condition("provisioning"),
            })
        })
        .collect()
}

/// The largest answer of the management API read, 4 MiB (thousands of clusters).
pub const MAX_ANSWER: usize = 4 << 20;

/// How long one listing may take, from connecting to the answer's last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client for the management API: HTTPS only, no redirects, `timeout` per request, the
/// CAs of `cfg.caFile` alone when given. Errors name the field and the file.
pub fn http_client(cfg: &NvkeDiscovery, timeout: Duration) -> Result<reqwest::Client, ConfigError> {
    let mut builder = reqwest::Client::builder()
        .https_only(true)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT.min(timeout))
        .timeout(timeout);
    if let Some(path) = &cfg.ca_file {
        let at = |message: String| bad("caFile", format!("{}: {message}", path.display()));
        let pem = std::fs::read(path).map_err(|e| at(format!("cannot read it: {e}")))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| at(format!("not PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(at("holds no certificate".to_owned()));
        }
        builder = builder.tls_built_in_root_certs(false);
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder
        .build()
        .map_err(|e| bad("url", format!("cannot build an HTTPS client: {e}")))
}

/// The body of `response`, refused once it passes `limit` bytes (read no further).
async fn bounded_text(response: reqwest::Response, limit: usize) -> Result<String, String> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(format!("the answer is larger than {limit} bytes"));
    }
    let mut body = Vec::new();
    let mut response = response;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading the answer failed: {e}"))?
    {
        if body.len() + chunk.len() > limit {
            return Err(format!("the answer is larger than {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn failure(class: FailureClass, message: impl std::fmt::Display) -> ProviderError {
    ProviderError::new(
        ProviderId::Kube,
        Operation::Health,
        class,
        format!("NVKE discovery: {message}"),
    )
}

/// One listing: the clusters, or why they could not be listed.
async fn list(
    http: &reqwest::Client,
    cfg: &NvkeDiscovery,
    token: &str,
) -> Result<Vec<NvkeCluster>, ProviderError> {
    let url = format!("{}/api/clusters", cfg.url.trim_end_matches('/'));
    let response = http
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| failure(FailureClass::Transient, format!("GET {url} failed: {e}")))?;
    let status = response.status();
    let text = bounded_text(response, MAX_ANSWER)
        .await
        .map_err(|e| failure(FailureClass::Transient, format!("GET {url}: {e}")))?;
    let detail: String = text.chars().take(200).collect();
    match status.as_u16() {
        200..=299 => {}
        401 | 403 => {
            return Err(failure(
                FailureClass::Auth,
                format!("the management API refused the token ({status}): {detail}"),
            ));
        }
        _ => {
            return Err(failure(
                FailureClass::Transient,
                format!("GET {url} answered {status}: {detail}"),
            ));
        }
    }
    let body: Value = serde_json::from_str(&text).map_err(|e| {
        failure(
            FailureClass::Transient,
            format!("the answer is not JSON: {e}"),
        )
    })?;
    parse_clusters(&body).map_err(|e| failure(FailureClass::Transient, e))
}

/// What one round of discovery does, given what earlier rounds found.
struct Discovery {
    /// Weak, so that dropping the provider drops it (and its `Drop` stops this task).
    target: Weak<KubeTarget>,
    cfg: NvkeDiscovery,
    local: Client,
    own_namespace: String,
    http: reqwest::Client,
    /// Clusters this discovery added (statically configured ones are left alone).
    found: BTreeSet<String>,
}

impl Discovery {
    async fn round(&mut self, target: &KubeTarget) -> Result<(), ProviderError> {
        let (token_ns, token_name) = split_secret_ref(&self.cfg.token_secret, &self.own_namespace);
        let token = secret_text(&self.local, token_ns, token_name, &self.cfg.token_key)
            .await
            .map_err(|e| failure(FailureClass::Auth, format!("no token: {e}")))?;
        let clusters = list(&self.http, &self.cfg, token.trim()).await?;
        let ready: BTreeSet<&str> = clusters
            .iter()
            .filter(|c| c.ready())
            .map(|c| c.id.as_str())
            .collect();
        for id in &ready {
            if self.found.contains(*id) {
                target.set_offering(id, true);
                continue;
            }
            if !is_dns_label(id) {
                tracing::warn!(cluster = %id, "NVKE cluster id is not a DNS label; it is not used");
                continue;
            }
            let kubeconfig = match secret_text(
                &self.local,
                &self.own_namespace,
                id,
                &self.cfg.kubeconfig_key,
            )
            .await
            {
                Ok(k) => k,
                Err(e) => {
                    tracing::warn!(cluster = %id, error = %e, "NVKE cluster provisioned, but its kubeconfig is not readable yet");
                    continue;
                }
            };
            let origin = format!(
                "Secret {}/{id} key {:?}",
                self.own_namespace, self.cfg.kubeconfig_key
            );
            let client = match client_from_kubeconfig(&kubeconfig, &origin, false).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(cluster = %id, error = %e, "NVKE cluster's kubeconfig is not usable");
                    continue;
                }
            };
            let cluster = RemoteCluster {
                name: (*id).to_owned(),
                namespace: self.cfg.namespace.clone(),
                kubeconfig: KubeconfigSource {
                    secret: Some((*id).to_owned()),
                    key: Some(self.cfg.kubeconfig_key.clone()),
                    path: None,
                },
                gpu_prices: self.cfg.gpu_prices.clone(),
                surcharge_per_hour: self.cfg.surcharge_per_hour,
                allow_insecure_skip_tls_verify: false,
            };
            target.add_cluster(cluster, client);
            self.found.insert((*id).to_owned());
        }
        for id in &self.found {
            if !ready.contains(id.as_str()) {
                target.set_offering(id, false);
            }
        }
        Ok(())
    }
}

/// Starts discovery for `target`: every `cfg.intervalSeconds`, until the provider is dropped.
/// `local` reads the token and kubeconfig Secrets; `own_namespace` is where they are unless the
/// token's Secret names its namespace. An unreadable `caFile` is an error, and nothing starts.
pub fn discover(
    target: &Arc<KubeTarget>,
    cfg: NvkeDiscovery,
    local: Client,
    own_namespace: String,
) -> Result<(), ConfigError> {
    let http = http_client(&cfg, REQUEST_TIMEOUT)?;
    let interval = Duration::from_secs(cfg.interval_seconds.max(1));
    let mut discovery = Discovery {
        target: Arc::downgrade(target),
        cfg,
        local,
        own_namespace,
        http,
        found: BTreeSet::new(),
    };
    let task = tokio::spawn(async move {
        while let Some(target) = discovery.target.upgrade() {
            let outcome = discovery.round(&target).await;
            match &outcome {
                Ok(()) => tracing::debug!("NVKE discovery listed the workload clusters"),
                Err(e) => tracing::warn!(error = %e, "NVKE discovery failed"),
            }
            *target.discovery.lock() = outcome.err();
            drop(target);
            tokio::time::sleep(interval).await;
        }
    });
    target.tasks.lock().push(task);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clusters_are_read_from_the_shapes_the_api_may_answer_with() {
        let ours = json!({"clusters": [
            {"id": "wc-1", "conditions": {"provisioning": false, "provisioned": true}},
            {"id": "wc-2", "conditions": {"provisioning": true, "provisioned": false}}
        ]});
        let parsed = parse_clusters(&ours).unwrap();
        assert_eq!(
            parsed.iter().map(NvkeCluster::ready).collect::<Vec<_>>(),
            [true, false]
        );
        let listed = json!([{"id": "a", "conditions": [
            {"type": "Provisioned", "status": "True"}, {"type": "Provisioning", "status": "False"}
        ]}]);
        assert!(parse_clusters(&listed).unwrap()[0].ready());
        let items = json!({"items": [{"id": "b"}]});
        assert!(!parse_clusters(&items).unwrap()[0].ready());
        assert!(parse_clusters(&json!({"nope": 1})).is_err());
        assert_eq!(
            parse_clusters(&json!([{"name": "x"}])).unwrap_err(),
            "cluster 0 has no id"
        );
    }

    fn section() -> NvkeDiscovery {
        NvkeDiscovery {
            url: "https://nvke.example.com".into(),
            ca_file: None,
            token_secret: "nvke-token".into(),
            token_key: default_token_key(),
            namespace: "burst".into(),
            gpu_prices: BTreeMap::from([("H100".to_owned(), 2.0)]),
            surcharge_per_hour: 0.0,
            kubeconfig_key: default_kubeconfig_key(),
            interval_seconds: 30,
        }
    }

    /// A section for `sim`, trusting its certificate from a file in `dir`.
    fn trusting(sim: &neocloud_cloudsim::NvkeSim, dir: &std::path::Path) -> NvkeDiscovery {
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, sim.ca_pem()).unwrap();
        NvkeDiscovery {
            url: sim.base_url(),
            ca_file: Some(ca),
            ..section()
        }
    }

    #[tokio::test]
    async fn the_client_refuses_an_oversized_answer_and_one_that_never_comes() {
        let sim = neocloud_cloudsim::NvkeSim::start("jwt").await.unwrap();
        sim.add_cluster("wc-1", "west", Duration::ZERO);
        let dir = tempfile::tempdir().unwrap();
        let cfg = trusting(&sim, dir.path());
        let http = http_client(&cfg, Duration::from_secs(2)).unwrap();
        assert_eq!(list(&http, &cfg, "jwt").await.unwrap().len(), 1);

        sim.set_padding(MAX_ANSWER);
        let e = list(&http, &cfg, "jwt").await.unwrap_err();
        assert!(e.message.contains("larger than 4194304 bytes"), "{e}");

        sim.set_padding(0);
        sim.set_stalled(true);
        let stalled = tokio::time::timeout(Duration::from_secs(60), list(&http, &cfg, "jwt"));
        let e = stalled
            .await
            .expect("the request has a deadline")
            .unwrap_err();
        assert_eq!(e.class, FailureClass::Transient, "{e}");
    }

    #[tokio::test]
    async fn the_client_speaks_only_https_to_a_certificate_it_trusts() {
        let sim = neocloud_cloudsim::NvkeSim::start("jwt").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let trusted = trusting(&sim, dir.path());
        let http = http_client(&trusted, Duration::from_secs(5)).unwrap();
        list(&http, &trusted, "jwt").await.unwrap();

        // The system roots do not know the simulator's self-signed certificate.
        let roots = NvkeDiscovery {
            ca_file: None,
            ..trusted.clone()
        };
        let http = http_client(&roots, Duration::from_secs(5)).unwrap();
        list(&http, &roots, "jwt").await.unwrap_err();

        // Even past validation, the client sends nothing over plain HTTP.
        let plain = NvkeDiscovery {
            url: trusted.url.replace("https://", "http://"),
            ..trusted.clone()
        };
        let http = http_client(&plain, Duration::from_secs(5)).unwrap();
        let e = list(&http, &plain, "jwt").await.unwrap_err();
        assert!(e.message.contains("GET http://"), "{e}");
        assert_eq!(sim.requests(), 1, "only the trusted HTTPS request arrived");

        let missing = NvkeDiscovery {
            ca_file: Some(dir.path().join("absent.pem")),
            ..trusted
        };
        let e = http_client(&missing, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.field, "nvke.caFile");
        assert!(e.message.contains("absent.pem"), "{e}");
    }

    #[test]
    fn bad_sections_are_refused_by_field() {
        let good = section();
        good.validate().unwrap();
        let field = |edit: &dyn Fn(&mut NvkeDiscovery)| {
            let mut c = good.clone();
            edit(&mut c);
            c.validate().unwrap_err().field
        };
        assert_eq!(field(&|c| c.url = "ftp://x".into()), "nvke.url");
        assert_eq!(field(&|c| c.url = "nvke.example.com".into()), "nvke.url");
        let mut plain = good.clone();
        plain.url = "http://nvke.example.com:30080".into();
        let e = plain.validate().unwrap_err();
        assert_eq!(e.field, "nvke.url");
        assert!(
            e.message
                .contains("\"http://nvke.example.com:30080\" is not an https URL"),
            "{e}"
        );
        assert_eq!(
            field(&|c| c.token_secret = "A/b".into()),
            "nvke.tokenSecret"
        );
        assert_eq!(field(&|c| c.namespace = "".into()), "nvke.namespace");
        assert_eq!(field(&|c| c.interval_seconds = 0), "nvke.intervalSeconds");
        assert_eq!(
            field(&|c| {
                c.gpu_prices.insert("A40".into(), 0.0);
            }),
            "nvke.gpuPrices[\"A40\"]"
        );
    }
}
