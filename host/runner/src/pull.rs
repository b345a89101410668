//! Pulling a private image before the docker executor runs it: `docker login` with the
//! workload's registry login, the password on standard input (never on a command line, where
//! `ps` would show it), into a Docker config directory of its own (mode 0700) that is removed
//! once the image is pulled, so the login is not left on the machine; then `docker pull`. The
//! `docker run` that follows finds the image local.
//!
//! Not for public images (the `docker run` pulls them) or the process executor (no image).

use std::path::Path;
use std::process::Stdio;

use neocloud_protocol::{RegistryLogin, Workload};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::RunnerError;

/// The arguments of `docker` that log in to `login.server` with the config in `config`; the
/// password is read from standard input.
pub fn login_args(login: &RegistryLogin, config: &Path) -> Vec<String> {
    vec![
        format!("--config={}", config.display()),
        "login".into(),
        format!("--username={}", login.username),
        "--password-stdin".into(),
        "--".into(),
        login.server.clone(),
    ]
}

/// The arguments of `docker` that pull `image` with the config in `config`.
pub fn pull_args(image: &str, config: &Path) -> Vec<String> {
    vec![
        format!("--config={}", config.display()),
        "pull".into(),
        "--".into(),
        image.to_owned(),
    ]
}

/// Logs in and pulls the workload's image when it carries a registry login; does nothing
/// otherwise.
pub async fn pull_private(workload: &Workload) -> Result<(), RunnerError> {
    pull_with(Path::new("docker"), workload).await
}

/// [`pull_private`] with `docker` as the Docker client.
async fn pull_with(docker: &Path, workload: &Workload) -> Result<(), RunnerError> {
    let Some(login) = &workload.registry_login else {
        return Ok(());
    };
    let config = ConfigDir::new()?;
    let stdin = format!("{}\n", login.password);
    let login = login_args(login, config.path());
    run(
        docker,
        login,
        Some(stdin.as_bytes()),
        "log in to the registry",
    )
    .await?;
    let pull = pull_args(&workload.image, config.path());
    run(docker, pull, None, "pull the image").await
}

async fn run(
    docker: &Path,
    args: Vec<String>,
    input: Option<&[u8]>,
    what: &str,
) -> Result<(), RunnerError> {
    let mut command = Command::new(docker);
    command
        .args(&args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| failed(what, e.to_string()))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input)
            .await
            .map_err(|e| failed(what, e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| failed(what, e.to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(failed(what, stderr.trim().to_owned()))
}

/// A private (0700) Docker config directory, removed with what `docker login` wrote in it when
/// dropped.
struct ConfigDir(std::path::PathBuf);

impl ConfigDir {
    fn new() -> Result<Self, RunnerError> {
        use std::os::unix::fs::DirBuilderExt;
        let name = format!("neocloud-docker-{}", uuid::Uuid::new_v4().simple());
        let path = std::env::temp_dir().join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| failed("make a docker config directory", e.to_string()))?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn failed(what: &str, message: String) -> RunnerError {
    RunnerError::Spawn {
        program: format!("docker ({what})"),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login() -> RegistryLogin {
        RegistryLogin {
            server: "registry.example.com".into(),
            username: "bot".into(),
            password: "hunter2".into(),
        }
    }

    #[test]
    fn the_password_is_on_no_command_line_and_values_are_never_options() {
        let dir = Path::new("/tmp/cfg");
        let login_args = login_args(&login(), dir);
        assert!(!login_args.join(" ").contains("hunter2"), "{login_args:?}");
        assert_eq!(
            login_args[1..],
            [
                "login",
                "--username=bot",
                "--password-stdin",
                "--",
                "registry.example.com"
            ]
        );
        let pull_args = pull_args("--privileged", dir);
        assert_eq!(pull_args[1..], ["pull", "--", "--privileged"]);
        assert_eq!(pull_args[0], "--config=/tmp/cfg");
    }

    /// A `docker` that logs in only with `bot`/`hunter2` on standard input, and pulls only
    /// after a login into the same config directory.
    fn fake_docker(dir: &Path) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("docker");
        let text = r#"#!/bin/sh
config="${1#--config=}"; shift
case "$1" in
login)
  read -r password
  if [ "$2" = "--username=bot" ] && [ "$3" = "--password-stdin" ] && [ "$password" = "hunter2" ]; then
    echo ok > "$config/config.json"; exit 0
  fi
  echo "Error response from daemon: unauthorized: incorrect username or password" >&2; exit 1;;
pull)
  [ -f "$config/config.json" ] && exit 0
  echo "Error response from daemon: pull access denied for $3" >&2; exit 1;;
esac
exit 2
"#;
        std::fs::write(&script, text).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script
    }

    #[tokio::test]
    async fn the_image_pulls_with_the_right_login_and_the_login_is_not_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let docker = fake_docker(dir.path());
        let mut workload = Workload {
            image: "registry.example.com/team/model:1".into(),
            registry_login: Some(login()),
            ..Workload::default()
        };
        let before = leftovers();
        pull_with(&docker, &workload).await.unwrap();
        assert_eq!(
            leftovers(),
            before,
            "the docker config directory is removed"
        );

        workload.registry_login.as_mut().unwrap().password = "wrong".into();
        let err = pull_with(&docker, &workload).await.unwrap_err().to_string();
        assert!(
            err.contains("log in to the registry") && err.contains("unauthorized"),
            "{err}"
        );
        assert!(!err.contains("wrong"), "{err}");
    }

    fn leftovers() -> Vec<std::path::PathBuf> {
        let mut found: Vec<_> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().contains("neocloud-docker-"))
            .collect();
        found.sort();
        found
    }

    #[tokio::test]
    async fn a_workload_without_a_login_pulls_nothing() {
        let workload = Workload {
            image: "busybox".into(),
            ..Workload::default()
        };
        pull_private(&workload).await.unwrap();
    }
}
