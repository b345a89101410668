//! Domain types of NeoCloud Node: what a workload asks for, what a cloud offers, what happened
//! when we tried to rent it, and how failures are classified.
//!
//! This crate does no IO and links no heavy dependency (no kube client, no wasmtime, no HTTP):
//! every other crate speaks in these types, so they stay small, serialisable and pure.
