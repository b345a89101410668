//! Image pull credentials: reading a `kubernetes.io/dockerconfigjson` Secret's
//! `.dockerconfigjson`, and choosing the entry for an image's registry the way the kubelet does
//! (the image's registry host, `docker.io` for a name without one, and an entry's path as a
//! prefix of the image's repository; Docker Hub's aliases are one registry).
//!
//! Not for reading Secrets (the node does that) and not for logging in anywhere (each provider
//! and the runner do that). A password never appears in a `Debug` or an error.

use std::fmt;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The Secret type `imagePullSecrets` must have.
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";

/// The Secret key holding the Docker config.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";

/// The registry an image without a registry host is pulled from.
pub const DOCKER_HUB: &str = "docker.io";

/// A login to one registry. `Debug` shows the registry and user, never the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryCredential {
    /// The registry host (and port) the credential is for: `docker.io`, `ghcr.io`,
    /// `registry.example.com:5000`.
    pub server: String,
    /// The user name.
    pub username: String,
    /// The password or token.
    pub password: String,
}

impl fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryCredential")
            .field("server", &self.server)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a `.dockerconfigjson` could not be used. Never carries a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullSecretError {
    /// Not JSON, or not `{"auths": {...}}`.
    #[error("{DOCKER_CONFIG_JSON_KEY} is not a docker config ({0})")]
    Malformed(String),
    /// An entry has neither `username`/`password` nor a base64 `user:pass` `auth`.
    #[error("{DOCKER_CONFIG_JSON_KEY} entry {0:?} has no username and password")]
    NoLogin(String),
}

#[derive(Deserialize)]
struct DockerConfig {
    auths: std::collections::BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    username: Option<String>,
    password: Option<String>,
    auth: Option<String>,
}

/// One entry of a docker config: where it applies, and its login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    /// The registry host, Docker Hub's aliases folded into `docker.io`.
    pub host: String,
    /// A repository prefix (`team` in `registry.example.com/team`), empty for the whole registry.
    pub path: String,
    /// The login, with `server` set to `host`.
    pub login: RegistryCredential,
}

/// The entries of a `.dockerconfigjson`, in the order of their keys.
pub fn parse_docker_config(bytes: &[u8]) -> Result<Vec<ConfigEntry>, PullSecretError> {
    let config: DockerConfig = serde_json::from_slice(bytes).map_err(|e| {
        // Only the kind and the position: serde's own message may quote a value.
        let what = match e.classify() {
            serde_json::error::Category::Data => "want {\"auths\": {REGISTRY: {...}}}",
            _ => "invalid JSON",
        };
        PullSecretError::Malformed(format!("{what} at line {} column {}", e.line(), e.column()))
    })?;
    config
        .auths
        .into_iter()
        .map(|(key, entry)| {
            let (username, password) =
                login(&entry).ok_or(PullSecretError::NoLogin(key.clone()))?;
            let (host, path) = split_key(&key);
            let login = RegistryCredential {
                server: host.clone(),
                username,
                password,
            };
            Ok(ConfigEntry { host, path, login })
        })
        .collect()
}

fn login(entry: &AuthEntry) -> Option<(String, String)> {
    if let (Some(u), Some(p)) = (&entry.username, &entry.password)
        && !u.is_empty()
    {
        return Some((u.clone(), p.clone()));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry.auth.as_deref()?.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    (!u.is_empty()).then(|| (u.to_owned(), p.to_owned()))
}

/// A config key (`https://index.docker.io/v1/`, `ghcr.io`, `registry:5000/team`) as a host and
/// a repository prefix.
fn split_key(key: &str) -> (String, String) {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let (host, path) = key.split_once('/').unwrap_or((key, ""));
    let path = path.trim_end_matches('/');
    // Docker Hub's legacy key names an API version, not a repository.
    let path = if is_docker_hub(host) && (path == "v1" || path == "v2") {
        ""
    } else {
        path
    };
    (canonical_host(host), path.to_owned())
}

fn is_docker_hub(host: &str) -> bool {
    matches!(
        host.to_ascii_lowercase().as_str(),
        "docker.io" | "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com"
    )
}

fn canonical_host(host: &str) -> String {
    if is_docker_hub(host) {
        DOCKER_HUB.to_owned()
    } else {
        host.to_ascii_lowercase()
    }
}

/// The registry host of `image` and its repository path, as the kubelet reads them: the first
/// component is a host when it has a `.` or `:` or is `localhost`, else the image is on Docker
/// Hub (`library/` added to a one-component name).
pub fn image_registry(image: &str) -> (String, String) {
    let name = image.split('@').next().unwrap_or(image);
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let name = match name[last_slash..].rfind(':') {
        Some(i) => &name[..last_slash + i],
        None => name,
    };
    match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (canonical_host(first), rest.to_owned())
        }
        Some(_) => (DOCKER_HUB.to_owned(), name.to_owned()),
        None => (DOCKER_HUB.to_owned(), format!("library/{name}")),
    }
}

/// The login for `image` among `entries`: same host, and the longest path that prefixes the
/// image's repository.
pub fn login_for<'a>(image: &str, entries: &'a [ConfigEntry]) -> Option<&'a RegistryCredential> {
    let (host, repository) = image_registry(image);
    entries
        .iter()
        .filter(|e| e.host == host)
        .filter(|e| {
            e.path.is_empty()
                || repository == e.path
                || repository.starts_with(&format!("{}/", e.path))
        })
        .max_by_key(|e| e.path.len())
        .map(|e| &e.login)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn an_image_without_a_host_is_on_docker_hub() {
        assert_eq!(
            image_registry("nginx:1.27"),
            ("docker.io".into(), "library/nginx".into())
        );
        assert_eq!(
            image_registry("team/app@sha256:abc"),
            ("docker.io".into(), "team/app".into())
        );
        assert_eq!(
            image_registry("index.docker.io/team/app"),
            ("docker.io".into(), "team/app".into())
        );
    }

    #[test]
    fn a_first_component_with_a_dot_a_port_or_localhost_is_the_registry() {
        assert_eq!(image_registry("ghcr.io/org/app:v1").0, "ghcr.io".to_owned());
        assert_eq!(
            image_registry("registry:5000/app:v1"),
            ("registry:5000".into(), "app".into())
        );
        assert_eq!(image_registry("localhost/app").0, "localhost".to_owned());
    }

    #[test]
    fn docker_hubs_legacy_key_matches_a_docker_hub_image() {
        let json = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{}"}}}}}}"#,
            b64("me:s3cret")
        );
        let entries = parse_docker_config(json.as_bytes()).unwrap();
        let login = login_for("me/private:1", &entries).unwrap();
        assert_eq!(
            (
                login.server.as_str(),
                login.username.as_str(),
                login.password.as_str()
            ),
            ("docker.io", "me", "s3cret")
        );
    }

    #[test]
    fn username_and_password_fields_win_over_auth() {
        let json = br#"{"auths":{"ghcr.io":{"username":"u","password":"p","auth":"eDp5"}}}"#;
        let entries = parse_docker_config(json).unwrap();
        let login = login_for("ghcr.io/org/app", &entries).unwrap();
        assert_eq!(
            (login.username.as_str(), login.password.as_str()),
            ("u", "p")
        );
    }

    #[test]
    fn the_longest_matching_path_is_chosen_and_other_hosts_are_not() {
        let json = br#"{"auths":{
            "reg.example.com":{"username":"all","password":"1"},
            "reg.example.com/team":{"username":"team","password":"2"},
            "other.example.com":{"username":"other","password":"3"}}}"#;
        let entries = parse_docker_config(json).unwrap();
        let user = |image: &str| login_for(image, &entries).map(|l| l.username.clone());
        assert_eq!(user("reg.example.com/team/app:1").as_deref(), Some("team"));
        assert_eq!(user("reg.example.com/teamx/app").as_deref(), Some("all"));
        assert_eq!(user("ghcr.io/team/app"), None);
        assert_eq!(user("team/app"), None);
    }

    #[test]
    fn malformed_json_and_entries_without_a_login_are_refused_without_their_values() {
        let err = parse_docker_config(b"{\"auths\": [secret").unwrap_err();
        assert!(matches!(err, PullSecretError::Malformed(_)), "{err}");
        assert!(!err.to_string().contains("secret"));
        let err =
            parse_docker_config(br#"{"auths":{"ghcr.io":{"auth":"bm9jb2xvbg=="}}}"#).unwrap_err();
        assert_eq!(err, PullSecretError::NoLogin("ghcr.io".into()));
        let err = parse_docker_config(br#"{"auths":{"ghcr.io":"hunter2"}}"#).unwrap_err();
        assert!(err.to_string().contains("want {\"auths\""), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn debug_never_shows_the_password() {
        let login = RegistryCredential {
            server: "ghcr.io".into(),
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{login:?}").contains("hunter2"));
    }
}
