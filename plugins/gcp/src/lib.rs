//! Flotilla provider for one Compute Engine managed instance group (MIG), zonal or regional.
//!
//! Scaling policy lives in the host: this plugin reads the group, resizes it up and deletes
//! the instances the host names (which lowers the target size with them). Every request names
//! the pool credential; the host mints the OAuth token (the `gcp` credential kind), so the
//! plugin holds no key.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

mod rest;

use std::cell::RefCell;
use std::time::Duration;

use flotilla_plugin_http::Method;
use flotilla_plugin_http::unsettled::Unsettled;
use serde::Deserialize;
use serde_json::{Value, json};

use rest::{Api, capped, field, valid_name};

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

/// The pool's `plugin_config`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// The project id.
    project: String,
    /// The zone of a zonal group (`us-central1-a`); give this or `region`.
    #[serde(default)]
    zone: Option<String>,
    /// The region of a regional group (`us-central1`); give this or `zone`.
    #[serde(default)]
    region: Option<String>,
    /// The managed instance group's name.
    name: String,
    /// The most instances the plugin lets the group grow to (a MIG has no maximum of its own).
    max_size: u32,
    /// The API's root, default `https://compute.googleapis.com` (emulators, private endpoints).
    #[serde(default)]
    endpoint: Option<String>,
    /// The pool credential (kind `gcp`) whose tokens the host adds.
    #[serde(default = "default_credential")]
    credential: String,
    /// SSH user for connect-info of Linux instances.
    #[serde(default = "default_user")]
    username: String,
}

fn default_credential() -> String {
    "gcp".to_string()
}
fn default_user() -> String {
    "flotilla".to_string()
}

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
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
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
    STATE.with(|s| match s.borrow().as_ref() {
        Some(state) => f(state),
        None => Err(Error::Other("init has not been called".into())),
    })
}

/// A zone like `us-central1-a` or a region like `us-central1`: lowercase words and digits
/// joined by dashes, `parts` of them.
fn location_ok(text: &str, parts: usize) -> bool {
    let words: Vec<&str> = text.split('-').collect();
    words.len() == parts
        && words.iter().all(|w| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
}

/// A project id (6–30 characters; lowercase letters, digits, dashes), optionally
/// domain-scoped (`example.com:my-project`).
fn project_ok(project: &str) -> bool {
    let id = project.rsplit(':').next().unwrap_or_default();
    (6..=30).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && !id.ends_with('-')
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && project
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:".contains(c))
}

/// The settings keys; any other key is a problem.
const KEYS: [&str; 8] = [
    "project",
    "zone",
    "region",
    "name",
    "max_size",
    "endpoint",
    "credential",
    "username",
];

/// Reads the settings, reporting every problem at once: each unknown key, a missing or
/// mistyped key, and each bad value.
fn parse_settings(text: &str) -> Result<Settings, Error> {
    let (s, mut problems) = flotilla_plugin_settings::read::<Settings>(text, &KEYS)
        .map_err(|p| Error::InvalidConfig(p.join("; ")))?;
    if !project_ok(&s.project) {
        problems.push(format!(
            "project: {:?} is not a project id (6-30 lowercase letters, digits, dashes)",
            capped(&s.project)
        ));
    }
    match (&s.zone, &s.region) {
        (Some(_), Some(_)) => {
            problems.push("zone, region: give one, not both".to_string());
        }
        (None, None) => problems.push(
            "zone, region: give `zone` for a zonal group or `region` for a regional one"
                .to_string(),
        ),
        (Some(z), None) if !location_ok(z, 3) => problems.push(format!(
            "zone: {:?} is not a zone like us-central1-a",
            capped(z)
        )),
        (None, Some(r)) if !location_ok(r, 2) => problems.push(format!(
            "region: {:?} is not a region like us-central1",
            capped(r)
        )),
        _ => {}
    }
    let name_ok = valid_name(&s.name)
        && s.name.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.name.ends_with('-');
    if !name_ok {
        problems.push(format!(
            "name: {:?} is not a group name (1-63 lowercase letters, digits, dashes)",
            capped(&s.name)
        ));
    }
    let (limit, kind) = if s.region.is_some() {
        (REGIONAL_MAX_SIZE, "regional")
    } else {
        (ZONAL_MAX_SIZE, "zonal")
    };
    if s.max_size == 0 || s.max_size > limit {
        problems.push(format!(
            "max_size: must be 1-{limit} (Compute's limit on a {kind} group's size)"
        ));
    }
    if let Some(e) = &s.endpoint
        && let Err(why) = flotilla_plugin_http::split_url(e)
    {
        problems.push(format!("endpoint: {why}"));
    }
    if s.credential.is_empty() {
        problems.push("credential: must name a pool credential".to_string());
    }
    if s.username.is_empty() || s.username.len() > 32 {
        problems.push("username: must be 1-32 characters".to_string());
    }
    if problems.is_empty() {
        Ok(s)
    } else {
        Err(Error::InvalidConfig(problems.join("; ")))
    }
}

/// The group as `instanceGroupManagers.get` reports it.
/// <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/get>
fn get_manager(state: &State) -> Result<Value, Error> {
    let m = state.api.call(
        "instanceGroupManagers.get",
        Method::Get,
        &state.manager(),
        None,
    )?;
    if field(&m, "/targetSize").is_null() {
        return Err(Error::Other(
            "instanceGroupManagers.get: the answer has no targetSize".into(),
        ));
    }
    Ok(m)
}

fn target_size(manager: &Value) -> u32 {
    // int32 in the API; JSON numbers here.
    field(manager, "/targetSize")
        .as_u64()
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// One managed instance, as `listManagedInstances` reports it.
struct Managed {
    id: String,
    state: InstanceState,
    /// The last creation attempt's error, when Compute keeps retrying it.
    creation_error: Option<String>,
    /// That error is a quota or a capacity shortage.
    out_of_quota: bool,
}

/// The instance's id for the host: `ZONE/NAME`, parsed from its URL
/// (`https://www.googleapis.com/compute/v1/projects/P/zones/Z/instances/N`).
fn id_from_url(url: &str) -> Option<String> {
    let mut parts = url.rsplit('/');
    let name = parts.next()?;
    let kind = parts.next()?;
    let zone = parts.next()?;
    let zones = parts.next()?;
    (kind == "instances" && zones == "zones" && valid_name(name) && location_ok(zone, 3))
        .then(|| format!("{zone}/{name}"))
}

/// `ZONE/NAME` split, when both are well formed.
fn split_id(id: &str) -> Option<(&str, &str)> {
    let (zone, name) = id.split_once('/')?;
    (location_ok(zone, 3) && valid_name(name)).then_some((zone, name))
}

/// Maps `instanceStatus` and `currentAction` to the contract's states.
/// <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listManagedInstances#ManagedInstance>
fn map_state(status: &str, action: &str) -> InstanceState {
    match action {
        "DELETING" | "ABANDONING" => return InstanceState::Deleting,
        "CREATING"
        | "CREATING_WITHOUT_RETRIES"
        | "CREATING_ATOMICALLY"
        | "QUEUING"
        | "VERIFYING" => return InstanceState::Creating,
        // The group is replacing or restarting it: whatever runs there is lost.
        "RECREATING" | "RESTARTING" | "STOPPING" | "SUSPENDING" | "STARTING" | "RESUMING" => {
            return InstanceState::Failed(format!("the group is {action} it"));
        }
        // REFRESHING "is applying configuration changes to the instance without stopping it"
        // (discovery doc, ManagedInstance.currentAction): a busy VM keeps its job, and its
        // status decides, like NONE.
        _ => {}
    }
    match status {
        "RUNNING" => InstanceState::Running,
        "" | "PROVISIONING" | "STAGING" | "PENDING" => InstanceState::Creating,
        // Nothing of ours stops a group's instance: Compute does, when it preempts a Spot
        // VM (its termination action STOP; DELETE makes it vanish), the way
        // <https://cloud.google.com/compute/docs/instances/spot#preemption-process> describes.
        "STOPPING" | "TERMINATED" | "STOPPED" => InstanceState::Failed(format!(
            "Compute stopped it ({status}): a Spot VM is preempted this way when Compute takes \
             its capacity back"
        )),
        other => InstanceState::Failed(format!("instance status {other}")),
    }
}

/// One page of `listManagedInstances`: the fields the plugin reads.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    #[serde(default)]
    managed_instances: Vec<ManagedInstance>,
    #[serde(default)]
    next_page_token: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManagedInstance {
    #[serde(default)]
    instance: Option<String>,
    #[serde(default)]
    instance_status: Option<String>,
    #[serde(default)]
    current_action: Option<String>,
    #[serde(default)]
    last_attempt: Option<LastAttempt>,
}

#[derive(Deserialize)]
struct LastAttempt {
    #[serde(default)]
    errors: AttemptErrors,
}

#[derive(Deserialize, Default)]
struct AttemptErrors {
    #[serde(default)]
    errors: Vec<AttemptError>,
}

#[derive(Deserialize)]
struct AttemptError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Every managed instance, page by page.
/// <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listManagedInstances>
fn list_managed(state: &State) -> Result<Vec<Managed>, Error> {
    const ACTION: &str = "instanceGroupManagers.listManagedInstances";
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut path = format!(
            "{}/listManagedInstances?maxResults={PAGE_SIZE}",
            state.manager()
        );
        if let Some(t) = &token {
            path.push_str("&pageToken=");
            path.push_str(&percent(t));
        }
        let page: Page = state.api.call_as(ACTION, Method::Post, &path, None)?;
        for m in page.managed_instances {
            let Some(id) = m.instance.as_deref().and_then(id_from_url) else {
                // An instance not created yet has no URL; it shows once it has one.
                continue;
            };
            let first = m
                .last_attempt
                .and_then(|a| a.errors.errors.into_iter().next());
            let out_of_quota = first.as_ref().is_some_and(|e| out_of_quota(&e.code));
            let creation_error = first.map(|e| format!("{}: {}", e.code, capped(&e.message)));
            let mut state = map_state(
                m.instance_status.as_deref().unwrap_or_default(),
                m.current_action.as_deref().unwrap_or_default(),
            );
            // A resize is DONE once scheduled; a quota or a stockout shows only here, while
            // the group retries for ever (`resize` in the discovery doc). Such an instance is
            // not coming: it is failed, so the host removes it and stops waiting for it.
            if let (true, InstanceState::Creating, Some(why)) =
                (out_of_quota, &state, &creation_error)
            {
                state = InstanceState::Failed(format!("Compute cannot create it: {why}"));
            }
            out.push(Managed {
                id,
                state,
                creation_error,
                out_of_quota,
            });
        }
        token = page.next_page_token.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// `Ok` when the autoscaler at `url` (`.../projects/P/zones/Z/autoscalers/N`) is in mode OFF;
/// `invalid-config` that says what to do otherwise.
/// <https://cloud.google.com/compute/docs/reference/rest/v1/autoscalers/get>
fn autoscaler_is_off(state: &State, group: &str, url: &str) -> Result<(), Error> {
    let refuse = |why: String| {
        Error::InvalidConfig(format!(
            "group {group}: an autoscaler is attached ({}){why}; Flotilla sizes the group itself, so remove it or set its mode to OFF",
            capped(url)
        ))
    };
    let name = url.rsplit('/').next().unwrap_or_default();
    let kind = url.rsplit('/').nth(1).unwrap_or_default();
    if kind != "autoscalers" || !valid_name(name) {
        return Err(refuse(String::new()));
    }
    let path = format!("{}/autoscalers/{name}", state.location);
    let autoscaler = match state.api.call("autoscalers.get", Method::Get, &path, None) {
        Ok(a) => a,
        Err(Error::Unauthorized(m)) => {
            return Err(refuse(format!(
                " and its mode cannot be read ({m}; grant compute.autoscalers.get)"
            )));
        }
        Err(e) => return Err(e),
    };
    match field(&autoscaler, "/autoscalingPolicy/mode").as_str() {
        Some("OFF") => {
            emit(
                Level::Info,
                &format!("group {group}: its autoscaler is attached in mode OFF and left alone"),
            );
            Ok(())
        }
        mode => Err(refuse(format!(" in mode {}", mode.unwrap_or("ON")))),
    }
}

/// A page token, percent-encoded for the query string.
fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
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
        STATE.with(|cell| *cell.borrow_mut() = Some(state));
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
