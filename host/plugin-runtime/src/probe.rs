//! Test-only (`test-probe` feature): links `flotilla:test/probe`, through which hostile test
//! guests report what they observed. Without the feature the import does not exist, and a
//! plugin that imports it is refused at load time like any other foreign import.

use std::sync::Arc;

use wasmtime::StoreContextMut;
use wasmtime::component::Linker;

use crate::HostState;

/// The interface name as components import it.
pub(crate) const INTERFACE: &str = "flotilla:test/probe@0.1.0";

/// A receiver of `(key, value)` reports.
pub type Report = dyn Fn(&str, &str) + Send + Sync;

/// Where a test receives a guest's reports.
#[derive(Clone)]
pub struct Probe(pub Arc<Report>);

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.root().instance(INTERFACE)?.func_wrap(
        "report",
        |store: StoreContextMut<'_, HostState>, (key, value): (String, String)| {
            if let Some(probe) = &store.data().probe {
                (probe.0)(&key, &value);
            }
            Ok(())
        },
    )
}
