//! Kubeconfig files for the control plane's identities, usable by kubectl, by the components
//! themselves and by kube-rs.
//!
//! It only writes files and loads clients from them; it does not manage contexts or merge files.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::Error;
use crate::pki::CertPair;

/// Where a kubeconfig points and who it authenticates as.
#[derive(Debug, Clone)]
pub struct KubeconfigSpec {
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// The CA certificate file that verifies the server.
    pub ca_file: PathBuf,
    /// The client certificate and key files, or `None` for an anonymous caller.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Writes a kubeconfig with one cluster, one user and one current context named `testenv`.
pub fn write(path: &Path, spec: &KubeconfigSpec) -> Result<PathBuf, Error> {
    let mut user = serde_json::Map::new();
    if let Some((cert, key)) = &spec.client {
        user.insert(
            "client-certificate".into(),
            cert.display().to_string().into(),
        );
        user.insert("client-key".into(), key.display().to_string().into());
    }
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {
            "server": &spec.server,
            "certificate-authority": spec.ca_file.display().to_string(),
        }}],
        "users": [{"name": "testenv", "user": user}],
        "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": "testenv"}}],
        "current-context": "testenv",
    });
    let yaml = serde_yaml::to_string(&doc).map_err(|e| Error::Kubeconfig {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    std::fs::write(path, yaml).map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    Ok(path.to_owned())
}

/// A kubeconfig whose CA and client certificate are inline (`certificate-authority-data`,
/// `client-certificate-data`, `client-key-data`), as a remote cluster's Secret must hold it.
pub fn inline(server: &str, ca_pem: &str, client: &CertPair) -> Result<String, Error> {
    use base64::Engine as _;
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem.as_bytes());
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": "testenv", "user": {
            "client-certificate-data": b64(&client.cert_pem),
            "client-key-data": b64(&client.key_pem),
        }}],
        "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": "testenv"}}],
        "current-context": "testenv",
    });
    serde_yaml::to_string(&doc).map_err(|e| Error::Kubeconfig {
        path: PathBuf::from("(inline)"),
        message: e.to_string(),
    })
}

/// A kube-rs client for the kubeconfig at `path`. Must be called inside a Tokio runtime, and the
/// client must be used in that runtime only.
pub async fn client(path: &Path) -> Result<kube::Client, Error> {
    let fail = |message: String| Error::Kubeconfig {
        path: path.to_owned(),
        message,
    };
    let kc = Kubeconfig::read_from(path).map_err(|e| fail(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| fail(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| fail(e.to_string()))
}
