//! Finding the control-plane binaries that `hack/testenv/build.sh` built into its cache.
//!
//! It never builds them: a test must not spend 20 minutes compiling Kubernetes behind the
//! developer's back. `make testenv` and `.ci/run` build them; this module says so when they are
//! missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// The programs `hack/testenv/build.sh` builds: the four components and kubectl.
pub const BINARIES: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
];

/// The repository's root, from this crate's manifest directory (`host/testenv`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding the binaries: `$NEOCLOUD_TESTENV_BIN` if set, else the cache directory
/// that `hack/testenv/build.sh --print` names for the pinned versions. Every binary must exist.
pub fn locate() -> Result<PathBuf, Error> {
    let dir = match std::env::var_os("NEOCLOUD_TESTENV_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => cache_dir()?,
    };
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|c| !dir.join(c).is_file())
        .collect();
    if missing.is_empty() {
        Ok(dir)
    } else {
        Err(Error::MissingBinaries {
            dir,
            missing: missing.join(", "),
        })
    }
}

fn cache_dir() -> Result<PathBuf, Error> {
    printed_dir("build.sh")
}

/// A Go-built tool of the rig: `$env` (the binary or its directory) if set, else `name` in the
/// cache directory that `hack/testenv/<script> --print` names; a path with no file there is
/// [`Error::MissingTool`], naming the tool as `what`.
pub(crate) fn tool(env: &str, name: &str, script: &str, what: &str) -> Result<PathBuf, Error> {
    let path = match std::env::var_os(env).map(PathBuf::from) {
        Some(dir) if dir.is_dir() => dir.join(name),
        Some(path) => path,
        None => printed_dir(script)?.join(name),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingTool {
            tool: what.to_owned(),
            path,
            script: script.to_owned(),
            env: env.to_owned(),
        })
    }
}

/// The cache directory `hack/testenv/<script> --print` names (each build script prints where
/// its binaries go, keyed by version, without building).
pub(crate) fn printed_dir(script: &str) -> Result<PathBuf, Error> {
    let script = repo_root().join("hack/testenv").join(script);
    let what = || format!("run {} --print", script.display());
    let out = Command::new("bash")
        .arg(&script)
        .arg("--print")
        .output()
        .map_err(|e| Error::io(what(), e))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        return Err(Error::io(what(), std::io::Error::other(stderr)));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// For tests: `dir` is a cache directory outside the repository; returns the name of its
/// parent (`<tool>-<version>-<hash>`).
#[cfg(test)]
pub(crate) fn cache_dir_name(dir: &Path) -> String {
    let root = repo_root().canonicalize().unwrap();
    assert!(dir.is_absolute(), "{}", dir.display());
    assert!(
        !dir.starts_with(&root),
        "{} is inside the repository",
        dir.display()
    );
    dir.parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_script_names_a_cache_directory_outside_the_repository() {
        let name = cache_dir_name(&cache_dir().unwrap());
        assert!(
            name.starts_with("k8s-v1.35.") && name.contains("-etcd-v3.6."),
            "{name}"
        );
    }

    #[test]
    fn missing_binaries_are_named_with_the_command_that_builds_them() {
        let err = Error::MissingBinaries {
            dir: "/x".into(),
            missing: "etcd".into(),
        };
        let text = err.to_string();
        assert!(text.contains("/x") && text.contains("etcd"), "{text}");
        assert!(text.contains("make testenv"), "{text}");
    }
}
