//! The static provider: a fixed list of pre-existing hosts (bare metal, long-lived VMs).
//!
//! `increase` activates hosts from the list in order, `decrease` releases them, and
//! `update` reports the active ones as running. It makes no HTTP calls.
//!
//! Activation is the plugin's only record (no cloud keeps it), so it lives in the pool's
//! host-owned `state` (key `active`, a JSON list of host ids), written before `increase` or
//! `decrease` answers and read back by `init`. A trap, a restart or an upgrade of the host
//! therefore finds the same hosts handed out, and the leases on them stay valid. A host that
//! left the list is dropped from activation; nothing is ever created or destroyed.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

mod settings;

use settings::{HostEntry, Settings};

wit_bindgen::generate!({
    path: "../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::log::{Level, emit};
use flotilla::provider::state;
use flotilla::provider::types::{
    Capabilities, Connection, Error, Instance, InstanceState, ProviderInfo,
};

struct State {
    settings: Settings,
    /// Indexes into `settings.hosts` of the hosts that are handed out.
    active: Vec<bool>,
}

thread_local! {
    static STATE: flotilla_guest::State<State> = const { flotilla_guest::State::new() };
}

fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T, Error>) -> Result<T, Error> {
    STATE.with(|s| s.change(f))
}

impl From<flotilla_guest::NotInitialized> for Error {
    fn from(e: flotilla_guest::NotInitialized) -> Self {
        Error::Other(e.to_string())
    }
}

fn find<'a>(state: &'a State, id: &str) -> Option<(usize, &'a HostEntry)> {
    state
        .settings
        .hosts
        .iter()
        .enumerate()
        .find(|(_, h)| h.id() == id)
}

/// The key of the activation record in the pool's state.
const ACTIVE_KEY: &str = "active";

/// The activation the pool's state holds for these settings' hosts (hosts no longer listed
/// are dropped); none handed out when nothing was saved.
fn load_active(settings: &Settings) -> Result<Vec<bool>, Error> {
    let saved = state::get(ACTIVE_KEY).map_err(state_failed)?;
    let ids: Vec<String> = match saved {
        None => Vec::new(),
        Some(bytes) => match serde_json::from_slice(&bytes) {
            Ok(ids) => ids,
            Err(e) => {
                emit(
                    Level::Warn,
                    &format!("the saved activation is unreadable and starts empty: {e}"),
                );
                Vec::new()
            }
        },
    };
    if !ids.is_empty() {
        emit(
            Level::Info,
            &format!("{} hosts still handed out from before", ids.len()),
        );
    }
    Ok(settings
        .hosts
        .iter()
        .map(|h| ids.iter().any(|id| id == h.id()))
        .collect())
}

/// Writes `active` to the pool's state, then makes it the plugin's; on a refused write
/// nothing changes and the call fails as transient.
fn save_active(state: &mut State, active: Vec<bool>) -> Result<(), Error> {
    let ids: Vec<&str> = state
        .settings
        .hosts
        .iter()
        .zip(&active)
        .filter(|(_, a)| **a)
        .map(|(h, _)| h.id())
        .collect();
    let bytes = serde_json::to_vec(&ids).map_err(|e| Error::Other(e.to_string()))?;
    state::set(ACTIVE_KEY, &bytes).map_err(state_failed)?;
    state.active = active;
    Ok(())
}

fn state_failed(e: state::StateError) -> Error {
    match e {
        state::StateError::TooLarge(m) => Error::Other(format!("the pool's state: {m}")),
        state::StateError::Unavailable(m) => Error::Transient(format!("the pool's state: {m}")),
    }
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
        let saved = load_active(&settings)?;
        STATE.with(|cell| {
            cell.set(State {
                settings,
                active: saved,
            });
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
            let mut active = state.active.clone();
            let mut granted = 0u32;
            for slot in active.iter_mut().filter(|a| !**a) {
                if granted == delta {
                    break;
                }
                *slot = true;
                granted += 1;
            }
            save_active(state, active)?;
            Ok(granted)
        })
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        with_state(|state| {
            let mut active = state.active.clone();
            let mut accepted = Vec::with_capacity(ids.len());
            for id in ids {
                // Releasing an already released host is accepted (idempotent); unknown ids are not.
                if let Some((index, _)) = find(state, &id) {
                    if let Some(slot) = active.get_mut(index) {
                        *slot = false;
                    }
                    if !accepted.contains(&id) {
                        accepted.push(id);
                    }
                }
            }
            save_active(state, active)?;
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
