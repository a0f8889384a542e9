//! A plugin built against the frozen `flotilla:provider@0.1.0` contract
//! (`tests/wit/provider-0.1.0`), as plugins published before 0.1.1 were: the host must keep
//! loading and calling it unchanged. It logs in `init` (so `log@0.1.0` must resolve) and
//! reports one running instance.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

wit_bindgen::generate!({
    path: "../../wit/provider-0.1.0",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::log::{Level, emit};
use flotilla::provider::types::{
    Arch, Capabilities, Connection, Error, Instance, InstanceState, Os, Protocol, ProviderInfo,
};

struct Legacy;

impl Guest for Legacy {
    fn init(_settings: String) -> Result<ProviderInfo, Error> {
        emit(Level::Info, "legacy plugin built against 0.1.0 starting");
        Ok(ProviderInfo {
            id: "legacy/0.1.0".into(),
            version: "0.1.0".into(),
            max_size: 1,
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: false,
            },
        })
    }

    fn update() -> Result<Vec<Instance>, Error> {
        Ok(vec![Instance {
            id: "legacy-1".into(),
            state: InstanceState::Running,
        }])
    }

    fn increase(_delta: u32) -> Result<u32, Error> {
        Ok(0)
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        Ok(ids)
    }

    fn connect_info(id: String) -> Result<Connection, Error> {
        Ok(Connection {
            id,
            os: Os::Linux,
            arch: Arch::Amd64,
            protocol: Protocol::Ssh,
            internal_address: Some("192.0.2.1".into()),
            external_address: None,
            port: 22,
            username: "legacy".into(),
            expires: None,
        })
    }

    fn heartbeat(_id: String) -> Result<(), Error> {
        Err(Error::Unsupported("heartbeat".into()))
    }

    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

export!(Legacy);
