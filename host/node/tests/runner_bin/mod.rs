//! Where the integration tests find the `neocloud-runner` binary: next to `neocloud-node` in
//! the target directory. Cargo gives a test the path of its own package's binaries only, and the
//! runner is its own package, so these tests need it built first: `cargo test --workspace` and
//! `make test` do; a single `cargo test --test NAME` does not.
//!
//! Not a way to build it: a test that ran `cargo build` would race the cargo that runs it.

#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::time::SystemTime;

const BUILD: &str = "cargo build -p neocloud-runner";

/// The built `neocloud-runner`; panics, naming the command that builds it, when it is missing
/// or older than its sources (a test of an old runner would say nothing about the code).
pub fn runner_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_neocloud-node")).with_file_name("neocloud-runner");
    let built = match std::fs::metadata(&path).and_then(|m| m.modified()) {
        Ok(built) => built,
        Err(e) => panic!(
            "{} is missing ({e}): build it with `{BUILD}`",
            path.display()
        ),
    };
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/");
    for source in ["runner/src", "protocol/src"] {
        if let Some(newer) = newer_file(&crates.join(source), built) {
            panic!(
                "{} is older than {}: rebuild it with `{BUILD}`",
                path.display(),
                newer.display()
            );
        }
    }
    path
}

/// A file under `dir` modified after `than`, if any; unit-test files (`*_tests.rs`) are not
/// part of the binary and do not count.
fn newer_file(dir: &Path, than: SystemTime) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(newer) = newer_file(&path, than) {
                return Some(newer);
            }
        } else if !path.to_string_lossy().ends_with("_tests.rs")
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|m| m > than)
        {
            return Some(path);
        }
    }
    None
}
