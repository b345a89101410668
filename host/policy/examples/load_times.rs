//! How long loading a component takes in the engine, the first time (compiled) and the second
//! (read back from the disk cache by a new engine, as after a node restart), for each guest
//! named on the command line (default: the Python and JavaScript fallback guests).
//!
//! ```text
//! cargo run -p neocloud-policy --example load_times              # debug, as the node's debug build
//! cargo run -p neocloud-policy --example load_times --release    # release
//! cargo run -p neocloud-policy --example load_times -- placement-c fallback-py
//! ```
//!
//! Needs the guests built by `make policies` (or `NEOCLOUD_POLICIES_DIR`). Each guest gets a
//! fresh cache directory, so the first load always compiles.

#[path = "../tests/wasm_support/mod.rs"]
mod wasm_support;

use std::io::Write;
use std::time::Instant;

use neocloud_policy::wasm::{EngineConfig, PolicySource, WasmEngine};
use wasm_support::{guest, settings};

fn main() {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        names = vec!["fallback-py".into(), "fallback-js".into()];
    }
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "| guest | build | first load (compile) | second load (disk cache) |"
    );
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    for name in names {
        let dir = tempfile::tempdir().expect("cache directory");
        let config = EngineConfig {
            cache_dir: Some(dir.path().to_owned()),
            ..EngineConfig::default()
        };
        let mut s = settings(&name);
        s.capabilities.log = true;
        s.capabilities.deny_all_wasi = true;
        let source = PolicySource::file(guest(&name));
        let mut times = Vec::new();
        for _ in 0..2 {
            let engine = WasmEngine::new(config.clone()).expect("engine");
            let started = Instant::now();
            engine.load(&source, s.clone()).expect("load");
            times.push(started.elapsed());
            let stats = engine.stats();
            eprintln!("{name}: {stats:?} in {:?}", started.elapsed());
        }
        let _ = writeln!(
            out,
            "| `{name}` | {profile} | {:.2} s | {:.3} s |",
            times[0].as_secs_f64(),
            times[1].as_secs_f64()
        );
    }
}
