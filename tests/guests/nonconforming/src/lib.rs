//! A provider of in-memory instances that breaks one rule of the contract on purpose, chosen
//! by its `flaw` setting, so the conformance kit (`flotilla plugin test`) can be shown to catch
//! each kind of bug with exactly the rule meant for it. `"flaw": "none"` follows every rule.
#![allow(unsafe_code)] // wit-bindgen's generated export glue
#![allow(missing_docs)]

use std::cell::RefCell;

wit_bindgen::generate!({
    path: "../../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::types::{
    Arch, Capabilities, Connection, Error, Instance, InstanceState, Os, Protocol, ProviderInfo,
};

const FLAWS: [&str; 7] = [
    "none",
    "increase-more",
    "decrease-extra",
    "update-duplicate",
    "accept-unknown",
    "first-problem-only",
    "decrease-not-idempotent",
];

#[derive(Clone, Copy, PartialEq)]
enum Life {
    Creating,
    Running,
    Deleting,
}

struct State {
    flaw: &'static str,
    next: u32,
    instances: Vec<(String, Life)>,
}

thread_local! {
    static STATE: RefCell<State> = const { RefCell::new(State { flaw: "none", next: 0, instances: Vec::new() }) };
}

fn parse(text: &str) -> Result<&'static str, Error> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::InvalidConfig(format!("settings: {e}")))?;
    let map = value
        .as_object()
        .ok_or_else(|| Error::InvalidConfig("settings: must be an object".into()))?;
    let flaw = map.get("flaw").and_then(|f| f.as_str()).unwrap_or("none");
    let Some(flaw) = FLAWS.iter().copied().find(|f| *f == flaw) else {
        return Err(Error::InvalidConfig(format!(
            "flaw: {flaw:?} is not one of {}",
            FLAWS.join(", ")
        )));
    };
    let unknown: Vec<String> = map
        .keys()
        .filter(|k| k.as_str() != "flaw")
        .map(|k| format!("{k}: unknown key"))
        .collect();
    match (flaw, unknown.first()) {
        (_, None) | ("accept-unknown", _) => Ok(flaw),
        ("first-problem-only", Some(first)) => Err(Error::InvalidConfig(first.clone())),
        _ => Err(Error::InvalidConfig(unknown.join("; "))),
    }
}

struct Nonconforming;

impl Guest for Nonconforming {
    fn init(text: String) -> Result<ProviderInfo, Error> {
        let flaw = parse(&text)?;
        STATE.with(|s| s.borrow_mut().flaw = flaw);
        Ok(ProviderInfo {
            id: "nonconforming/memory".into(),
            version: "0.1.0".into(),
            max_size: 10,
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: false,
            },
        })
    }

    fn update() -> Result<Vec<Instance>, Error> {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            // What was asked for last time has moved on by now.
            s.instances.retain(|(_, life)| *life != Life::Deleting);
            for (_, life) in &mut s.instances {
                *life = Life::Running;
            }
            let mut list: Vec<Instance> = s
                .instances
                .iter()
                .map(|(id, _)| Instance {
                    id: id.clone(),
                    state: InstanceState::Running,
                })
                .collect();
            if s.flaw == "update-duplicate"
                && let Some(first) = list.first()
            {
                let copy = Instance {
                    id: first.id.clone(),
                    state: InstanceState::Running,
                };
                list.push(copy);
            }
            Ok(list)
        })
    }

    fn increase(delta: u32) -> Result<u32, Error> {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            for _ in 0..delta {
                s.next += 1;
                let id = format!("mem-{}", s.next);
                s.instances.push((id, Life::Creating));
            }
            Ok(if s.flaw == "increase-more" {
                delta + 1
            } else {
                delta
            })
        })
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let flaw = s.flaw;
            let mut accepted = Vec::new();
            for id in ids {
                match s.instances.iter_mut().find(|(i, _)| *i == id) {
                    Some((_, Life::Deleting)) if flaw == "decrease-not-idempotent" => {
                        return Err(Error::NotFound(format!("{id} is already being deleted")));
                    }
                    Some((_, life)) => {
                        *life = Life::Deleting;
                        accepted.push(id);
                    }
                    None => {}
                }
            }
            if flaw == "decrease-extra" {
                accepted.push("mem-not-asked".into());
            }
            Ok(accepted)
        })
    }

    fn connect_info(id: String) -> Result<Connection, Error> {
        STATE.with(|s| {
            if !s.borrow().instances.iter().any(|(i, _)| *i == id) {
                return Err(Error::NotFound(format!("no instance {id}")));
            }
            Ok(Connection {
                id,
                os: Os::Linux,
                arch: Arch::Amd64,
                protocol: Protocol::Ssh,
                internal_address: Some("192.0.2.1".into()),
                external_address: None,
                port: 22,
                username: "runner".into(),
                expires: None,
                zone: None,
            })
        })
    }

    fn heartbeat(_id: String) -> Result<(), Error> {
        Err(Error::Unsupported("no heartbeat".into()))
    }

    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

export!(Nonconforming);
