//! Flotilla provider for one Azure virtual machine scale set, Uniform or Flexible.
//!
//! Scaling policy lives in the host: this plugin reads the set, raises its capacity and
//! deletes the instances the host names (Delete Instances, so the capacity drops with them).
//! Every request names the pool credential; the host authorises it with an Entra ID token
//! (`Authorization: Bearer`), so the plugin never holds a secret.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

mod arm;
mod vmss;

use std::cell::RefCell;
use std::time::{Duration, Instant};

use flotilla_guest_http::unsettled::Unsettled;
use serde::Deserialize;

use arm::Arm;
use vmss::{Mode, ScaleSet};

wit_bindgen::generate!({
    path: "../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::log::{Level, emit};
use flotilla::provider::types::{
    Arch, Capabilities, Connection, Error, Instance, Os, Protocol, ProviderInfo,
};

/// How long `increase` and `decrease` follow their operations in all, well inside the host's
/// deadlines: a quick failure (quota, allocation) is reported; a slow success goes on in the
/// cloud and shows in `update`.
const OPERATION_BUDGET: Duration = Duration::from_secs(8);
/// The most VMs a scale set holds (both orchestration modes), the default `max_size`.
/// <https://learn.microsoft.com/en-us/azure/virtual-machine-scale-sets/virtual-machine-scale-sets-placement-groups>
const PLATFORM_MAX: u32 = 1000;

/// CPU architecture of the set's VMs (ARM does not say it outside the size's name).
#[derive(Debug, Clone, Copy, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum ArchSetting {
    #[default]
    Amd64,
    Arm64,
}

/// The pool's `plugin_config`. Required keys are options so that every missing one is
/// reported with the other problems.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// The subscription (a GUID).
    subscription_id: Option<String>,
    /// The resource group holding the set.
    resource_group: Option<String>,
    /// The scale set's name.
    name: Option<String>,
    /// Azure Resource Manager (sovereign clouds, tests).
    #[serde(default = "default_endpoint")]
    endpoint: String,
    /// The pool credential the host authorises requests with.
    #[serde(default = "default_credential")]
    credential: String,
    /// Login user for connect-info of Linux VMs.
    #[serde(default = "default_user")]
    username: String,
    /// The most instances the plugin lets the set hold (a scale set has no maximum of its own).
    #[serde(default = "default_max_size")]
    max_size: u32,
    /// CPU architecture reported by connect-info.
    #[serde(default)]
    arch: ArchSetting,
}

fn default_endpoint() -> String {
    "https://management.azure.com".to_string()
}
fn default_credential() -> String {
    "azure".to_string()
}
fn default_user() -> String {
    "azureuser".to_string()
}
fn default_max_size() -> u32 {
    PLATFORM_MAX
}

/// Checked settings.
struct Valid {
    subscription_id: String,
    resource_group: String,
    name: String,
    settings: Settings,
}

fn is_guid(s: &str) -> bool {
    let groups: Vec<usize> = s.split('-').map(str::len).collect();
    groups == [8, 4, 4, 4, 12] && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// Reads the settings, reporting every problem at once (each unknown key included).
fn parse_settings(text: &str) -> Result<Valid, Error> {
    let (s, mut problems) = flotilla_guest::settings::read::<Settings>(text)
        .map_err(|p| Error::InvalidConfig(p.join("; ")))?;
    let mut required = |key: &str, value: &Option<String>| match value {
        Some(v) if !v.is_empty() => v.clone(),
        _ => {
            problems.push(format!("{key}: is required"));
            String::new()
        }
    };
    let subscription_id = required("subscription_id", &s.subscription_id);
    let resource_group = required("resource_group", &s.resource_group);
    let name = required("name", &s.name);
    if !subscription_id.is_empty() && !is_guid(&subscription_id) {
        problems.push(format!(
            "subscription_id: {subscription_id:?} is not a subscription id (a GUID)"
        ));
    }
    let group_ok = resource_group.len() <= 90
        && !resource_group.ends_with('.')
        && resource_group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '(' | ')'));
    if !resource_group.is_empty() && !group_ok {
        problems.push(format!(
            "resource_group: {resource_group:?} is not a resource group name (1-90 letters, digits, - _ . ( ))"
        ));
    }
    let name_ok = name.len() <= 64 && vmss::plausible_id(&name);
    if !name.is_empty() && !name_ok {
        problems.push(format!(
            "name: {name:?} is not a scale set name (1-64 letters, digits, - _ .)"
        ));
    }
    if let Err(why) = flotilla_guest_http::split_url(&s.endpoint) {
        problems.push(format!("endpoint: {why}"));
    }
    if s.credential.is_empty() {
        problems.push("credential: must name a pool credential".to_string());
    }
    if s.username.is_empty() || s.username.len() > 64 {
        problems.push("username: must be 1-64 characters".to_string());
    }
    if s.max_size == 0 || s.max_size > PLATFORM_MAX {
        problems.push(format!(
            "max_size: must be 1-{PLATFORM_MAX} (a scale set holds at most {PLATFORM_MAX} VMs)"
        ));
    }
    if problems.is_empty() {
        Ok(Valid {
            subscription_id,
            resource_group,
            name,
            settings: s,
        })
    } else {
        Err(Error::InvalidConfig(problems.join("; ")))
    }
}

struct State {
    set: ScaleSet,
    username: String,
    max_size: u32,
    arch: Arch,
}

thread_local! {
    static STATE: flotilla_guest::State<State> = const { flotilla_guest::State::new() };
    /// A capacity change whose answer was lost.
    static UNSETTLED: RefCell<Unsettled> = RefCell::new(Unsettled::default());
}

fn with<T>(f: impl FnOnce(&State) -> Result<T, Error>) -> Result<T, Error> {
    STATE.with(|s| s.read(f))
}

impl From<flotilla_guest::NotInitialized> for Error {
    fn from(e: flotilla_guest::NotInitialized) -> Self {
        Error::Other(e.to_string())
    }
}

struct Azure;

impl Guest for Azure {
    fn init(text: String) -> Result<ProviderInfo, Error> {
        let v = parse_settings(&text)?;
        let arm = Arm {
            endpoint: v.settings.endpoint.trim_end_matches('/').to_string(),
            credential: v.settings.credential.clone(),
        };
        let group_path = format!(
            "/subscriptions/{}/resourceGroups/{}",
            v.subscription_id, v.resource_group
        );
        let id = format!(
            "{group_path}/providers/Microsoft.Compute/virtualMachineScaleSets/{}",
            v.name
        );
        let info = vmss::get_set(&arm, &id)?;
        if info.mode == Mode::Uniform && info.overprovision {
            emit(
                Level::Warn,
                &format!(
                    "scale set {}: overprovisioning is on; Azure starts extra VMs on every scale-out and deletes them again, which the pool sees as instances that come and go",
                    v.name
                ),
            );
        }
        STATE.with(|cell| {
            cell.set(State {
                set: ScaleSet {
                    arm,
                    group_path,
                    id,
                    mode: info.mode,
                    windows: info.windows,
                },
                username: v.settings.username.clone(),
                max_size: v.settings.max_size,
                arch: match v.settings.arch {
                    ArchSetting::Amd64 => Arch::Amd64,
                    ArchSetting::Arm64 => Arch::Arm64,
                },
            })
        });
        Ok(ProviderInfo {
            id: format!(
                "azure/{}/{}/{}",
                v.subscription_id, v.resource_group, v.name
            ),
            version: env!("CARGO_PKG_VERSION").to_string(),
            max_size: v.settings.max_size,
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: false,
            },
        })
    }

    fn update() -> Result<Vec<Instance>, Error> {
        with(|state| {
            let vms = state.set.instances()?;
            let live = vms.iter().filter(|vm| vm.live()).count();
            UNSETTLED.with(|u| {
                u.borrow_mut()
                    .listed(u32::try_from(live).unwrap_or(u32::MAX))
            });
            Ok(vms
                .into_iter()
                .map(|vm| Instance {
                    id: vm.id,
                    state: vm.state,
                })
                .collect())
        })
    }

    fn increase(delta: u32) -> Result<u32, Error> {
        with(|state| {
            let info = vmss::get_set(&state.set.arm, &state.set.id)?;
            // Count against what exists or is coming: the capacity may lag behind VMs that
            // are still there, and the host waits for every instance reported.
            let live = state.set.instances()?.iter().filter(|vm| vm.live()).count();
            let base = info.capacity.max(u32::try_from(live).unwrap_or(u32::MAX));
            let plan = UNSETTLED.with(|u| u.borrow_mut().plan(base, delta, state.max_size));
            if plan.target == base {
                return Ok(plan.granted);
            }
            // A lost or unreadable answer may hide a capacity change that took effect.
            UNSETTLED.with(|u| {
                u.borrow_mut().write(
                    base,
                    plan.target,
                    || state.set.set_capacity(plan.target, OPERATION_BUDGET),
                    |e| matches!(e, Error::Transient(_) | Error::Other(_)),
                )
            })?;
            Ok(plan.granted)
        })
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        with(|state| decrease(&state.set, ids))
    }

    fn connect_info(id: String) -> Result<Connection, Error> {
        with(|state| {
            let found = state.set.addresses(&id)?;
            let windows = found.windows;
            Ok(Connection {
                id: id.clone(),
                os: if windows { Os::Windows } else { Os::Linux },
                arch: state.arch,
                protocol: if windows {
                    Protocol::Winrm
                } else {
                    Protocol::Ssh
                },
                internal_address: found.private,
                external_address: found.public,
                port: if windows { 5986 } else { 22 },
                username: state.username.clone(),
                expires: None,
                zone: found.zone,
            })
        })
    }

    fn heartbeat(_id: String) -> Result<(), Error> {
        Err(Error::Unsupported(
            "heartbeat: the scale set's power and provisioning states feed update instead".into(),
        ))
    }

    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

/// Deletes what is still there, in one Delete Instances call; if that fails, one call per id,
/// so that one bad instance does not hold back the others. Ids that are gone or already
/// deleting count as accepted.
fn decrease(set: &ScaleSet, ids: Vec<String>) -> Result<Vec<String>, Error> {
    let start = Instant::now();
    let vms = set.instances()?;
    let mut wanted: Vec<String> = Vec::new();
    for id in ids {
        if !wanted.contains(&id) {
            wanted.push(id);
        }
    }
    let (mut accepted, present): (Vec<String>, Vec<String>) = wanted
        .into_iter()
        .partition(|id| !vms.iter().any(|vm| &vm.id == id && vm.live()));
    if present.is_empty() {
        return Ok(accepted);
    }
    let first = match set.delete(&present, OPERATION_BUDGET) {
        Ok(_) => {
            accepted.extend(present);
            return Ok(accepted);
        }
        Err(e) => e,
    };
    let stop = |e: &Error| matches!(e, Error::Unauthorized(_) | Error::Throttled(_));
    if present.len() == 1 || stop(&first) {
        return if accepted.is_empty() {
            Err(first)
        } else {
            Ok(accepted)
        };
    }
    let mut last_error = first;
    for id in present {
        let left = OPERATION_BUDGET.saturating_sub(start.elapsed());
        match set.delete(std::slice::from_ref(&id), left) {
            Ok(_) => accepted.push(id),
            Err(e) => {
                let halt = stop(&e);
                last_error = e;
                if halt {
                    break;
                }
            }
        }
    }
    if accepted.is_empty() {
        Err(last_error)
    } else {
        Ok(accepted)
    }
}

export!(Azure);
