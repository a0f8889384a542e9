//! A hostile test guest whose start-up (`_initialize`, which the component calls at
//! instantiation, before any export) blocks on a host pollable for an hour: epoch deadlines
//! cannot stop it, since no wasm code runs while it waits. The host must bound instantiation
//! itself.
#![allow(unsafe_code)] // wit-bindgen's generated glue and the constructor section are unsafe
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

wit_bindgen::generate!({
    path: "../../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::types::{Connection, Error, Instance, ProviderInfo};

/// Runs at start-up, before any export is called.
extern "C" fn stall() {
    let hour = 3_600_000_000_000;
    wasi::clocks::monotonic_clock::subscribe_duration(hour).block();
}

/// The component's start-up entry point: called once at instantiation, before any export.
#[unsafe(export_name = "_initialize")]
pub extern "C" fn initialize() {
    stall();
}

struct Stalled;

impl Guest for Stalled {
    fn init(_: String) -> Result<ProviderInfo, Error> {
        Err(Error::Other("start-up should never have finished".into()))
    }
    fn update() -> Result<Vec<Instance>, Error> {
        Ok(Vec::new())
    }
    fn increase(_: u32) -> Result<u32, Error> {
        Ok(0)
    }
    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        Ok(ids)
    }
    fn connect_info(_: String) -> Result<Connection, Error> {
        Err(Error::Unsupported("connect-info".into()))
    }
    fn heartbeat(_: String) -> Result<(), Error> {
        Ok(())
    }
    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

export!(Stalled);
