//! A real OCI registry on loopback: the CNCF `distribution` registry (`registry serve`, Debian's
//! `docker-registry` package, linked by `hack/testenv/build-registry.sh`), for tests that push and pull
//! images over the same protocol a node uses against a production registry.
//!
//! [`Registry::start`] serves HTTPS on `127.0.0.1:<free port>` with a certificate for the IP
//! 127.0.0.1 signed by a fresh CA ([`Registry::ca_pem`] is what clients trust, not the leaf),
//! requires HTTP basic auth from an htpasswd file holding one user with a random password
//! (bcrypt, the only hash the registry accepts), and stores blobs on the filesystem in its own
//! temporary directory, where it also logs. It is ready when `GET /v2/` answers 401.
//! [`Registry::stop`] kills it and leaves the port unused, for "the registry is down" cases.
//! Dropping it kills the process and removes the directory; a registry that is never dropped (a
//! `static`) stops with the test process, as every [`crate::ControlPlane`] component does. Set
//! `NEOCLOUD_TESTENV_KEEP=1` to keep the directory (configuration, certificates, log, blobs).
//!
//! It is not a production registry or a mirror: one user, no token service, no proxy cache, no
//! garbage collection, certificates valid for a year, and it never builds the binary (`make
//! testenv` does; this module says so when it is missing).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;
use rand::distr::Alphanumeric;

use crate::pki::Pki;
use crate::process::Supervised;
use crate::{Error, binaries, readiness, write_file};

/// The environment variable that overrides where the registry binary is: the binary itself, or a
/// directory holding `registry`.
pub const BIN_ENV: &str = "NEOCLOUD_REGISTRY_BIN";

/// The user in the htpasswd file.
const USERNAME: &str = "neocloud";

/// The basic-auth realm the registry announces in `WWW-Authenticate`.
pub const REALM: &str = "neocloud-testenv";

/// How long the registry may take to answer `GET /v2/` after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running registry. Dropping it stops the process and removes its directory.
pub struct Registry {
    process: Supervised,
    dir: PathBuf,
    port: u16,
    ca_pem: String,
    username: String,
    password: String,
    keep_dir: bool,
    /// The log as it was just before [`Registry::stop`], whose supervisor removes the directory.
    stopped_log: Option<String>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("host", &self.host())
            .field("dir", &self.dir)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Starts a registry with a fresh CA, user and storage, and waits until it is ready.
    /// On failure, stops it and returns an error that carries the end of its log.
    pub async fn start() -> Result<Self, Error> {
        Self::start_at(None).await
    }

    /// Starts a registry on `port` (one a stopped registry used: the same host coming back,
    /// with a fresh CA, user and storage).
    pub async fn start_on(port: u16) -> Result<Self, Error> {
        Self::start_at(Some(port)).await
    }

    async fn start_at(port: Option<u16>) -> Result<Self, Error> {
        let bin = locate()?;
        let keep_dir = std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("neocloud-registry-")
            .tempdir()
            .map_err(|e| Error::io("create the registry directory", e))?
            .keep();
        match Self::start_in(&bin, dir.clone(), keep_dir, port).await {
            Ok(registry) => Ok(registry),
            Err(e) => {
                if !keep_dir {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                Err(e)
            }
        }
    }

    async fn start_in(
        bin: &Path,
        dir: PathBuf,
        keep_dir: bool,
        port: Option<u16>,
    ) -> Result<Self, Error> {
        let port = match port {
            Some(port) => port,
            None => readiness::free_port()?,
        };
        let pki = Pki::new()?;
        let serving = pki.serving("neocloud-testenv-registry")?;
        let password: String = rand::rng()
            .sample_iter(&Alphanumeric)
            .take(24)
            .map(char::from)
            .collect();
        // The lowest cost bcrypt allows: the registry verifies the hash on every request.
        let hash = bcrypt::hash(&password, 4)
            .map_err(|e| Error::io("hash the registry password", std::io::Error::other(e)))?;

        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage)
            .map_err(|e| Error::io(format!("create {}", storage.display()), e))?;
        write_file(&dir.join("tls.crt"), &serving.cert_pem)?;
        write_file(&dir.join("tls.key"), &serving.key_pem)?;
        write_file(&dir.join("ca.crt"), &pki.ca_pem())?;
        write_file(&dir.join("htpasswd"), &format!("{USERNAME}:{hash}\n"))?;
        let secret: String = rand::rng()
            .sample_iter(&Alphanumeric)
            .take(32)
            .map(char::from)
            .collect();
        let config = serde_json::json!({
            "version": "0.1",
            "log": {"level": "info", "accesslog": {"disabled": false}},
            "storage": {
                "filesystem": {"rootdirectory": storage},
                "delete": {"enabled": true},
                "maintenance": {"uploadpurging": {"enabled": false}},
            },
            "http": {
                "addr": format!("127.0.0.1:{port}"),
                "secret": secret,
                "tls": {"certificate": dir.join("tls.crt"), "key": dir.join("tls.key")},
            },
            "auth": {"htpasswd": {"realm": REALM, "path": dir.join("htpasswd")}},
        });
        let config_path = dir.join("config.yml");
        let yaml = serde_yaml::to_string(&config).map_err(|e| {
            Error::io(
                format!("render {}", config_path.display()),
                std::io::Error::other(e),
            )
        })?;
        write_file(&config_path, &yaml)?;

        let args = vec!["serve".to_owned(), config_path.display().to_string()];
        let cleanup = (!keep_dir).then_some(dir.as_path());
        let mut process =
            Supervised::spawn("registry", bin, &args, &dir.join("registry.log"), cleanup)?;
        let ca_pem = pki.ca_pem();
        let client = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(ca_pem.as_bytes())
                    .map_err(|e| Error::io("load the registry CA", std::io::Error::other(e)))?,
            )
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| Error::io("build the registry probe", std::io::Error::other(e)))?;
        let url = format!("https://127.0.0.1:{port}/v2/");
        readiness::wait_until_ready(&mut process, READY_TIMEOUT, || {
            let request = client.get(&url);
            async move {
                let response = request.send().await.map_err(|e| chain(&e))?;
                match response.status().as_u16() {
                    401 => Ok(()),
                    other => Err(format!("GET /v2/ answered {other}, not 401")),
                }
            }
        })
        .await?;
        Ok(Self {
            process,
            dir,
            port,
            ca_pem,
            username: USERNAME.to_owned(),
            password,
            keep_dir,
            stopped_log: None,
        })
    }

    /// `127.0.0.1:<port>`: the registry part of an image reference, such as
    /// `127.0.0.1:5000/team/app:v1`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `https://127.0.0.1:<port>`, the base of the registry API (`/v2/...`).
    pub fn url(&self) -> String {
        format!("https://{}", self.host())
    }

    /// The CA certificate that signed the registry's serving certificate, PEM: what a client
    /// must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The one user that may pull and push.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The user's password (random for each registry).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The CA certificate file (`ca.crt` in [`Self::dir`]), for tools that take a path.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The registry's directory: configuration, certificates, htpasswd, log and blobs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills the registry and waits until it is gone. Its port is then refused; nothing else
    /// takes it. Stopping twice does nothing.
    pub fn stop(&mut self) {
        if self.stopped_log.is_none() && self.process.exited().is_none() {
            self.stopped_log = std::fs::read(self.process.log_path())
                .ok()
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
        }
        self.process.stop();
    }

    /// The last `lines` lines of the registry's log (its access log included).
    pub fn log_tail(&self, lines: usize) -> String {
        match &self.stopped_log {
            Some(text) if !self.process.log_path().exists() => {
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            _ => self.process.log_tail(lines),
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.process.stop();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The registry binary: `$NEOCLOUD_REGISTRY_BIN` (the binary or its directory) if set, else
/// `registry` in the cache directory that `hack/testenv/build-registry.sh --print` names for the
/// pinned version. It must exist.
pub fn locate() -> Result<PathBuf, Error> {
    binaries::tool(BIN_ENV, "registry", "build-registry.sh", "OCI registry")
}

/// An error and its causes on one line: reqwest's own message omits the TLS or socket reason.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_script_names_a_cache_directory_outside_the_repository() {
        let name = binaries::cache_dir_name(&binaries::printed_dir("build-registry.sh").unwrap());
        assert!(name.starts_with("registry-debian-"), "{name}");
    }

    #[test]
    fn a_missing_registry_is_named_with_the_command_that_builds_it() {
        let err = Error::MissingTool {
            tool: "OCI registry".into(),
            path: "/x/registry".into(),
            script: "build-registry.sh".into(),
            env: BIN_ENV.into(),
        };
        let text = err.to_string();
        assert!(text.contains("/x/registry"), "{text}");
        assert!(text.contains("make testenv"), "{text}");
        assert!(text.contains(BIN_ENV), "{text}");
    }
}
