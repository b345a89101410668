//! The workload's files (its ConfigMap, Secret and downward-API volumes), written the way a
//! kubelet writes them, and kept up to date while it runs.
//!
//! Where: with the process executor, at the mount path itself on this machine (what a
//! container would see; the runner runs as the machine's user, so the path must be writable by
//! it); with the docker executor, in a directory of the runner's own
//! (`$TMPDIR/neocloud-files-<container>/<n>`) that is bind-mounted read-only at the mount path.
//!
//! How: like the kubelet's atomic writer. The files go into a fresh hidden directory
//! (`..2026_12_05_16_00_00.123_ab12`), a `..data` symlink is swapped to it with one `rename`,
//! and each top-level name is a symlink through `..data` (`config.yaml -> ..data/config.yaml`),
//! so a reader sees either the old files or the new ones, never a mix. Updates: every
//! heartbeat interval the runner fetches the workload again and rewrites a mount whose files
//! changed (the node re-reads the objects periodically; see the README).
//!
//! Safety: paths are checked again here (absolute mount paths, relative file paths, no `..`,
//! no `.`, no name starting with `..`); a mount path that is a symlink or not a directory is
//! refused; files are created with `O_EXCL` in a directory the runner just made; the old
//! directory is removed only if `..data` names a plain `..` entry of the mount.
//!
//! Not fetching or reporting (see [`crate::client`]) and not the executors (see `executor`).

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use neocloud_protocol::{ExecutorKind, File, FileMount};

use crate::{CallbackClient, RunnerError};

/// The symlink that names the current files of a mount.
const DATA: &str = "..data";
/// The symlink made next to [`DATA`] and renamed over it.
const DATA_TMP: &str = "..data_tmp";

/// A mount being kept up to date.
#[derive(Debug)]
struct Placed {
    /// Where the runner writes (the mount path, or the directory bind-mounted there).
    dir: PathBuf,
    mount_path: String,
    /// What was last written.
    files: Vec<File>,
}

/// The workload's mounts, written.
#[derive(Debug, Default)]
pub struct Files {
    placed: Vec<Placed>,
}

impl Files {
    /// Checks and writes every mount of `files` for `executor`; `container` names the docker
    /// executor's directory.
    pub fn prepare(
        executor: ExecutorKind,
        files: &[FileMount],
        container: &str,
    ) -> Result<Self, RunnerError> {
        let mut placed = Vec::with_capacity(files.len());
        for (i, mount) in files.iter().enumerate() {
            check_mount(mount)?;
            let dir = match executor {
                ExecutorKind::Process => PathBuf::from(&mount.mount_path),
                ExecutorKind::Docker => std::env::temp_dir()
                    .join(format!("neocloud-files-{container}"))
                    .join(i.to_string()),
            };
            write(&dir, &mount.files).map_err(|e| failed(&mount.mount_path, &e))?;
            placed.push(Placed {
                dir,
                mount_path: mount.mount_path.clone(),
                files: mount.files.clone(),
            });
        }
        Ok(Self { placed })
    }

    /// `(directory, mount path)` pairs for `docker run --mount`.
    pub fn docker_mounts(&self) -> Vec<(PathBuf, String)> {
        self.placed
            .iter()
            .map(|p| (p.dir.clone(), p.mount_path.clone()))
            .collect()
    }

    /// Rewrites each mount whose files differ in `files` (matched by mount path; a mount the
    /// workload did not start with is ignored). Returns how many were rewritten.
    pub fn update(&mut self, files: &[FileMount]) -> usize {
        let mut rewritten = 0;
        for mount in files {
            let Some(placed) = self
                .placed
                .iter_mut()
                .find(|p| p.mount_path == mount.mount_path)
            else {
                continue;
            };
            if placed.files == mount.files {
                continue;
            }
            let written = check_mount(mount).and_then(|()| {
                write(&placed.dir, &mount.files).map_err(|e| failed(&mount.mount_path, &e))
            });
            match written {
                Ok(()) => {
                    placed.files = mount.files.clone();
                    rewritten += 1;
                    tracing::info!(mount = %mount.mount_path, "runner: files updated");
                }
                Err(e) => tracing::warn!(error = %e, "runner: failed to update files"),
            }
        }
        rewritten
    }

    /// Fetches the workload every `every` and applies its files, until aborted; returns at once
    /// when there are none.
    pub async fn follow(mut self, client: Arc<CallbackClient>, every: Duration) {
        if self.placed.is_empty() {
            return;
        }
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            match client.workload().await {
                Ok(w) => {
                    self.update(&w.files);
                }
                Err(e) => tracing::warn!(error = %e, "runner: failed to fetch the files"),
            }
        }
    }
}

fn failed(mount_path: &str, e: &std::io::Error) -> RunnerError {
    RunnerError::Files(format!("failed to write the files of {mount_path}: {e}"))
}

/// Refuses a mount path that is not absolute or holds `.`, `..` or a comma (docker's `--mount`
/// separator), and file paths that are not plain relative paths.
fn check_mount(mount: &FileMount) -> Result<(), RunnerError> {
    let path = Path::new(&mount.mount_path);
    let mut components = path.components();
    let absolute = components.next() == Some(Component::RootDir);
    let plain = components
        .clone()
        .all(|c| matches!(c, Component::Normal(_)));
    let raw_plain = !mount.mount_path.split('/').any(|c| c == "." || c == "..");
    if !absolute || !plain || !raw_plain || components.next().is_none() {
        return Err(RunnerError::Files(format!(
            "mount path {:?} must be an absolute path without '.' or '..'",
            mount.mount_path
        )));
    }
    if mount.mount_path.contains([',', '\0', '\n']) {
        return Err(RunnerError::Files(format!(
            "mount path {:?} must not contain a comma, a NUL or a newline",
            mount.mount_path
        )));
    }
    for file in &mount.files {
        check_file(&mount.mount_path, file)?;
    }
    Ok(())
}

fn check_file(mount_path: &str, file: &File) -> Result<(), RunnerError> {
    let refuse = |why: &str| {
        Err(RunnerError::Files(format!(
            "file {:?} of {mount_path}: {why}",
            file.path
        )))
    };
    if file.path.starts_with("..") {
        return refuse("must not start with '..'");
    }
    if file.path.contains('\0') {
        return refuse("must not contain a NUL");
    }
    let plain = Path::new(&file.path)
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    let raw_plain = !file
        .path
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..");
    if !plain || !raw_plain {
        return refuse("must be a relative path without '.' or '..'");
    }
    if file.mode > 0o777 {
        return refuse("its mode is over 0777");
    }
    Ok(())
}

/// Writes `files` into `dir` as the kubelet's atomic writer does (see the module doc).
fn write(dir: &Path, files: &[File]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other("it is a symlink or not a directory"));
    }
    let stamp = format!(
        "..{}_{}",
        chrono::Utc::now().format("%Y_%m_%d_%H_%M_%S%.9f"),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let fresh = dir.join(&stamp);
    std::fs::create_dir(&fresh)?;
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755))?;
    for file in files {
        write_file(&fresh, file)?;
    }
    let old = std::fs::read_link(dir.join(DATA)).ok();
    let tmp = dir.join(DATA_TMP);
    if let Err(e) = std::fs::remove_file(&tmp)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(e);
    }
    symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA))?;
    link_top_level(dir, files)?;
    if let Some(old) = old.filter(|o| own_entry(o) && *o != Path::new(&stamp)) {
        unlink_gone(dir, &dir.join(&old), files);
        if let Err(e) = std::fs::remove_dir_all(dir.join(&old)) {
            tracing::warn!(dir = %dir.display(), error = %e, "runner: failed to remove old files");
        }
    }
    Ok(())
}

fn write_file(fresh: &Path, file: &File) -> std::io::Result<()> {
    let path = fresh.join(&file.path);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    out.write_all(&file.data)?;
    out.sync_all()?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(file.mode))
}

/// A `..data` target the runner made: one plain name starting with `..` (not `..data`).
fn own_entry(target: &Path) -> bool {
    let mut components = target.components();
    let one =
        matches!(components.next(), Some(Component::Normal(_))) && components.next().is_none();
    let name = target.to_string_lossy();
    one && name.starts_with("..") && name != DATA && name != DATA_TMP
}

fn top_level(files: &[File]) -> BTreeSet<&str> {
    files
        .iter()
        .filter_map(|f| f.path.split('/').next())
        .collect()
}

/// `name -> ..data/name` for each top-level name; a name taken by something else is an error.
fn link_top_level(dir: &Path, files: &[File]) -> std::io::Result<()> {
    for name in top_level(files) {
        let link = dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => {}
            Ok(_) => {
                return Err(std::io::Error::other(format!(
                    "{} exists and is not a symlink the runner made",
                    link.display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                symlink(Path::new(DATA).join(name), &link)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes the top-level links of names the old files had and the new ones do not.
fn unlink_gone(dir: &Path, old: &Path, files: &[File]) {
    let keep = top_level(files);
    let Ok(entries) = std::fs::read_dir(old) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if keep.contains(name.as_ref()) {
            continue;
        }
        let link = dir.join(name.as_ref());
        if std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            let _ = std::fs::remove_file(link);
        }
    }
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
