//! Flotilla provider for one EC2 Auto Scaling group.
//!
//! Scaling policy lives in the host: this plugin reads the group, sets its desired capacity
//! and terminates the instances the host names. Every request names the pool credential;
//! the host signs it with SigV4 (see the WIT's "Credentials" section).
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

mod query;

use std::cell::RefCell;

use flotilla_guest_http::unsettled::Unsettled;
use serde::Deserialize;

use query::{Endpoint, child, child_node};

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
    /// The Auto Scaling group's name.
    name: String,
    /// Its region, e.g. `eu-west-1`.
    region: String,
    /// Optional endpoint override (emulators, GovCloud, China), used for both services.
    #[serde(default)]
    endpoint: Option<String>,
    /// The pool credential to sign with.
    #[serde(default = "default_credential")]
    credential: String,
    /// SSH user for connect-info (default `ec2-user`).
    #[serde(default = "default_user")]
    username: String,
    /// Push the pool's SSH public key with EC2 Instance Connect (`SendSSHPublicKey`) in every
    /// `connect-info` of a Linux instance, as fleeting-plugin-aws does. The key is good for 60
    /// seconds, so the connection info expires after 50. Needs the pool's `[pool.connector]`.
    #[serde(default)]
    instance_connect: bool,
}

fn default_credential() -> String {
    "aws".to_string()
}
fn default_user() -> String {
    "ec2-user".to_string()
}

struct State {
    name: String,
    endpoint: Endpoint,
    username: String,
    /// The pool's SSH public key, when Instance Connect pushes it.
    instance_connect: Option<String>,
}

/// How long a pushed key is good for, by AWS's documentation, less a margin for the
/// connection itself.
const INSTANCE_CONNECT_VALID_SECONDS: u64 = 50;

thread_local! {
    static STATE: flotilla_guest::State<State> = const { flotilla_guest::State::new() };
    /// A `SetDesiredCapacity` whose answer was lost.
    static UNSETTLED: RefCell<Unsettled> = RefCell::new(Unsettled::default());
}

/// How to reach the instance DescribeInstances described as `item`; with Instance Connect,
/// the pool's key is pushed first. A stopping or terminated instance is not-found.
fn connection_of(
    state: &State,
    id: &str,
    item: roxmltree::Node<'_, '_>,
) -> Result<Connection, Error> {
    // A terminated or stopped instance cannot be connected to, and Instance
    // Connect refuses it with the same code as one still booting
    // (EC2InstanceStateInvalidException): it is gone, not coming.
    let instance_state = child_node(item, "instanceState")
        .and_then(|s| child(s, "name"))
        .unwrap_or_default();
    if matches!(
        instance_state,
        "shutting-down" | "terminated" | "stopping" | "stopped"
    ) {
        return Err(Error::NotFound(format!(
            "instance {id} is {instance_state}"
        )));
    }
    let windows = child(item, "platform") == Some("windows");
    let arch = match child(item, "architecture") {
        Some("arm64") => Arch::Arm64,
        Some("i386") => Arch::X86,
        _ => Arch::Amd64,
    };
    let zone = child_node(item, "placement")
        .and_then(|p| child(p, "availabilityZone"))
        .filter(|zone| !zone.is_empty())
        .map(str::to_string);
    let mut expires = None;
    if let (Some(key), false) = (&state.instance_connect, windows) {
        state
            .endpoint
            .send_ssh_public_key(id, &state.username, key, zone.as_deref())?;
        expires = Some(unix_now() + INSTANCE_CONNECT_VALID_SECONDS);
    }
    Ok(Connection {
        id: id.to_string(),
        os: if windows { Os::Windows } else { Os::Linux },
        arch,
        protocol: if windows {
            Protocol::Winrm
        } else {
            Protocol::Ssh
        },
        internal_address: child(item, "privateIpAddress").map(str::to_string),
        external_address: child(item, "ipAddress").map(str::to_string),
        port: if windows { 5986 } else { 22 },
        username: if windows {
            "Administrator".to_string()
        } else {
            state.username.clone()
        },
        expires,
        zone,
    })
}

fn with<T>(f: impl FnOnce(&State) -> Result<T, Error>) -> Result<T, Error> {
    STATE.with(|s| s.read(f))
}

impl From<flotilla_guest::NotInitialized> for Error {
    fn from(e: flotilla_guest::NotInitialized) -> Self {
        Error::Other(e.to_string())
    }
}

/// Reads the settings, reporting every problem at once (each unknown key included).
fn parse_settings(text: &str) -> Result<Settings, Error> {
    let (s, mut problems) = flotilla_guest::settings::read::<Settings>(text)
        .map_err(|p| Error::InvalidConfig(p.join("; ")))?;
    if s.name.is_empty() || s.name.len() > 255 {
        problems.push("name: must be 1-255 characters".to_string());
    }
    let region_ok = !s.region.is_empty()
        && s.region.split('-').count() >= 3
        && s.region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !region_ok {
        problems.push(format!(
            "region: {:?} is not an AWS region like eu-west-1",
            s.region
        ));
    }
    if let Some(e) = &s.endpoint
        && let Err(why) = flotilla_guest_http::split_url(e)
    {
        problems.push(format!("endpoint: {why}"));
    }
    if s.credential.is_empty() {
        problems.push("credential: must name a pool credential".to_string());
    }
    if !s.username.is_empty() && s.username.len() > 32 {
        problems.push("username: must be at most 32 characters".to_string());
    }
    if problems.is_empty() {
        Ok(s)
    } else {
        Err(Error::InvalidConfig(problems.join("; ")))
    }
}

/// One group as DescribeAutoScalingGroups reports it.
struct Group {
    max: u32,
    desired: u32,
    instances: Vec<(String, String, String)>,
    protected: bool,
    az_rebalance_suspended: bool,
}

fn describe_group(state: &State) -> Result<Group, Error> {
    let mut next: Option<String> = None;
    let mut group: Option<Group> = None;
    loop {
        let mut params = vec![("AutoScalingGroupNames.member.1", state.name.clone())];
        if let Some(t) = &next {
            params.push(("NextToken", t.clone()));
        }
        let xml = state
            .endpoint
            .call("autoscaling", "DescribeAutoScalingGroups", &params)?;
        let doc = xml.doc()?;
        let groups = doc
            .descendants()
            .find(|n| n.has_tag_name("AutoScalingGroups"));
        for member in groups
            .iter()
            .flat_map(|g| g.children().filter(|n| n.has_tag_name("member")))
        {
            if child(member, "AutoScalingGroupName") != Some(state.name.as_str()) {
                continue;
            }
            let num = |name: &str| {
                child(member, name)
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0)
            };
            let g = group.get_or_insert(Group {
                max: num("MaxSize"),
                desired: num("DesiredCapacity"),
                instances: Vec::new(),
                protected: child(member, "NewInstancesProtectedFromScaleIn") == Some("true"),
                az_rebalance_suspended: child_node(member, "SuspendedProcesses").is_some_and(|s| {
                    s.descendants()
                        .any(|n| n.has_tag_name("ProcessName") && n.text() == Some("AZRebalance"))
                }),
            });
            if let Some(list) = child_node(member, "Instances") {
                for i in list.children().filter(|n| n.has_tag_name("member")) {
                    let id = child(i, "InstanceId").unwrap_or_default().to_string();
                    let life = child(i, "LifecycleState").unwrap_or_default().to_string();
                    let health = child(i, "HealthStatus").unwrap_or_default().to_string();
                    if !id.is_empty() {
                        g.instances.push((id, life, health));
                    }
                }
            }
        }
        next = doc
            .descendants()
            .find(|n| n.has_tag_name("NextToken"))
            .and_then(|n| n.text())
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        if next.is_none() {
            break;
        }
    }
    group.ok_or_else(|| {
        Error::NotFound(format!(
            "Auto Scaling group {:?} does not exist",
            state.name
        ))
    })
}

/// Whether an instance is in the group's warm pool: stopped, hibernated or running there, or
/// on its way in or out of it (`Warmed:Pending`, `Warmed:Terminating`...). It serves no
/// load and does not count toward the desired capacity; once the group takes it into
/// service it becomes `Pending` like a new launch.
/// <https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pool-instance-lifecycle.html>
fn warmed(lifecycle: &str) -> bool {
    lifecycle.starts_with("Warmed:")
}

/// The instances that exist or are coming for the group's desired count: neither in the
/// warm pool nor terminating.
fn live_count(instances: &[(String, String, String)]) -> u32 {
    let live = instances
        .iter()
        .filter(|(_, life, _)| {
            !warmed(life) && !life.starts_with("Terminating") && life != "Terminated"
        })
        .count();
    u32::try_from(live).unwrap_or(u32::MAX)
}

/// The contract's state of a group member. Auto Scaling marks an instance Unhealthy when EC2
/// reports it in any state but `running` (a Spot Instance EC2 interrupted is stopped or
/// terminated) or when it fails a health check, then replaces it
/// (<https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-health-checks.html>):
/// whatever runs there is lost.
fn map_state(lifecycle: &str, health: &str) -> InstanceState {
    if health == "Unhealthy" {
        return InstanceState::Failed(format!(
            "Auto Scaling marks it Unhealthy ({lifecycle}): EC2 interrupted it (a Spot \
             Instance reclaimed) or it failed a health check"
        ));
    }
    match lifecycle {
        "Terminated" => InstanceState::Deleted,
        s if s.starts_with("Terminating") || s.starts_with("Detach") => InstanceState::Deleting,
        "InService" => InstanceState::Running,
        // `Pending`, `Pending:Wait` and `Pending:Proceed`: a new launch, or an instance
        // leaving the warm pool for service, which passes through the same states.
        s if s.starts_with("Pending") || s.is_empty() => InstanceState::Creating,
        // Standby, EnteredStandby and others: present but not for jobs.
        other => InstanceState::Failed(format!("lifecycle state {other}")),
    }
}

struct Aws;

impl Guest for Aws {
    fn init(text: String) -> Result<ProviderInfo, Error> {
        let s = parse_settings(&text)?;
        let base = |service: &str| match &s.endpoint {
            Some(e) => e.trim_end_matches('/').to_string() + "/",
            None if s.region.starts_with("cn-") => {
                format!("https://{service}.{}.amazonaws.com.cn/", s.region)
            }
            None => format!("https://{service}.{}.amazonaws.com/", s.region),
        };
        let state = State {
            name: s.name.clone(),
            endpoint: Endpoint {
                autoscaling: base("autoscaling"),
                ec2: base("ec2"),
                instance_connect: base("ec2-instance-connect"),
                region: s.region.clone(),
                credential: s.credential.clone(),
            },
            username: s.username.clone(),
            instance_connect: None,
        };
        let state = if s.instance_connect {
            let Some(key) = flotilla::provider::instance_access::ssh_public_key() else {
                return Err(Error::InvalidConfig(
                    "instance_connect: the pool has no [pool.connector], so there is no SSH key to push".into(),
                ));
            };
            State {
                instance_connect: Some(key),
                ..state
            }
        } else {
            state
        };
        let group = describe_group(&state)?;
        if !group.protected {
            emit(
                Level::Warn,
                &format!(
                    "group {}: scale-in protection for new instances is off; AWS may terminate an instance while a job runs on it",
                    s.name
                ),
            );
        }
        if !group.az_rebalance_suspended {
            emit(
                Level::Warn,
                &format!(
                    "group {}: the AZRebalance process is not suspended; AWS may replace instances that run jobs",
                    s.name
                ),
            );
        }
        STATE.with(|cell| cell.set(state));
        Ok(ProviderInfo {
            id: format!("aws/{}/{}", s.region, s.name),
            version: env!("CARGO_PKG_VERSION").to_string(),
            max_size: group.max,
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: s.instance_connect,
            },
        })
    }

    fn update() -> Result<Vec<Instance>, Error> {
        with(|state| {
            let group = describe_group(state)?;
            // An operator may change MaxSize at any time; the host follows it from here.
            flotilla::provider::group_limits::report_max_size(Some(group.max));
            let live = live_count(&group.instances);
            UNSETTLED.with(|u| u.borrow_mut().listed(live));
            Ok(group
                .instances
                .into_iter()
                .filter(|(_, life, _)| !warmed(life))
                .map(|(id, life, health)| Instance {
                    state: map_state(&life, &health),
                    id,
                })
                .collect())
        })
    }

    fn increase(delta: u32) -> Result<u32, Error> {
        with(|state| {
            let group = describe_group(state)?;
            // Report what the group will really launch because of this call: capped by
            // MaxSize minus what already exists or is already coming (the desired count may
            // lag behind the instances, e.g. lowered by hand while they terminate), so the
            // host never waits for phantoms. moto accepts desired > MaxSize; AWS refuses it.
            let existing = live_count(&group.instances);
            let base = group.desired.max(existing);
            let plan = UNSETTLED.with(|u| u.borrow_mut().plan(base, delta, group.max));
            if plan.target == base {
                return Ok(plan.granted);
            }
            // The count is absolute. A lost or unreadable answer may hide a desired count that
            // took effect.
            UNSETTLED.with(|u| {
                u.borrow_mut().write(
                    base,
                    plan.target,
                    || {
                        state.endpoint.call(
                            "autoscaling",
                            "SetDesiredCapacity",
                            &[
                                ("AutoScalingGroupName", state.name.clone()),
                                ("DesiredCapacity", plan.target.to_string()),
                                ("HonorCooldown", "false".to_string()),
                            ],
                        )
                    },
                    |e| matches!(e, Error::Transient(_) | Error::Other(_)),
                )
            })?;
            Ok(plan.granted)
        })
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        with(|state| {
            let mut accepted = Vec::new();
            let mut last_error = None;
            for id in ids {
                let r = state.endpoint.call(
                    "autoscaling",
                    "TerminateInstanceInAutoScalingGroup",
                    &[
                        ("InstanceId", id.clone()),
                        ("ShouldDecrementDesiredCapacity", "true".to_string()),
                    ],
                );
                match r {
                    Ok(_) => accepted.push(id),
                    // Already gone: idempotent success.
                    Err(Error::InvalidConfig(m) | Error::NotFound(m))
                        if m.contains("not found") || m.contains("does not exist") =>
                    {
                        accepted.push(id)
                    }
                    Err(e @ (Error::Unauthorized(_) | Error::Throttled(_))) => {
                        if accepted.is_empty() {
                            return Err(e);
                        }
                        last_error = Some(e);
                        break;
                    }
                    Err(e) => last_error = Some(e),
                }
            }
            match (accepted.is_empty(), last_error) {
                (true, Some(e)) => Err(e),
                _ => Ok(accepted),
            }
        })
    }

    fn connect_info(id: String) -> Result<Connection, Error> {
        with(|state| {
            let mut next: Option<String> = None;
            loop {
                let mut params = vec![("InstanceId.1", id.clone())];
                if let Some(t) = &next {
                    params.push(("NextToken", t.clone()));
                }
                let xml = state.endpoint.call("ec2", "DescribeInstances", &params)?;
                let doc = xml.doc()?;
                let found = doc.descendants().find(|n| {
                    n.has_tag_name("item") && child(*n, "instanceId") == Some(id.as_str())
                });
                if let Some(item) = found {
                    return connection_of(state, &id, item);
                }
                next = doc
                    .descendants()
                    .find(|n| n.has_tag_name("nextToken"))
                    .and_then(|n| n.text())
                    .filter(|t| !t.is_empty())
                    .map(str::to_string);
                if next.is_none() {
                    return Err(Error::NotFound(format!("instance {id} not found")));
                }
            }
        })
    }

    fn heartbeat(_id: String) -> Result<(), Error> {
        Err(Error::Unsupported(
            "heartbeat: the group's health checks are used instead".into(),
        ))
    }

    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

/// Seconds since the Unix epoch, by the host's wall clock.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

export!(Aws);
