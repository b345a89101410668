//! Private registries the simulated machines pull from: an image on a configured registry host
//! is pulled only with that registry's user name and password, as `docker pull` would, and
//! otherwise fails with Docker's pull error (which the simulators show on the instance).
//!
//! Not a registry: no image is stored or served. Images on hosts not configured are public.

use serde::{Deserialize, Serialize};

/// A private registry and the one login it accepts. `Debug` redacts the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivateRegistry {
    /// The registry host as an image names it (`registry.example.com`, `docker.io` for Docker
    /// Hub images).
    pub host: String,
    /// The user name it accepts.
    pub username: String,
    /// The password it accepts.
    pub password: String,
}

impl std::fmt::Debug for PrivateRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateRegistry")
            .field("host", &self.host)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// A login offered with a pull: the user, the password, and the registry it names, if it names
/// one (Vast's `image_login` does; a RunPod credential does not).
#[derive(Clone, Copy)]
pub(crate) struct Login<'a> {
    pub username: &'a str,
    pub password: &'a str,
    pub registry: Option<&'a str>,
}

/// The registry host of an image: its first component when that has a `.` or `:` or is
/// `localhost`, else Docker Hub.
pub(crate) fn host_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            match first {
                "index.docker.io" | "registry-1.docker.io" => "docker.io",
                _ => first,
            }
        }
        _ => "docker.io",
    }
}

/// Docker's error when `image` cannot be pulled with `login` from `registries`; `None` when it
/// can (a public image, or the right login).
pub(crate) fn pull_error(
    registries: &[PrivateRegistry],
    image: &str,
    login: Option<Login<'_>>,
) -> Option<String> {
    let host = host_of(image);
    let private = registries.iter().find(|r| r.host == host)?;
    let accepted = login.is_some_and(|l| {
        l.username == private.username
            && l.password == private.password
            && l.registry
                .is_none_or(|r| host_of(&format!("{r}/x")) == host)
    });
    (!accepted).then(|| {
        let repository = image.split(['@']).next().unwrap_or(image);
        format!(
            "Error response from daemon: pull access denied for {repository}, repository does \
             not exist or may require 'docker login': denied: requested access to the resource \
             is denied"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registries() -> Vec<PrivateRegistry> {
        vec![PrivateRegistry {
            host: "registry.example.com".into(),
            username: "u".into(),
            password: "p".into(),
        }]
    }

    #[test]
    fn a_private_image_pulls_only_with_its_registrys_login() {
        let r = registries();
        let image = "registry.example.com/team/app:1";
        let login = |password, registry| Login {
            username: "u",
            password,
            registry,
        };
        assert!(pull_error(&r, image, None).is_some());
        assert!(pull_error(&r, image, Some(login("wrong", None))).is_some());
        assert!(pull_error(&r, image, Some(login("p", Some("ghcr.io")))).is_some());
        assert_eq!(pull_error(&r, image, Some(login("p", None))), None);
        assert_eq!(
            pull_error(&r, image, Some(login("p", Some("registry.example.com")))),
            None
        );
        assert_eq!(pull_error(&r, "busybox", None), None);
    }
}
