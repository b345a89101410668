//! A real Docker engine for tests of the runner's container executor: Debian's `dockerd`
//! (package `docker.io`), started by the test with its own data root, exec root and socket in a
//! temporary directory, so it shares nothing with a daemon the machine may run.
//!
//! It runs without iptables rules, IP masquerading or a bridge (`--iptables=false
//! --ip-masq=false --bridge=none`: containers use the host's network or none, and the daemon
//! changes no firewall or interface of the machine) and with the `vfs` storage driver (no
//! overlay mounts left behind). Nothing can be pulled here, so [`Docker::import_busybox`] makes
//! an image from Debian's static busybox (package `busybox-static`) with `docker import`.
//!
//! Dropping it stops the daemon (SIGTERM: it stops its containers and its containerd) and
//! removes its directory (`NEOCLOUD_TESTENV_KEEP=1` keeps it). Not for production use.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::Supervised;
use crate::{Error, readiness};

/// How long dockerd may take to answer after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Where Debian's static busybox is.
pub(crate) const BUSYBOX: &str = "/bin/busybox";

/// A running Docker engine. Dropping it stops the daemon and removes its directory.
#[derive(Debug)]
pub struct Docker {
    process: Supervised,
    dir: PathBuf,
    keep_dir: bool,
}

impl Docker {
    /// Starts dockerd and waits until it answers `docker version`.
    pub async fn start() -> Result<Self, Error> {
        let dockerd = find("dockerd")?;
        let keep_dir = std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("neocloud-docker-")
            .tempdir()
            .map_err(|e| Error::io("create the docker directory", e))?
            .keep();
        let path = |name: &str| dir.join(name).display().to_string();
        let args = vec![
            format!("--data-root={}", path("root")),
            format!("--exec-root={}", path("exec")),
            format!("--pidfile={}", path("docker.pid")),
            format!("--host=unix://{}", path("docker.sock")),
            "--iptables=false".into(),
            "--ip6tables=false".into(),
            "--ip-masq=false".into(),
            "--bridge=none".into(),
            "--storage-driver=vfs".into(),
        ];
        let cleanup = (!keep_dir).then_some(dir.as_path());
        let mut process = Supervised::spawn(
            "dockerd",
            &dockerd,
            &args,
            &dir.join("dockerd.log"),
            cleanup,
        )?;
        let host = format!("unix://{}", path("docker.sock"));
        let ready = readiness::wait_until_ready(&mut process, READY_TIMEOUT, || {
            let mut version = tokio::process::Command::new("docker");
            version
                .env("DOCKER_HOST", &host)
                .args(["version", "--format", "{{.Server.Version}}"]);
            async move {
                let out = version.output().await.map_err(|e| e.to_string())?;
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
                }
            }
        })
        .await;
        let docker = Self {
            process,
            dir,
            keep_dir,
        };
        ready.map(|()| docker)
    }

    /// `unix://<socket>`: the `DOCKER_HOST` of a client of this daemon.
    pub fn host(&self) -> String {
        format!("unix://{}", self.dir.join("docker.sock").display())
    }

    /// `docker` talking to this daemon.
    pub fn command(&self) -> Command {
        let mut docker = Command::new("docker");
        docker.env("DOCKER_HOST", self.host());
        docker
    }

    /// Imports image `tag`: a root filesystem holding only a static busybox (as `/bin/sh`,
    /// `/bin/echo`, `/bin/sleep`, `/bin/cat`, `/bin/env`), with `ENTRYPOINT ["/bin/sh", "-c"]`
    /// and `CMD ["echo from the image"]`.
    pub fn import_busybox(&self, tag: &str) -> Result<(), Error> {
        let rootfs = self.dir.join("busybox-rootfs");
        busybox_rootfs(&rootfs, &["sh", "echo", "sleep", "cat", "env"])?;
        let tar = self.dir.join("busybox.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg("."))?;
        run(self
            .command()
            .arg("import")
            .args(["--change", r#"ENTRYPOINT ["/bin/sh", "-c"]"#])
            .args(["--change", r#"CMD ["echo from the image"]"#])
            .arg(&tar)
            .arg(tag))
    }

    /// The daemon's directory (data root, exec root, socket, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last `lines` lines of dockerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        self.process.stop();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs `command`; an error carries its stderr.
pub(crate) fn run(command: &mut Command) -> Result<(), Error> {
    let what = format!("{command:?}");
    let out = command
        .output()
        .map_err(|e| Error::io(format!("run {what}"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        Err(Error::io(
            format!("run {what}"),
            std::io::Error::other(format!("{}: {stderr}", out.status)),
        ))
    }
}

/// `program` on `PATH` (and in `/usr/sbin`, where Debian puts dockerd).
fn find(program: &str) -> Result<PathBuf, Error> {
    on_path(program, &[]).ok_or_else(|| Error::MissingDocker {
        program: program.to_owned(),
    })
}

/// The executable `program` on `PATH`, in `/usr/sbin` or `/usr/bin`, or in one of `more`.
pub(crate) fn on_path(program: &str, more: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .chain(more.iter().map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

/// Makes `rootfs` a root filesystem holding only Debian's static busybox (package
/// `busybox-static`) as `/bin/busybox`, with `applets` as links to it, and an empty `/tmp`.
pub(crate) fn busybox_rootfs(rootfs: &Path, applets: &[&str]) -> Result<(), Error> {
    let bin = rootfs.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| Error::io("create the image's /bin", e))?;
    std::fs::create_dir_all(rootfs.join("tmp"))
        .map_err(|e| Error::io("create the image's /tmp", e))?;
    std::fs::copy(BUSYBOX, bin.join("busybox"))
        .map_err(|e| Error::io(format!("copy {BUSYBOX} (Debian package busybox-static)"), e))?;
    for applet in applets {
        let link = bin.join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", &link)
                .map_err(|e| Error::io(format!("link {}", link.display()), e))?;
        }
    }
    Ok(())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
