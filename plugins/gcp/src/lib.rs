//! Flotilla provider for one Compute Engine managed instance group (MIG), zonal or regional.
//!
//! Scaling policy lives in the host: this plugin reads the group, resizes it up and deletes
//! the instances the host names (which lowers the target size with them). Every request names
//! the pool credential; the host mints the OAuth token (the `gcp` credential kind), so the
//! plugin holds no key.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

mod group;
mod rest;
mod settings;

use std::cell::RefCell;
use std::time::Duration;

use flotilla_guest_http::Method;
use flotilla_guest_http::unsettled::Unsettled;
use serde::Deserialize;
use serde_json::{Value, json};

use group::{autoscaler_is_off, get_manager, list_managed, split_id, target_size};
use rest::{Api, capped, field, valid_name};
use settings::parse_settings;

wit_bindgen::generate!({
    path: "../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::log::{Level, emit};
use flotilla::provider::types::{
    Arch, Capabilities, Connection, Error, Instance, InstanceState, Os, Protocol, ProviderInfo,
};

/// The largest `max_size` accepted for a zonal group: Compute's limit on its size ("you can
/// create up to 1,000 VMs in a zonal MIG").
/// <https://cloud.google.com/compute/docs/instance-groups/creating-groups-of-managed-instances#limitations>
const ZONAL_MAX_SIZE: u32 = 1000;
/// The same for a regional group ("up to 2,000 instances, twice as many as zonal MIGs").
/// <https://cloud.google.com/compute/docs/instance-groups/regional-migs>
const REGIONAL_MAX_SIZE: u32 = 2000;

/// How long `increase` answers `quota-exceeded` after instances were seen that Compute cannot
/// create for lack of quota or capacity, so the scaler backs off instead of asking again (at
/// most: a listing without such instances ends it).
const QUOTA_HOLD: Duration = Duration::from_secs(300);

/// How long `increase` and `decrease` follow their operation before returning with it
/// accepted but still running (the host's default deadline per call is 30 s).
const OPERATION_BUDGET: Duration = Duration::from_secs(15);

/// Page size of `listManagedInstances` (the API's maximum is 500).
const PAGE_SIZE: u32 = 500;

struct State {
    api: Api,
    /// `zones/ZONE` or `regions/REGION`.
    location: String,
    name: String,
    max_size: u32,
    username: String,
}

impl State {
    /// The group's path below the project: `zones/Z/instanceGroupManagers/N`, or for a
    /// regional group `regions/R/instanceGroupManagers/N`
    /// (<https://cloud.google.com/compute/docs/reference/rest/v1/regionInstanceGroupManagers>).
    fn manager(&self) -> String {
        format!("{}/instanceGroupManagers/{}", self.location, self.name)
    }

    /// Whether an instance in `zone` can belong to the group.
    fn holds_zone(&self, zone: &str) -> bool {
        match self.location.split_once('/') {
            Some(("zones", z)) => z == zone,
            Some((_, region)) => zone
                .strip_prefix(region)
                .is_some_and(|rest| rest.starts_with('-')),
            None => false,
        }
    }

    fn operations(&self) -> String {
        format!("{}/operations", self.location)
    }
}

thread_local! {
    static STATE: flotilla_guest::State<State> = const { flotilla_guest::State::new() };
    /// A resize whose answer was lost.
    static UNSETTLED: RefCell<Unsettled> = RefCell::new(Unsettled::default());
    /// When instances that Compute cannot create were last seen, and why.
    static QUOTA: RefCell<Option<(std::time::Instant, String)>> = const { RefCell::new(None) };
}

/// Whether a creation error of `lastAttempt` is a quota or a capacity shortage: retrying
/// cannot help until the operator raises the quota or the zone has capacity again. (The
/// codes as cluster-autoscaler's GCE provider classifies them, `autoscaling_gce_client.go`.)
fn out_of_quota(code: &str) -> bool {
    code.contains("QUOTA")
        || matches!(
            code,
            "RESOURCE_POOL_EXHAUSTED"
                | "ZONE_RESOURCE_POOL_EXHAUSTED"
                | "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
                | "IP_SPACE_EXHAUSTED"
        )
}

fn with<T>(f: impl FnOnce(&State) -> Result<T, Error>) -> Result<T, Error> {
    STATE.with(|s| s.read(f))
}

impl From<flotilla_guest::NotInitialized> for Error {
    fn from(e: flotilla_guest::NotInitialized) -> Self {
        Error::Other(e.to_string())
    }
}

struct Gcp;

impl Guest for Gcp {
    fn init(text: String) -> Result<ProviderInfo, Error> {
        let s = parse_settings(&text)?;
        let root = s
            .endpoint
            .as_deref()
            .unwrap_or("https://compute.googleapis.com")
            .trim_end_matches('/');
        let location = match (&s.zone, &s.region) {
            (Some(z), _) => format!("zones/{z}"),
            (_, Some(r)) => format!("regions/{r}"),
            _ => return Err(Error::InvalidConfig("zone, region: give one".into())),
        };
        let state = State {
            api: Api {
                project_url: format!("{root}/compute/v1/projects/{}", s.project),
                credential: s.credential.clone(),
            },
            location,
            name: s.name.clone(),
            max_size: s.max_size,
            username: s.username.clone(),
        };
        let manager = get_manager(&state)?;
        // An autoscaler attached to the group resizes it on its own and fights the host,
        // unless its mode is OFF ("disables the autoscaler but maintains its configuration";
        // `status.autoscaler` still names it then).
        if let Some(autoscaler) = field(&manager, "/status/autoscaler")
            .as_str()
            .filter(|a| !a.is_empty())
        {
            autoscaler_is_off(&state, &s.name, autoscaler)?;
        }
        // Both of these let Compute delete or recreate an instance while a job runs on it.
        // <https://cloud.google.com/compute/docs/instance-groups/regional-mig-distribution-shape#proactive-instance-redistribution>
        let policy = field(&manager, "/updatePolicy");
        if s.region.is_some()
            && field(policy, "/instanceRedistributionType").as_str() != Some("NONE")
        {
            emit(
                Level::Warn,
                &format!(
                    "group {}: proactive instance redistribution is on; Compute may delete an instance that runs a job to rebalance zones (set it to NONE)",
                    s.name
                ),
            );
        }
        if field(policy, "/type").as_str() == Some("PROACTIVE") {
            emit(
                Level::Warn,
                &format!(
                    "group {}: the update policy is PROACTIVE; a template change recreates instances that run jobs (use OPPORTUNISTIC)",
                    s.name
                ),
            );
        }
        if target_size(&manager) > s.max_size {
            emit(
                Level::Warn,
                &format!(
                    "group {}: target size {} is above max_size {}; the host will not grow it until it is below",
                    s.name,
                    target_size(&manager),
                    s.max_size
                ),
            );
        }
        let scope = state.location.clone();
        STATE.with(|cell| cell.set(state));
        Ok(ProviderInfo {
            id: format!("gcp/{}/{scope}/{}", s.project, s.name),
            version: env!("CARGO_PKG_VERSION").to_string(),
            max_size: s.max_size,
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: false,
            },
        })
    }

    fn update() -> Result<Vec<Instance>, Error> {
        with(|state| {
            let managed = list_managed(state)?;
            // The hold lasts while the group shows instances it cannot create; once none is
            // left (the host removed them), capacity may be back, and the scaler's own backoff
            // paces the next try. A spot pool with a fallback learns this way that it can
            // take its demand back.
            let held = managed.iter().find(|m| m.out_of_quota).map(|m| {
                let why = m.creation_error.clone().unwrap_or_default();
                (std::time::Instant::now(), why)
            });
            QUOTA.with(|q| *q.borrow_mut() = held);
            for m in &managed {
                if let Some(e) = &m.creation_error
                    && matches!(m.state, InstanceState::Creating)
                {
                    emit(
                        Level::Warn,
                        &format!("instance {}: Compute is retrying its creation: {e}", m.id),
                    );
                }
            }
            let live = managed
                .iter()
                .filter(|m| !matches!(m.state, InstanceState::Deleting | InstanceState::Deleted))
                .count();
            UNSETTLED.with(|u| {
                u.borrow_mut()
                    .listed(u32::try_from(live).unwrap_or(u32::MAX))
            });
            Ok(managed
                .into_iter()
                .map(|m| Instance {
                    id: m.id,
                    state: m.state,
                })
                .collect())
        })
    }

    fn increase(delta: u32) -> Result<u32, Error> {
        let held = QUOTA.with(|q| {
            q.borrow()
                .as_ref()
                .filter(|(at, _)| at.elapsed() < QUOTA_HOLD)
                .map(|(_, why)| why.clone())
        });
        if let Some(why) = held {
            return Err(Error::QuotaExceeded(format!(
                "the group cannot create instances: {why}"
            )));
        }
        with(|state| {
            let manager = get_manager(state)?;
            let current = target_size(&manager);
            let plan = UNSETTLED.with(|u| u.borrow_mut().plan(current, delta, state.max_size));
            if plan.target == current {
                return Ok(plan.granted);
            }
            let target = plan.target;
            // <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/resize>
            const ACTION: &str = "instanceGroupManagers.resize";
            let op = UNSETTLED.with(|u| {
                u.borrow_mut().write(
                    current,
                    target,
                    || {
                        state.api.call(
                            ACTION,
                            Method::Post,
                            &format!("{}/resize?size={target}", state.manager()),
                            None,
                        )
                    },
                    // A lost or unreadable answer may hide a resize that took effect.
                    |e| matches!(e, Error::Transient(_) | Error::Other(_)),
                )
            })?;
            // Compute accepted the resize: an operation that ends in an error is a refusal,
            // but one whose polls lose their answers still runs, and `update` shows it.
            match state
                .api
                .follow(ACTION, &state.operations(), op, OPERATION_BUDGET)
            {
                Ok(true) => {}
                Ok(false) => emit(
                    Level::Info,
                    &format!("resize to {target}: accepted, still running"),
                ),
                Err(Error::Transient(e)) => emit(
                    Level::Warn,
                    &format!("resize to {target}: accepted; its operation could not be read: {e}"),
                ),
                Err(e) => return Err(e),
            }
            Ok(plan.granted)
        })
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        with(|state| {
            // Only well-formed ids can name an instance; others are not accepted.
            let (good, bad): (Vec<String>, Vec<String>) =
                ids.into_iter().partition(|id| split_id(id).is_some());
            if !bad.is_empty() {
                emit(
                    Level::Warn,
                    &format!(
                        "decrease: {} id(s) are not ZONE/NAME and were skipped",
                        bad.len()
                    ),
                );
            }
            // An instance in a zone outside the group's cannot be one of its members, and
            // Compute fails the whole call for it: it is not there, so it counts as gone.
            let urls: Vec<String> = good
                .iter()
                .filter_map(|id| split_id(id))
                .filter(|(zone, _)| state.holds_zone(zone))
                .map(|(zone, name)| format!("zones/{zone}/instances/{name}"))
                .collect();
            if urls.is_empty() {
                return Ok(good);
            }
            // Instances that are not (or no longer) in the group are skipped rather than
            // failing the call, so a repeated decrease is a no-op; the target size drops
            // with every instance deleted.
            // <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/deleteInstances>
            const ACTION: &str = "instanceGroupManagers.deleteInstances";
            let op = state.api.call(
                ACTION,
                Method::Post,
                &format!("{}/deleteInstances", state.manager()),
                Some(&json!({
                    "instances": urls,
                    "skipInstancesOnValidationError": true,
                })),
            )?;
            state
                .api
                .follow(ACTION, &state.operations(), op, OPERATION_BUDGET)?;
            Ok(good)
        })
    }

    fn connect_info(id: String) -> Result<Connection, Error> {
        with(|state| {
            let Some((zone, name)) = split_id(&id) else {
                return Err(Error::NotFound(format!(
                    "instance {:?}: not a ZONE/NAME id of this plugin",
                    capped(&id)
                )));
            };
            // <https://cloud.google.com/compute/docs/reference/rest/v1/instances/get>
            let i = state.api.call(
                "instances.get",
                Method::Get,
                &format!("zones/{zone}/instances/{name}"),
                None,
            )?;
            let nic = field(&i, "/networkInterfaces/0");
            let internal = field(nic, "/networkIP").as_str().map(str::to_string);
            let external = field(nic, "/accessConfigs")
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|a| field(a, "/natIP").as_str())
                .map(str::to_string);
            let disks = field(&i, "/disks").as_array().cloned().unwrap_or_default();
            let windows = disks.iter().any(|d| {
                field(d, "/guestOsFeatures")
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|f| field(f, "/type").as_str() == Some("WINDOWS"))
            });
            let arch = match disks
                .iter()
                .find(|d| field(d, "/boot").as_bool() == Some(true))
                .and_then(|d| field(d, "/architecture").as_str())
            {
                Some("ARM64") => Arch::Arm64,
                _ => Arch::Amd64,
            };
            if internal.is_none() && external.is_none() {
                return Err(Error::Transient(format!("instance {id}: no address yet")));
            }
            Ok(Connection {
                id: id.clone(),
                os: if windows { Os::Windows } else { Os::Linux },
                arch,
                protocol: if windows {
                    Protocol::Winrm
                } else {
                    Protocol::Ssh
                },
                internal_address: internal,
                external_address: external,
                port: if windows { 5986 } else { 22 },
                username: state.username.clone(),
                expires: None,
                // The id's zone is the one `instances.get` was asked in and answered from.
                zone: Some(zone.to_string()),
            })
        })
    }

    fn heartbeat(_id: String) -> Result<(), Error> {
        Err(Error::Unsupported(
            "heartbeat: the group's own health checks and autohealing are used instead".into(),
        ))
    }

    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

export!(Gcp);
