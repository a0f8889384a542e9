//! The static provider: a fixed list of pre-existing hosts (bare metal, long-lived VMs).
//!
//! `increase` activates hosts from the list in order, `decrease` releases them, and
//! `update` reports the active ones as running. It makes no HTTP calls.
//!
//! Activation lives in the plugin instance's memory. If the host replaces the instance
//! (after a trap or a timeout), activation starts empty again and the host sees the hosts as
//! released; this is safe because nothing is ever created or destroyed.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

mod settings;

use std::cell::RefCell;

use settings::{HostEntry, Settings};

wit_bindgen::generate!({
    path: "../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::log::{Level, emit};
use flotilla::provider::types::{
    Capabilities, Connection, Error, Instance, InstanceState, ProviderInfo,
};

struct State {
    settings: Settings,
    /// Indexes into `settings.hosts` of the hosts that are handed out.
    active: Vec<bool>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T, Error>) -> Result<T, Error> {
    STATE.with(|cell| match cell.borrow_mut().as_mut() {
        Some(state) => f(state),
        None => Err(Error::Other("init has not been called".to_string())),
    })
}

fn find<'a>(state: &'a State, id: &str) -> Option<(usize, &'a HostEntry)> {
    state
        .settings
        .hosts
        .iter()
        .enumerate()
        .find(|(_, h)| h.id() == id)
}

struct StaticProvider;

impl Guest for StaticProvider {
    fn init(settings: String) -> Result<ProviderInfo, Error> {
        let settings = Settings::parse(&settings).map_err(Error::InvalidConfig)?;
        let info = ProviderInfo {
            id: format!("static/{}", settings.name),
            version: env!("CARGO_PKG_VERSION").to_string(),
            max_size: u32::try_from(settings.hosts.len()).unwrap_or(u32::MAX),
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: false,
            },
        };
        emit(
            Level::Info,
            &format!(
                "static pool {} with {} hosts",
                settings.name,
                settings.hosts.len()
            ),
        );
        STATE.with(|cell| {
            // Re-init with the same settings keeps activation; new settings start afresh.
            let mut slot = cell.borrow_mut();
            let keep = matches!(slot.as_ref(), Some(old) if old.settings == settings);
            if !keep {
                let active = vec![false; settings.hosts.len()];
                *slot = Some(State { settings, active });
            }
        });
        Ok(info)
    }

    fn update() -> Result<Vec<Instance>, Error> {
        with_state(|state| {
            Ok(state
                .settings
                .hosts
                .iter()
                .zip(&state.active)
                .filter(|(_, active)| **active)
                .map(|(host, _)| Instance {
                    id: host.id().to_string(),
                    state: InstanceState::Running,
                })
                .collect())
        })
    }

    fn increase(delta: u32) -> Result<u32, Error> {
        with_state(|state| {
            let mut granted = 0u32;
            for active in state.active.iter_mut().filter(|a| !**a) {
                if granted == delta {
                    break;
                }
                *active = true;
                granted += 1;
            }
            Ok(granted)
        })
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        with_state(|state| {
            let mut accepted = Vec::with_capacity(ids.len());
            for id in ids {
                // Releasing an already released host is accepted (idempotent); unknown ids are not.
                if let Some((index, _)) = find(state, &id) {
                    if let Some(active) = state.active.get_mut(index) {
                        *active = false;
                    }
                    if !accepted.contains(&id) {
                        accepted.push(id);
                    }
                }
            }
            Ok(accepted)
        })
    }

    fn connect_info(id: String) -> Result<Connection, Error> {
        with_state(|state| match find(state, &id) {
            Some((_, host)) => Ok(host.connect_info()),
            None => Err(Error::NotFound(format!("no host with id {id:?}"))),
        })
    }

    fn heartbeat(id: String) -> Result<(), Error> {
        with_state(|state| match find(state, &id) {
            Some((index, _)) if state.active.get(index) == Some(&true) => Ok(()),
            _ => Err(Error::NotFound(format!("host {id:?} is not active"))),
        })
    }

    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

export!(StaticProvider);
