//! A component is compiled once per digest and engine configuration: a second load is served from
//! memory, a second engine with the same cache directory is served from disk, and a different
//! configuration compiles again. An entry that is damaged, or is the artifact of another
//! configuration, is compiled again rather than used; the directory is kept under its size bound.

mod wasm_support;

use std::path::{Path, PathBuf};

use neocloud_policy::wasm::{EngineConfig, EngineStats, PolicySource, WasmEngine};
use wasm_support::{guest, placement_input, settings, with_log};

fn engine_with_cache(dir: &Path, fuel: bool) -> WasmEngine {
    WasmEngine::new(EngineConfig {
        cache_dir: Some(dir.to_owned()),
        fuel,
        ..EngineConfig::default()
    })
    .unwrap()
}

fn engine_bounded(dir: &Path, max_bytes: u64) -> WasmEngine {
    WasmEngine::new(EngineConfig {
        cache_dir: Some(dir.to_owned()),
        cache_max_bytes: max_bytes,
        ..EngineConfig::default()
    })
    .unwrap()
}

/// The compiled entries wasmtime wrote under `dir` (`modules/wasmtime-<version>/<hash>`), not
/// its `.stats` and `.wip-*` companions, oldest first.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for version in std::fs::read_dir(dir.join("modules")).unwrap() {
        for entry in std::fs::read_dir(version.unwrap().path()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none() {
                found.push(path);
            }
        }
    }
    found.sort_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    found
}

fn only_entry(dir: &Path) -> PathBuf {
    let found = entries(dir);
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

fn load_placement(engine: &WasmEngine) {
    let policy = engine
        .load(&PolicySource::file(guest("placement-c")), settings("c"))
        .unwrap();
    assert!(
        policy
            .place(&placement_input(3))
            .verdict
            .applied()
            .is_some()
    );
}

#[test]
fn second_load_of_the_same_digest_does_not_compile_again() {
    let engine = WasmEngine::new(EngineConfig::default()).unwrap();
    load_placement(&engine);
    let bytes = std::fs::read(guest("placement-c")).unwrap();
    let again = engine
        .load(&PolicySource::bytes("configmap", bytes), settings("again"))
        .unwrap();
    assert!(again.place(&placement_input(3)).verdict.applied().is_some());
    let expected = EngineStats {
        compiled: 1,
        memory_hits: 1,
        disk_hits: 0,
    };
    assert_eq!(engine.stats(), expected);
}

#[test]
fn a_new_engine_with_the_same_cache_directory_loads_from_disk_without_compiling() {
    let dir = tempfile::tempdir().unwrap();
    let first = engine_with_cache(dir.path(), false);
    load_placement(&first);
    assert_eq!(first.stats().compiled, 1);
    let second = engine_with_cache(dir.path(), false);
    load_placement(&second);
    let stats = second.stats();
    assert_eq!((stats.compiled, stats.disk_hits), (0, 1), "{stats:?}");
}

#[test]
fn a_different_engine_configuration_compiles_again() {
    let dir = tempfile::tempdir().unwrap();
    load_placement(&engine_with_cache(dir.path(), false));
    let fueled = engine_with_cache(dir.path(), true);
    load_placement(&fueled);
    let stats = fueled.stats();
    assert_eq!((stats.compiled, stats.disk_hits), (1, 0), "{stats:?}");
}

#[test]
fn a_damaged_cache_entry_is_compiled_again_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    load_placement(&engine_with_cache(dir.path(), false));
    let entry = only_entry(dir.path());
    let good = std::fs::read(&entry).unwrap();
    // Garbage (not zstd), then a truncated entry (a write cut short).
    for damaged in [
        b"not a compiled component".to_vec(),
        good[..good.len() / 2].to_vec(),
    ] {
        std::fs::write(&entry, &damaged).unwrap();
        let engine = engine_with_cache(dir.path(), false);
        load_placement(&engine);
        let stats = engine.stats();
        assert_eq!((stats.compiled, stats.disk_hits), (1, 0), "{stats:?}");
        assert_ne!(
            std::fs::read(&entry).unwrap(),
            damaged,
            "the entry was not rewritten"
        );
    }
    let healed = engine_with_cache(dir.path(), false);
    load_placement(&healed);
    assert_eq!(healed.stats().disk_hits, 1, "the rewritten entry is used");
}

#[test]
fn the_artifact_of_another_engine_configuration_is_not_used_under_this_ones_name() {
    // Two directories, so each holds one entry: the same component compiled without and with
    // fuel. The fueled artifact put in the place of the other is a valid wasmtime artifact of
    // the same version, but not of this configuration: wasmtime must refuse it and compile.
    let (plain, fueled) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    load_placement(&engine_with_cache(plain.path(), false));
    load_placement(&engine_with_cache(fueled.path(), true));
    let entry = only_entry(plain.path());
    std::fs::copy(only_entry(fueled.path()), &entry).unwrap();
    let engine = engine_with_cache(plain.path(), false);
    load_placement(&engine);
    let stats = engine.stats();
    assert_eq!((stats.compiled, stats.disk_hits), (1, 0), "{stats:?}");
}

#[test]
fn a_cache_past_its_size_bound_loses_its_oldest_entries_when_an_engine_opens_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = engine_with_cache(dir.path(), false);
    load_placement(&first);
    let older = only_entry(dir.path());
    std::thread::sleep(std::time::Duration::from_millis(20)); // distinct modification times
    first
        .load(
            &PolicySource::file(guest("pricing-c")),
            with_log(settings("pricing")),
        )
        .unwrap();
    let all = entries(dir.path());
    assert_eq!(all.len(), 2, "{all:?}");
    let newer = all[1].clone();
    assert_eq!(all[0], older);
    // A bound that holds the newer entry (and its small companions) but not both entries.
    let newer_size = std::fs::metadata(&newer).unwrap().len();
    let older_size = std::fs::metadata(&older).unwrap().len();
    let bound = newer_size + older_size / 2;
    let second = engine_bounded(dir.path(), bound);
    assert!(!older.exists(), "the oldest entry was kept past the bound");
    assert!(newer.exists(), "the newest entry was removed");
    let total: u64 = walk(dir.path())
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(total <= bound, "{total} bytes left, bound {bound}");
    load_placement(&second);
    assert_eq!(
        second.stats().compiled,
        1,
        "the evicted component compiles again"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
