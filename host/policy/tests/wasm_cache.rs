//! A component is compiled once per digest and engine configuration: a second load is served from
//! memory, a second engine with the same cache directory is served from disk, and a different
//! configuration compiles again.

mod wasm_support;

use neocloud_policy::wasm::{EngineConfig, EngineStats, PolicySource, WasmEngine};
use wasm_support::{guest, placement_input, settings};

fn engine_with_cache(dir: &std::path::Path, fuel: bool) -> WasmEngine {
    WasmEngine::new(EngineConfig {
        cache_dir: Some(dir.to_owned()),
        fuel,
        ..EngineConfig::default()
    })
    .unwrap()
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
