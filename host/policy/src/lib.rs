//! Sandboxed policies that decide where a Pod goes, what happens when a rental fails and how much
//! may be paid: WebAssembly components implementing the `neocloud:policy` WIT worlds, and CEL
//! expressions written on a Pod or in a `BurstPolicy`.
//!
//! This is the only crate that links wasmtime and cel. It is not for deciding anything itself:
//! the broker calls it and owns the built-in defaults.
//!
//! - [`cel`]: CEL constraint and rank expressions over offers, compiled once and cached.
//! - [`wasm`]: the component engine for guest policies (WIT package `neocloud:policy@0.1.0`).

pub mod cel;
pub mod wasm;
