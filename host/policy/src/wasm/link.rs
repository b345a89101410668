//! Builds the linker for a policy from its granted capabilities: the bounded log import and the
//! deny-all WASI context, and nothing else.
//!
//! Not for running guests. A guest importing something not linked here fails at load, with the
//! missing import named in the error.

use wasmtime::Engine;
use wasmtime::component::{HasSelf, Linker};

use super::bindings::neocloud::policy::log;
use super::config::Capabilities;
use super::host::HostState;

pub(crate) fn linker(engine: &Engine, grants: Capabilities) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    if grants.log {
        log::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
    }
    if grants.deny_all_wasi {
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    }
    Ok(linker)
}
