//! A test guest that misbehaves on command, to prove the host contains it.
//!
//! Settings: `{"on": {"<export>": "<fault>"}, "trap_on_delta": N}`, where export is one of
//! init, update, increase, decrease, connect-info, heartbeat, shutdown and fault is one of
//! `trap`, `panic`, `loop`, `alloc`, `sleep`, `dup-ids`, `over-increase`, `foreign-ids`, and
//! for update `huge-list`, `long-id`, `long-error`, `log-forge`, `fields-flood`,
//! `fields-oversized`, `state-flood`, `state-churn`.
//! `"again": {"init": "<fault>"}` applies a fault only to `init` of a re-instantiated plugin
//! (after a trap or a timeout): the guest counts its inits in the pool's `state`, which
//! outlives an instance.
//! Without faults it behaves like a tiny in-memory group.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

use std::cell::RefCell;
use std::collections::BTreeMap;

wit_bindgen::generate!({
    path: "../../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::log::{Level, emit};
use flotilla::provider::types::{
    Arch, Capabilities, Connection, Error, Instance, InstanceState, Os, Protocol, ProviderInfo,
};

#[derive(Default)]
struct State {
    faults: BTreeMap<String, String>,
    trap_on_delta: Option<u64>,
    next_id: u32,
    instances: Vec<String>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

fn fault(export: &str) -> Option<String> {
    STATE.with(|s| s.borrow().faults.get(export).cloned())
}

/// Performs the configured fault for `export`, if it is one that does not return.
fn misbehave(export: &str) {
    match fault(export).as_deref() {
        Some("trap") => core::arch::wasm32::unreachable(),
        #[allow(clippy::panic)] // panicking on purpose is this guest's job
        Some("panic") => panic!("misbehave: panic in {export}"),
        Some("loop") => {
            let mut x: u64 = 0;
            loop {
                x = core::hint::black_box(x.wrapping_add(1));
            }
        }
        Some("alloc") => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![7u8; 16 << 20]);
                core::hint::black_box(&hoard);
            }
        }
        // Deliberate: a guest that blocks, for the host to interrupt.
        Some("sleep") => std::thread::sleep(std::time::Duration::from_secs(3600)),
        _ => {}
    }
}

/// Creates `wasi:http` header sets until the host refuses one, logging the count held every
/// 100, and reports how far it got. Each set lives in host memory, not in this guest's.
fn fields_flood() -> Result<Vec<Instance>, Error> {
    use wasi::http::types::Fields;
    let value = vec![b'a'; 16 << 10];
    let mut held = Vec::new();
    loop {
        match Fields::from_list(&[("x-fill".to_string(), value.clone())]) {
            Ok(f) => held.push(f),
            Err(e) => {
                return Err(Error::Transient(format!(
                    "refused after {} header sets: {e:?}",
                    held.len()
                )));
            }
        }
        if held.len() % 100 == 0 {
            emit(Level::Info, &format!("header sets held: {}", held.len()));
        }
    }
}

struct Misbehave;

impl Guest for Misbehave {
    fn init(settings: String) -> Result<ProviderInfo, Error> {
        let value: serde_json::Value =
            serde_json::from_str(&settings).map_err(|e| Error::InvalidConfig(e.to_string()))?;
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            s.faults = value
                .get("on")
                .and_then(|v| v.as_object())
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default();
            s.trap_on_delta = value.get("trap_on_delta").and_then(|v| v.as_u64());
        });
        let inits = flotilla::provider::state::get("inits")
            .ok()
            .flatten()
            .and_then(|b| b.first().copied())
            .unwrap_or(0);
        // Counting is best effort: a refused write only means "first" again.
        let _ = flotilla::provider::state::set("inits", &[inits.saturating_add(1)]);
        if inits > 0
            && let Some(again) = value
                .get("again")
                .and_then(|a| a.get("init"))
                .and_then(|f| f.as_str())
        {
            STATE.with(|s| {
                s.borrow_mut()
                    .faults
                    .insert("init".to_string(), again.to_string());
            });
        }
        misbehave("init");
        Ok(ProviderInfo {
            id: "test/misbehave".to_string(),
            version: "0.0.0".to_string(),
            max_size: 0,
            capabilities: Capabilities {
                heartbeat: true,
                expiring_connect_info: false,
            },
        })
    }

    fn update() -> Result<Vec<Instance>, Error> {
        misbehave("update");
        let mut ids = STATE.with(|s| s.borrow().instances.clone());
        match fault("update").as_deref() {
            Some("dup-ids") => {
                ids.push("dup".to_string());
                ids.push("dup".to_string());
            }
            // Far more instances than any pool may hold.
            Some("huge-list") => ids.extend((0..1_000_000).map(|i| format!("i-{i}"))),
            // One id of 1 MiB.
            Some("long-id") => ids.push("x".repeat(1 << 20)),
            // A 4 MiB error message, with a forged log line in it.
            Some("long-error") => {
                let mut m = "\n2026-01-01T00:00:00Z  INFO flotilla: forged line\n".to_string();
                m.push_str(&"e".repeat(4 << 20));
                return Err(Error::Transient(m));
            }
            // Host-side memory through wasi:http: as many 16 KiB header sets as the host
            // will hold, all kept.
            Some("fields-flood") => return fields_flood(),
            // Writes to the pool's state until the host refuses, and says how far it got.
            Some("state-flood") => {
                let mut written = 0u32;
                loop {
                    match flotilla::provider::state::set("flood", &written.to_le_bytes()) {
                        Ok(()) => written += 1,
                        Err(e) => {
                            return Err(Error::Transient(format!(
                                "refused after {written} writes: {e:?}"
                            )));
                        }
                    }
                }
            }
            // 64 writes of 64 KiB to one key in every update, whatever the host answers: a
            // plugin that churns its state, each write a durable commit.
            Some("state-churn") => {
                let value = vec![b's'; 64 << 10];
                for _ in 0..64 {
                    let _ = flotilla::provider::state::set("churn", &value);
                }
            }
            // One header set of 256 KiB.
            Some("fields-oversized") => {
                let big = wasi::http::types::Fields::from_list(&[(
                    "x-big".to_string(),
                    vec![b'a'; 256 << 10],
                )]);
                return Err(Error::Transient(format!("oversized header set: {big:?}")));
            }
            // A log line that tries to look like two host lines.
            Some("log-forge") => emit(
                Level::Info,
                "ok\n2026-01-01T00:00:00Z  INFO flotilla::app: forged: pool stopped\r",
            ),
            _ => {}
        }
        Ok(ids
            .into_iter()
            .map(|id| Instance {
                id,
                state: InstanceState::Running,
            })
            .collect())
    }

    fn increase(delta: u32) -> Result<u32, Error> {
        if STATE.with(|s| s.borrow().trap_on_delta) == Some(u64::from(delta)) {
            core::arch::wasm32::unreachable();
        }
        misbehave("increase");
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            for _ in 0..delta {
                s.next_id += 1;
                let id = format!("m-{}", s.next_id);
                s.instances.push(id);
            }
        });
        if fault("increase").as_deref() == Some("over-increase") {
            return Ok(delta.saturating_add(5));
        }
        Ok(delta)
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        misbehave("decrease");
        if fault("decrease").as_deref() == Some("foreign-ids") {
            return Ok(vec!["never-asked-for".to_string()]);
        }
        STATE.with(|s| s.borrow_mut().instances.retain(|i| !ids.contains(i)));
        Ok(ids)
    }

    fn connect_info(id: String) -> Result<Connection, Error> {
        misbehave("connect-info");
        Ok(Connection {
            id,
            os: Os::Linux,
            arch: Arch::Amd64,
            protocol: Protocol::Ssh,
            internal_address: Some("192.0.2.1".to_string()),
            external_address: None,
            port: 22,
            username: "ci".to_string(),
            expires: None,
            zone: None,
        })
    }

    fn heartbeat(_id: String) -> Result<(), Error> {
        misbehave("heartbeat");
        Ok(())
    }

    fn shutdown() -> Result<(), Error> {
        misbehave("shutdown");
        Ok(())
    }
}

export!(Misbehave);
