//! The on-disk cache of compiled components: opening wasmtime's cache in a directory, and keeping
//! that directory under a size bound.
//!
//! Not for deciding what to compile or when (see [`super::engine`]), nor for reading entries:
//! wasmtime reads and writes them itself.
//!
//! What keeps a stale or damaged entry from being used is wasmtime's own cache:
//! - an entry's file name is a sha256 of the Wasm bytes and of every compiler and tunable setting
//!   of the engine, and entries live under `modules/wasmtime-<version>/`, so another wasmtime
//!   version or another configuration never looks an entry up;
//! - an entry found is zstd-decompressed, then checked as an artifact of this very wasmtime
//!   (ELF header, version string, compiler flags, tunables) before use; anything that fails either
//!   step is treated as a miss, compiled again, and the entry is overwritten.
//!
//! No checksum covers the machine code itself, so the directory is trusted like the binary: it
//! is created owner-only (0700), and the node's lives on a Pod-private `emptyDir`.
//!
//! wasmtime bounds the directory too (`files_total_size_soft_limit`), but only from a background
//! worker, after an entry is written and at most once per cleanup interval: a short-lived CLI
//! process exits before it runs. So [`open`] also removes the oldest files past the bound, every
//! time an engine is built, before anything is read.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use wasmtime::{Cache, CacheConfig};

use super::error::WasmError;

/// What [`evict_oldest`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Evicted {
    /// Files removed.
    pub files: u64,
    /// Their total size, in bytes.
    pub bytes: u64,
}

/// Creates `dir` (owner-only) if needed, trims it to `max_bytes`, and opens wasmtime's cache in
/// it with the same bound for its background worker.
pub(crate) fn open(dir: &Path, max_bytes: u64) -> Result<Cache, WasmError> {
    create_private_dir(dir).map_err(|e| {
        WasmError::Engine(format!(
            "failed to create cache directory {}: {e}",
            dir.display()
        ))
    })?;
    match evict_oldest(dir, max_bytes) {
        Ok(evicted) if evicted.files > 0 => tracing::info!(
            dir = %dir.display(),
            files = evicted.files,
            bytes = evicted.bytes,
            max_bytes,
            "wasm cache: removed the oldest entries past the size bound"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(dir = %dir.display(), "wasm cache: cannot trim: {e}"),
    }
    let mut config = CacheConfig::new();
    config
        .with_directory(dir)
        .with_files_total_size_soft_limit(max_bytes);
    Cache::new(config).map_err(|e| {
        WasmError::Engine(format!(
            "failed to open cache directory {}: {e:#}",
            dir.display()
        ))
    })
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Removes the least recently written files under `dir` (recursively) until the rest add up to
/// at most `max_bytes`. Files that vanish meanwhile (another process trimming or rewriting the
/// same directory) are skipped; any other error stops the walk.
pub(crate) fn evict_oldest(dir: &Path, max_bytes: u64) -> std::io::Result<Evicted> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    let mut total: u64 = files.iter().map(|f| f.size).sum();
    // Oldest first; the path breaks ties so the order is the same on every run.
    files.sort_by(|a, b| (a.modified, &a.path).cmp(&(b.modified, &b.path)));
    let mut evicted = Evicted::default();
    for file in files {
        if total <= max_bytes {
            break;
        }
        match std::fs::remove_file(&file.path) {
            Ok(()) => {
                evicted.files += 1;
                evicted.bytes += file.size;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        total -= file.size;
    }
    Ok(evicted)
}

struct CachedFile {
    path: PathBuf,
    size: u64,
    modified: SystemTime,
}

fn collect_files(dir: &Path, out: &mut Vec<CachedFile>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(meta) = entry.metadata() else {
            continue; // removed since the listing
        };
        if meta.is_dir() {
            collect_files(&entry.path(), out)?;
        } else if meta.is_file() {
            out.push(CachedFile {
                path: entry.path(),
                size: meta.len(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn file(dir: &Path, name: &str, size: usize, age_secs: u64) -> PathBuf {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, vec![7u8; size]).unwrap();
        let at = SystemTime::now() - Duration::from_secs(age_secs);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(at)
            .unwrap();
        path
    }

    #[test]
    fn the_oldest_files_go_first_until_the_rest_fit_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let oldest = file(dir.path(), "modules/wasmtime-1/a", 400, 300);
        let middle = file(dir.path(), "modules/wasmtime-2/b", 400, 200);
        let newest = file(dir.path(), "modules/wasmtime-2/c", 400, 100);
        let evicted = evict_oldest(dir.path(), 900).unwrap();
        assert_eq!(
            evicted,
            Evicted {
                files: 1,
                bytes: 400
            }
        );
        assert!(!oldest.exists());
        assert!(middle.exists() && newest.exists());
        let evicted = evict_oldest(dir.path(), 400).unwrap();
        assert_eq!(evicted.files, 1);
        assert!(!middle.exists() && newest.exists());
    }

    #[test]
    fn a_directory_within_the_bound_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let kept = file(dir.path(), "modules/w/a", 100, 10);
        assert_eq!(evict_oldest(dir.path(), 100).unwrap(), Evicted::default());
        assert!(kept.exists());
    }

    #[cfg(unix)]
    #[test]
    fn a_new_cache_directory_is_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("cache/wasm");
        open(&dir, 1 << 20).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    }
}
