//! Kueue's install manifests, made fit for a control plane on loopback: the CRDs (Kueue's and the
//! ProvisioningRequest CRD) and the webhook configurations that `hack/testenv/build-kueue.sh`
//! copied from the module sources, with every `clientConfig` rewritten from Kueue's in-cluster
//! Service to `https://127.0.0.1:<port><path>` and the rig's CA bundle (no Service routing exists
//! here), and the webhooks of integrations the rig does not enable left out.
//!
//! It installs them and waits until the CRDs are Established. It does not run Kueue (that is
//! [`super::Kueue`]) and it is no general manifest applier: it knows these three kinds only.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde::{Deserialize as _, Serialize};
use serde_json::{Value, json};

use crate::Error;

/// The largest manifest file read (Kueue v0.17's Workload CRD is 1.4 MB).
const MAX_MANIFEST_BYTES: u64 = 8 << 20;

/// How long the API server may take to establish the CRDs.
const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// The field manager of everything the rig applies for Kueue.
const FIELD_MANAGER: &str = "neocloud-testenv";

/// The CRDs that Kueue serves in two versions and converts through its `/convert` webhook (the
/// `webhook_in_*` patches of Kueue's `config/components/crd/kustomization.yaml`).
const CONVERTED_CRDS: [&str; 5] = [
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
];

/// Where Kueue's webhook server listens, and the CA that signed its certificate.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub(crate) port: u16,
    pub(crate) ca_pem: String,
}

impl Endpoint {
    /// A client config that reaches `path` on the webhook server directly, trusting the rig's CA.
    fn client_config(&self, path: &str) -> Result<WebhookClientConfig, String> {
        let url = http::Uri::builder()
            .scheme("https")
            .authority(format!("127.0.0.1:{}", self.port))
            .path_and_query(path)
            .build()
            .map_err(|e| format!("webhook path {path:?}: {e}"))?;
        Ok(WebhookClientConfig {
            url: Some(url.to_string()),
            ca_bundle: Some(ByteString(self.ca_pem.as_bytes().to_vec())),
            service: None,
        })
    }
}

/// Everything to install, read from the directory beside the kueue binary.
#[derive(Debug)]
pub(crate) struct Manifests {
    pub(crate) crds: Vec<CustomResourceDefinition>,
    pub(crate) mutating: MutatingWebhookConfiguration,
    pub(crate) validating: ValidatingWebhookConfiguration,
}

impl Manifests {
    /// Reads `<dir>/crds/*.yaml` and `<dir>/webhook/manifests.yaml` and rewrites them for
    /// `endpoint`, keeping only the webhooks whose rules are all in `groups`.
    pub(crate) fn read(dir: &Path, endpoint: &Endpoint, groups: &[&str]) -> Result<Self, Error> {
        let mut crds = Vec::new();
        for path in yaml_files(&dir.join("crds"))? {
            let mut crd: CustomResourceDefinition = single(&path)?;
            if let Some(name) = crd.metadata.name.as_deref()
                && CONVERTED_CRDS.contains(&name)
            {
                convert_through(&mut crd, endpoint).map_err(|m| manifest(&path, m))?;
            }
            crds.push(crd);
        }
        let path = dir.join("webhook/manifests.yaml");
        let (mutating, validating) =
            webhooks(&read_bounded(&path)?, endpoint, groups).map_err(|m| manifest(&path, m))?;
        Ok(Self {
            crds,
            mutating,
            validating,
        })
    }

    /// Applies everything (server-side, so a second install updates the first) and waits until
    /// every CRD is Established.
    pub(crate) async fn install(&self, client: &Client) -> Result<(), Error> {
        for crd in &self.crds {
            apply(Api::<CustomResourceDefinition>::all(client.clone()), crd).await?;
        }
        for crd in &self.crds {
            established(client, crd.metadata.name.as_deref().unwrap_or_default()).await?;
        }
        apply(Api::all(client.clone()), &self.mutating).await?;
        apply(Api::all(client.clone()), &self.validating).await
    }
}

/// Applies the one CRD of the file `path` as it is and waits until it is Established.
pub(crate) async fn install_crd(client: &Client, path: &Path) -> Result<(), Error> {
    let crd: CustomResourceDefinition = single(path)?;
    apply(Api::<CustomResourceDefinition>::all(client.clone()), &crd).await?;
    established(client, crd.metadata.name.as_deref().unwrap_or_default()).await
}

fn manifest(path: &Path, message: impl Into<String>) -> Error {
    Error::Manifest {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// The `*.yaml` files of `dir`, sorted.
fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| Error::io(format!("list {}", dir.display()), e))?
            .path();
        if path.extension().is_some_and(|x| x == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The file's text, refusing one larger than [`MAX_MANIFEST_BYTES`].
fn read_bounded(path: &Path) -> Result<String, Error> {
    let what = || format!("read {}", path.display());
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io(what(), e))?
        .len();
    if size > MAX_MANIFEST_BYTES {
        let limit = MAX_MANIFEST_BYTES;
        return Err(manifest(
            path,
            format!("{size} bytes, over the {limit} read"),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| Error::io(what(), e))
}

/// The one object a YAML file holds.
fn single<T: DeserializeOwned>(path: &Path) -> Result<T, Error> {
    serde_yaml::from_str(&read_bounded(path)?).map_err(|e| manifest(path, e.to_string()))
}

/// Points the CRD's version conversion at Kueue's `/convert` endpoint.
fn convert_through(crd: &mut CustomResourceDefinition, endpoint: &Endpoint) -> Result<(), String> {
    let client_config =
        serde_json::to_value(endpoint.client_config("/convert")?).map_err(|e| e.to_string())?;
    crd.spec.conversion = Some(
        serde_json::from_value(json!({
            "strategy": "Webhook",
            "webhook": {"clientConfig": client_config, "conversionReviewVersions": ["v1"]},
        }))
        .map_err(|e| e.to_string())?,
    );
    Ok(())
}

/// Kueue's two webhook configurations from `text` (the module's `manifests.yaml`), named as a
/// Kueue install names them, with only the webhooks for `groups`, each calling `endpoint`.
fn webhooks(
    text: &str,
    endpoint: &Endpoint,
    groups: &[&str],
) -> Result<(MutatingWebhookConfiguration, ValidatingWebhookConfiguration), String> {
    let mut mutating = None;
    let mut validating = None;
    for doc in serde_yaml::Deserializer::from_str(text) {
        let mut value = Value::deserialize(doc).map_err(|e| e.to_string())?;
        rewrite_webhooks(&mut value, endpoint, groups)?;
        let kind = value["kind"].as_str().unwrap_or_default().to_owned();
        value["metadata"] = json!({"name": format!("kueue-{}", value["metadata"]["name"].as_str().unwrap_or_default())});
        match kind.as_str() {
            "MutatingWebhookConfiguration" => mutating = Some(from_value(value)?),
            "ValidatingWebhookConfiguration" => validating = Some(from_value(value)?),
            other => return Err(format!("unexpected kind {other:?}")),
        }
    }
    match (mutating, validating) {
        (Some(m), Some(v)) => Ok((m, v)),
        _ => Err("a mutating and a validating webhook configuration are expected".into()),
    }
}

/// Keeps the webhooks of `config` whose rules' API groups are all in `groups`, each calling
/// its path at `endpoint` instead of through Kueue's Service.
fn rewrite_webhooks(
    config: &mut Value,
    endpoint: &Endpoint,
    groups: &[&str],
) -> Result<(), String> {
    let hooks = config["webhooks"].as_array_mut().ok_or("no webhooks")?;
    hooks.retain(|hook| {
        let rules = hook["rules"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        rules.iter().all(|rule| {
            let api_groups = rule["apiGroups"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            api_groups
                .iter()
                .all(|g| g.as_str().is_some_and(|g| groups.contains(&g)))
        })
    });
    for hook in hooks {
        let path = hook["clientConfig"]["service"]["path"]
            .as_str()
            .ok_or("a webhook without a service path")?;
        hook["clientConfig"] =
            serde_json::to_value(endpoint.client_config(path)?).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// Server-side applies `object` (named in its metadata), taking over any field.
async fn apply<K>(api: Api<K>, object: &K) -> Result<(), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(object)).await?;
    Ok(())
}

/// Waits until the CRD `name` has the condition Established=True.
async fn established(client: &Client, name: &str) -> Result<(), Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let start = Instant::now();
    loop {
        let crd = crds.get(name).await?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
        {
            return Ok(());
        }
        if start.elapsed() > ESTABLISHED_TIMEOUT {
            return Err(Error::Manifest {
                path: name.into(),
                message: format!("not Established after {ESTABLISHED_TIMEOUT:?}: {conditions:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFESTS: &str = r#"---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}
  failurePolicy: Fail
  name: mjob.kb.io
  rules:
  - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-ray-io-v1-rayjob}
  failurePolicy: Fail
  name: mrayjob.kb.io
  rules:
  - {apiGroups: [ray.io], apiVersions: [v1], operations: [CREATE], resources: [rayjobs]}
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-kueue-x-k8s-io-v1beta2-workload}
  failurePolicy: Fail
  name: vworkload.kb.io
  rules:
  - {apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE, UPDATE], resources: [workloads, workloads/status]}
  sideEffects: None
"#;

    fn endpoint() -> Endpoint {
        Endpoint {
            port: 9443,
            ca_pem: "-----BEGIN CERTIFICATE-----\n".into(),
        }
    }

    #[test]
    fn webhooks_call_loopback_with_the_ca_and_skip_integrations_not_enabled() {
        let groups = ["kueue.x-k8s.io", "batch"];
        let (m, v) = webhooks(MANIFESTS, &endpoint(), &groups).unwrap();
        assert_eq!(
            m.metadata.name.as_deref(),
            Some("kueue-mutating-webhook-configuration")
        );
        let hooks = m.webhooks.unwrap();
        assert_eq!(hooks.len(), 1, "the ray webhook is left out");
        let config = &hooks[0].client_config;
        assert_eq!(
            config.url.as_deref(),
            Some("https://127.0.0.1:9443/mutate-batch-v1-job")
        );
        assert!(config.service.is_none());
        assert_eq!(
            config.ca_bundle.as_ref().unwrap().0,
            endpoint().ca_pem.as_bytes()
        );
        let hooks = v.webhooks.unwrap();
        assert_eq!(
            hooks[0].client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/validate-kueue-x-k8s-io-v1beta2-workload")
        );
    }

    #[test]
    fn a_manifest_without_both_configurations_is_refused() {
        let only_mutating = MANIFESTS.split("\n---\n").next().unwrap();
        let err = webhooks(only_mutating, &endpoint(), &["batch"]).unwrap_err();
        assert!(err.contains("validating"), "{err}");
    }

    #[test]
    fn converted_crds_call_the_convert_endpoint() {
        let mut crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": "workloads.kueue.x-k8s.io"},
            "spec": {"group": "kueue.x-k8s.io", "scope": "Namespaced", "versions": [],
                "names": {"plural": "workloads", "kind": "Workload"}},
        }))
        .unwrap();
        convert_through(&mut crd, &endpoint()).unwrap();
        let conversion = crd.spec.conversion.unwrap();
        assert_eq!(conversion.strategy, "Webhook");
        let config = conversion.webhook.unwrap().client_config.unwrap();
        assert_eq!(
            config.url.as_deref(),
            Some("https://127.0.0.1:9443/convert")
        );
    }
}
