//! The managed instance group as Compute reports it: the manager, its instances page by page,
//! their states, and the autoscaler that must be off.

use super::*;
use crate::settings::location_ok;

/// The group as `instanceGroupManagers.get` reports it.
/// <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/get>
pub(crate) fn get_manager(state: &State) -> Result<Value, Error> {
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

pub(crate) fn target_size(manager: &Value) -> u32 {
    // int32 in the API; JSON numbers here.
    field(manager, "/targetSize")
        .as_u64()
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// One managed instance, as `listManagedInstances` reports it.
pub(crate) struct Managed {
    pub(crate) id: String,
    pub(crate) state: InstanceState,
    /// The last creation attempt's error, when Compute keeps retrying it.
    pub(crate) creation_error: Option<String>,
    /// That error is a quota or a capacity shortage.
    pub(crate) out_of_quota: bool,
}

/// The instance's id for the host: `ZONE/NAME`, parsed from its URL
/// (`https://www.googleapis.com/compute/v1/projects/P/zones/Z/instances/N`).
pub(crate) fn id_from_url(url: &str) -> Option<String> {
    let mut parts = url.rsplit('/');
    let name = parts.next()?;
    let kind = parts.next()?;
    let zone = parts.next()?;
    let zones = parts.next()?;
    (kind == "instances" && zones == "zones" && valid_name(name) && location_ok(zone, 3))
        .then(|| format!("{zone}/{name}"))
}

/// `ZONE/NAME` split, when both are well formed.
pub(crate) fn split_id(id: &str) -> Option<(&str, &str)> {
    let (zone, name) = id.split_once('/')?;
    (location_ok(zone, 3) && valid_name(name)).then_some((zone, name))
}

/// Maps `instanceStatus` and `currentAction` to the contract's states.
/// <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listManagedInstances#ManagedInstance>
pub(crate) fn map_state(status: &str, action: &str) -> InstanceState {
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
pub(crate) struct Page {
    #[serde(default)]
    pub(crate) managed_instances: Vec<ManagedInstance>,
    #[serde(default)]
    pub(crate) next_page_token: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ManagedInstance {
    #[serde(default)]
    pub(crate) instance: Option<String>,
    #[serde(default)]
    pub(crate) instance_status: Option<String>,
    #[serde(default)]
    pub(crate) current_action: Option<String>,
    #[serde(default)]
    pub(crate) last_attempt: Option<LastAttempt>,
}

#[derive(Deserialize)]
pub(crate) struct LastAttempt {
    #[serde(default)]
    pub(crate) errors: AttemptErrors,
}

#[derive(Deserialize, Default)]
pub(crate) struct AttemptErrors {
    #[serde(default)]
    pub(crate) errors: Vec<AttemptError>,
}

#[derive(Deserialize)]
pub(crate) struct AttemptError {
    #[serde(default)]
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
}

/// Every managed instance, page by page.
/// <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listManagedInstances>
pub(crate) fn list_managed(state: &State) -> Result<Vec<Managed>, Error> {
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
pub(crate) fn autoscaler_is_off(state: &State, group: &str, url: &str) -> Result<(), Error> {
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
pub(crate) fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
