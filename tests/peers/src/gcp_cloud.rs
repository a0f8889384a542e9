//! A loopback stand-in for the Compute Engine API and the GCE metadata server, for the GCP
//! plugin's tests. No emulator exists for either, so this copies the documented REST shapes
//! (field names, `nextPageToken` pages, operation objects, error bodies, `Retry-After`); it is
//! a set of canned shapes with a small state machine, not an emulator. Each shape links its
//! reference page.
//!
//! It serves one managed instance group (zonal, or regional over three zones), mints access
//! tokens on the metadata server's token path, and refuses every Compute call whose bearer
//! token it did not mint or that has expired.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};

pub const PROJECT: &str = "ci-project-1";
pub const GROUP: &str = "ci-runners";
pub const ZONE: &str = "us-central1-a";
pub const REGION: &str = "us-central1";
const REGION_ZONES: [&str; 3] = ["us-central1-a", "us-central1-b", "us-central1-f"];
/// Where real answers point their links.
const LINKS: &str = "https://www.googleapis.com/compute/v1";

/// One managed instance.
#[derive(Debug, Clone)]
pub struct FakeInstance {
    pub name: String,
    pub zone: String,
    pub numeric_id: u64,
    /// `instanceStatus`; empty until the instance exists.
    pub status: String,
    /// `currentAction`.
    pub action: String,
    pub since: Instant,
    /// When the group created it.
    pub created: Instant,
    pub internal_ip: String,
    pub external_ip: String,
}

impl FakeInstance {
    /// The host's id for it: `ZONE/NAME`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.zone, self.name)
    }
}

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub at: Instant,
}

pub struct State {
    pub regional: bool,
    pub target_size: u32,
    pub autoscaler: Option<String>,
    /// The attached autoscaler's `autoscalingPolicy.mode` (`ON`, `ONLY_SCALE_OUT`, `OFF`).
    pub autoscaler_mode: String,
    pub instances: Vec<FakeInstance>,
    /// `listManagedInstancesResults`: `PAGELESS` (the default: `maxResults` and `pageToken`
    /// ignored, every instance in one answer) or `PAGINATED`.
    pub list_results: &'static str,
    /// New instances cannot be created: they stay CREATING with this `(code, message)` in
    /// `lastAttempt.errors`, while the group retries for ever and the resize was DONE.
    pub creation_error: Option<(String, String)>,
    next_instance: u64,
    /// In PAGINATED mode, `listManagedInstances` pages at most this many, whatever the
    /// caller asks.
    pub page_size: usize,
    /// How long a new instance stays CREATING, and a deleted one DELETING.
    pub settle: Duration,
    /// A new instance is missing from `listManagedInstances` for this long while `targetSize`
    /// already counts it. Compute documents no such lag (only that a MIG creates instances
    /// asynchronously and is not `isStable` meanwhile,
    /// <https://cloud.google.com/compute/docs/instance-groups/getting-info-about-migs#checking_whether_a_mig_is_stable>),
    /// and promises no read-after-write list either: this knob, off by default, plays the lag
    /// AWS's instance list has behind `DesiredCapacity` and Azure's lists show
    /// (azure-sdk-for-python#8985), to test a plugin that must not rely on the list.
    pub list_lag: Duration,
    /// Operations stay RUNNING for this many polls.
    pub operation_polls: u32,
    operations: BTreeMap<String, (u32, Value)>,
    next_operation: u64,
    /// The next operation ends DONE with this `(code, message)` error.
    pub fail_next_operation: Option<(String, String)>,
    /// The next Compute call is refused by the per-minute rate quota (403
    /// `rateLimitExceeded`, no `Retry-After`) when `Some`; the number is ignored.
    pub throttle_next: Option<u32>,
    /// When the last rate-limit refusal was sent.
    pub throttled_at: Option<Instant>,
    /// IAM permissions the caller lacks.
    pub denied: HashSet<String>,
    /// Minted tokens and when they expire.
    tokens: Vec<(String, Instant)>,
    pub token_life: Duration,
    pub mints: usize,
    /// Scopes asked for at each mint.
    pub scopes: Vec<String>,
    pub seen: Vec<Seen>,
    /// The instances' internal addresses are this prefix and `n % 250 + 2` for the group's
    /// `n`th instance (`10.128.0.` by default; the load harness puts them on loopback, where
    /// its sshd machines listen).
    pub address_prefix: String,
    /// How long `instances.get` (a plugin's `connect-info`) takes to answer: the cloud's own
    /// latency, injected.
    pub get_latency: Duration,
}

/// A running fake; it stops with the test's runtime.
#[derive(Clone)]
pub struct GcpCloud {
    pub endpoint: String,
    pub state: Arc<Mutex<State>>,
}

impl GcpCloud {
    pub async fn start(regional: bool) -> GcpCloud {
        let state = Arc::new(Mutex::new(State {
            regional,
            target_size: 0,
            autoscaler: None,
            autoscaler_mode: "ON".into(),
            instances: Vec::new(),
            list_results: "PAGELESS",
            creation_error: None,
            next_instance: 0,
            page_size: 500,
            settle: Duration::from_millis(300),
            list_lag: Duration::ZERO,
            operation_polls: 0,
            operations: BTreeMap::new(),
            next_operation: 0,
            fail_next_operation: None,
            throttle_next: None,
            throttled_at: None,
            denied: HashSet::new(),
            tokens: Vec::new(),
            token_life: Duration::from_secs(3600),
            mints: 0,
            scopes: Vec::new(),
            seen: Vec::new(),
            address_prefix: "10.128.0.".into(),
            get_latency: Duration::ZERO,
        }));
        let shared = state.clone();
        let addr = crate::serve::serve_http(move |req| handle(shared.clone(), req)).await;
        GcpCloud {
            endpoint: format!("http://{addr}"),
            state,
        }
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// The group starts refreshing instance `id` (applying configuration without stopping it,
    /// e.g. a target pool change): `currentAction` REFRESHING for a while.
    pub fn refresh(&self, id: &str) {
        self.with(|s| {
            if let Some(i) = s.instances.iter_mut().find(|i| i.id() == id) {
                i.action = "REFRESHING".into();
                i.since = Instant::now();
            }
        });
    }

    /// Compute preempts Spot VM `id` with termination action STOP: the instance stops and
    /// stays TERMINATED in the group (`currentAction` NONE) until the group recreates it
    /// (<https://cloud.google.com/compute/docs/instances/spot#preemption-process>).
    pub fn preempt(&self, id: &str) {
        self.with(|s| {
            if let Some(i) = s.instances.iter_mut().find(|i| i.id() == id) {
                i.status = "TERMINATED".into();
                i.action = "NONE".into();
                i.since = Instant::now();
            }
        });
    }

    /// The plugin settings for this fake's group.
    pub fn settings(&self, max_size: u32) -> String {
        let location = if self.with(|s| s.regional) {
            format!(r#""region":"{REGION}""#)
        } else {
            format!(r#""zone":"{ZONE}""#)
        };
        format!(
            r#"{{"project":"{PROJECT}",{location},"name":"{GROUP}","max_size":{max_size},"endpoint":"{}"}}"#,
            self.endpoint
        )
    }

    /// The group's instances that are neither deleting nor gone, as `ZONE/NAME`, sorted.
    pub fn live(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.with(|s| {
            s.instances
                .iter()
                .filter(|i| i.action != "DELETING")
                .map(FakeInstance::id)
                .collect()
        });
        ids.sort();
        ids
    }

    pub fn target_size(&self) -> u32 {
        self.with(|s| s.target_size)
    }

    /// Every token minted so far is refused from now on.
    pub fn expire_tokens(&self) {
        self.with(|s| s.tokens.clear());
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.with(|s| s.seen.clone())
    }
}

type Answer = Response<Full<Bytes>>;

fn answer(status: u16, body: &Value) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", "application/json; charset=UTF-8")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A Google API error body.
/// <https://cloud.google.com/compute/docs/api/how-tos/api-requests-responses#handling_api_errors>
fn error(status: u16, grpc: &str, reason: &str, domain: &str, message: &str) -> Value {
    json!({
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": domain, "reason": reason}],
            "status": grpc,
        }
    })
}

/// A 403 for a missing IAM permission, with the `ErrorInfo` detail Google adds.
/// <https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-iam#permission-denied>
fn denied(permission: &str, resource: &str) -> Answer {
    let message = format!("Required '{permission}' permission for '{resource}'");
    let mut body = error(403, "PERMISSION_DENIED", "forbidden", "global", &message);
    body["error"]["details"] = json!([{
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "IAM_PERMISSION_DENIED",
        "domain": "compute.googleapis.com",
        "metadata": {"permission": permission, "resource": resource},
    }]);
    answer(403, &body)
}

fn not_found(resource: &str) -> Answer {
    answer(
        404,
        &error(
            404,
            "NOT_FOUND",
            "notFound",
            "global",
            &format!("The resource '{resource}' was not found"),
        ),
    )
}

async fn handle(state: Arc<Mutex<State>>, req: Request<Incoming>) -> Result<Answer, Infallible> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query: Vec<(String, String)> =
        url::form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let headers = crate::serve::headers(&req);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    // <https://cloud.google.com/compute/docs/reference/rest/v1/instances/get>, slowed down.
    if method == "GET" && path.contains("/instances/") {
        let latency = state.lock().unwrap().get_latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }
    let mut s = state.lock().unwrap();
    s.seen.push(Seen {
        method: method.clone(),
        path: path.clone(),
        headers: headers.clone(),
        at: Instant::now(),
    });
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    if path == "/computeMetadata/v1/instance/service-accounts/default/token" {
        return Ok(mint(&mut s, header("metadata-flavor").as_deref(), &query));
    }
    let now = Instant::now();
    let bearer = header("authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(str::to_string))
        .unwrap_or_default();
    if !s
        .tokens
        .iter()
        .any(|(t, until)| *t == bearer && now < *until)
    {
        // <https://cloud.google.com/docs/authentication/troubleshoot-adc#invalid-token>
        return Ok(answer(
            401,
            &error(
                401,
                "UNAUTHENTICATED",
                "authError",
                "global",
                "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
            ),
        ));
    }
    if s.throttle_next.take().is_some() {
        s.throttled_at = Some(now);
        // Compute's rate quotas refuse with 403 and the reason rateLimitExceeded, and send no
        // Retry-After: "wait a minute then try your request again"
        // (<https://cloud.google.com/compute/docs/api-rate-limits>; the body as recorded in
        // hail-is/hail#10613).
        return Ok(answer(
            403,
            &error(
                403,
                "PERMISSION_DENIED",
                "rateLimitExceeded",
                "usageLimits",
                "Quota exceeded for quota group 'default' and limit 'Queries per user per 100 seconds' of service 'compute.googleapis.com' for consumer 'project_number:123456789012'.",
            ),
        ));
    }
    s.reconcile(now);
    let Some(rest) = path.strip_prefix(&format!("/compute/v1/projects/{PROJECT}/")) else {
        return Ok(not_found(&path));
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let location = if s.regional {
        format!("regions/{REGION}")
    } else {
        format!("zones/{ZONE}")
    };
    let group = format!("projects/{PROJECT}/{location}/instanceGroupManagers/{GROUP}");
    let needs = |s: &State, permission: &str, resource: &str| {
        s.denied
            .contains(permission)
            .then(|| denied(permission, resource))
    };
    let answer_op = |s: &mut State, kind: &str| s.operation(kind, &location);
    match (method.as_str(), parts.as_slice()) {
        // <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/get>
        ("GET", [kind, loc, "instanceGroupManagers", name])
            if format!("{kind}/{loc}") == location && *name == GROUP =>
        {
            if let Some(d) = needs(&s, "compute.instanceGroupManagers.get", &group) {
                return Ok(d);
            }
            Ok(answer(200, &s.manager(&location)))
        }
        // <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/resize>
        ("POST", [kind, loc, "instanceGroupManagers", name, "resize"])
            if format!("{kind}/{loc}") == location && *name == GROUP =>
        {
            if let Some(d) = needs(&s, "compute.instanceGroupManagers.update", &group) {
                return Ok(d);
            }
            let Some(size) = query
                .iter()
                .find(|(k, _)| k == "size")
                .and_then(|(_, v)| v.parse::<u32>().ok())
            else {
                return Ok(answer(
                    400,
                    &error(
                        400,
                        "INVALID_ARGUMENT",
                        "required",
                        "global",
                        "Required field 'size' not specified",
                    ),
                ));
            };
            s.target_size = size;
            s.reconcile(now);
            Ok(answer(200, &answer_op(&mut s, "resize")))
        }
        // <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/deleteInstances>
        ("POST", [kind, loc, "instanceGroupManagers", name, "deleteInstances"])
            if format!("{kind}/{loc}") == location && *name == GROUP =>
        {
            if let Some(d) = needs(&s, "compute.instanceGroupManagers.update", &group) {
                return Ok(d);
            }
            let request: Value = serde_json::from_slice(&body).unwrap_or_default();
            let skip = request["skipInstancesOnValidationError"].as_bool() == Some(true);
            let mut chosen = Vec::new();
            for url in request["instances"].as_array().into_iter().flatten() {
                let url = url.as_str().unwrap_or_default();
                // Malformed URLs and other zones fail the call whatever the skip flag says.
                let zone_ok = url
                    .split('/')
                    .skip_while(|p| *p != "zones")
                    .nth(1)
                    .is_some_and(|z| {
                        if s.regional {
                            REGION_ZONES.contains(&z)
                        } else {
                            z == ZONE
                        }
                    });
                if !zone_ok {
                    return Ok(answer(
                        400,
                        &error(
                            400,
                            "INVALID_ARGUMENT",
                            "invalid",
                            "global",
                            &format!(
                                "Invalid value for field 'resource.instances': '{url}'. Instance URL is malformed or refers to a zone outside the group."
                            ),
                        ),
                    ));
                }
                let found = s.instances.iter().position(|i| {
                    i.action != "DELETING"
                        && (url.ends_with(&format!("zones/{}/instances/{}", i.zone, i.name)))
                });
                match found {
                    Some(at) => chosen.push(at),
                    None if skip => {}
                    None => {
                        return Ok(answer(
                            400,
                            &error(
                                400,
                                "INVALID_ARGUMENT",
                                "invalid",
                                "global",
                                &format!(
                                    "Invalid value for field 'resource.instances': '{url}'. The instance is not a member of the instance group."
                                ),
                            ),
                        ));
                    }
                }
            }
            for at in chosen {
                s.instances[at].action = "DELETING".into();
                s.instances[at].since = now;
                s.target_size = s.target_size.saturating_sub(1);
            }
            Ok(answer(200, &answer_op(&mut s, "deleteInstances")))
        }
        // <https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listManagedInstances>
        (
            "POST",
            [
                kind,
                loc,
                "instanceGroupManagers",
                name,
                "listManagedInstances",
            ],
        ) if format!("{kind}/{loc}") == location && *name == GROUP => {
            if let Some(d) = needs(&s, "compute.instanceGroupManagers.get", &group) {
                return Ok(d);
            }
            // PAGELESS, the default, ignores maxResults and pageToken and answers every
            // instance at once (discovery doc, `listManagedInstancesResults`).
            let paginated = s.list_results == "PAGINATED";
            let asked = query
                .iter()
                .find(|(k, _)| k == "maxResults")
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .unwrap_or(500);
            let size = if paginated {
                asked.min(s.page_size).max(1)
            } else {
                s.instances.len().max(1)
            };
            let from = query
                .iter()
                .find(|(k, _)| k == "pageToken")
                .filter(|_| paginated)
                .and_then(|(_, v)| v.strip_prefix("page-token-")?.parse::<usize>().ok())
                .unwrap_or(0);
            let failing = s.creation_error.clone();
            let listed: Vec<&FakeInstance> = s
                .instances
                .iter()
                .filter(|i| i.created.elapsed() >= s.list_lag)
                .collect();
            let items: Vec<Value> = listed
                .iter()
                .copied()
                .skip(from)
                .take(size)
                .map(|i| managed_instance(i, failing.as_ref()))
                .collect();
            let mut page = json!({ "managedInstances": items });
            if from + size < listed.len() {
                page["nextPageToken"] = json!(format!("page-token-{}", from + size));
            }
            Ok(answer(200, &page))
        }
        // <https://cloud.google.com/compute/docs/reference/rest/v1/autoscalers/get>
        ("GET", [kind, loc, "autoscalers", name]) if format!("{kind}/{loc}") == location => {
            let resource = format!("projects/{PROJECT}/{location}/autoscalers/{name}");
            let permission = if s.regional {
                "compute.regionAutoscalers.get"
            } else {
                "compute.autoscalers.get"
            };
            if let Some(d) = needs(&s, permission, &resource) {
                return Ok(d);
            }
            match &s.autoscaler {
                Some(url) if url.ends_with(&format!("/autoscalers/{name}")) => Ok(answer(
                    200,
                    &json!({
                        "kind": "compute#autoscaler",
                        "name": name,
                        "target": format!("{LINKS}/projects/{PROJECT}/{location}/instanceGroupManagers/{GROUP}"),
                        "autoscalingPolicy": {
                            "minNumReplicas": 0,
                            "maxNumReplicas": 10,
                            "mode": s.autoscaler_mode,
                        },
                        "status": "ACTIVE",
                        "statusDetails": if s.autoscaler_mode == "OFF" {
                            json!([{"type": "MODE_OFF", "message": "Autoscaling is turned off. The number of instances in the group won't change automatically. The autoscaling configuration is preserved."}])
                        } else { json!([]) },
                    }),
                )),
                _ => Ok(not_found(&resource)),
            }
        }
        // <https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/get>,
        // <https://cloud.google.com/compute/docs/reference/rest/v1/regionOperations/get>
        ("GET", [kind, loc, "operations", name]) if format!("{kind}/{loc}") == location => {
            let permission = if s.regional {
                "compute.regionOperations.get"
            } else {
                "compute.zoneOperations.get"
            };
            if let Some(d) = needs(&s, permission, &format!("{location}/operations/{name}")) {
                return Ok(d);
            }
            match s.operations.get_mut(*name) {
                Some((left, op)) => {
                    *left = left.saturating_sub(1);
                    if *left == 0 {
                        op["status"] = json!("DONE");
                        op["progress"] = json!(100);
                    }
                    Ok(answer(200, op))
                }
                None => Ok(not_found(&format!(
                    "projects/{PROJECT}/{location}/operations/{name}"
                ))),
            }
        }
        // <https://cloud.google.com/compute/docs/reference/rest/v1/instances/get>
        ("GET", ["zones", zone, "instances", name]) => {
            let resource = format!("projects/{PROJECT}/zones/{zone}/instances/{name}");
            if let Some(d) = needs(&s, "compute.instances.get", &resource) {
                return Ok(d);
            }
            match s
                .instances
                .iter()
                .find(|i| i.zone == *zone && i.name == *name)
            {
                Some(i) => Ok(answer(200, &instance(i))),
                None => Ok(not_found(&resource)),
            }
        }
        _ => Ok(not_found(&path)),
    }
}

/// The metadata server's token answer; only with `Metadata-Flavor: Google`.
/// <https://cloud.google.com/compute/docs/access/authenticate-workloads#applications>
fn mint(s: &mut State, flavor: Option<&str>, query: &[(String, String)]) -> Answer {
    if flavor != Some("Google") {
        return Response::builder()
            .status(403)
            .header("content-type", "text/html; charset=UTF-8")
            .body(Full::new(Bytes::from(
                "Missing required header: Metadata-Flavor",
            )))
            .unwrap();
    }
    s.mints += 1;
    let token = format!("ya29.fake-{}-{}", s.mints, std::process::id());
    s.tokens
        .push((token.clone(), Instant::now() + s.token_life));
    s.scopes.push(
        query
            .iter()
            .find(|(k, _)| k == "scopes")
            .map(|(_, v)| v.clone())
            .unwrap_or_default(),
    );
    answer(
        200,
        &json!({
            "access_token": token,
            "expires_in": s.token_life.as_secs(),
            "token_type": "Bearer",
        }),
    )
}

/// A managed instance as `listManagedInstances` reports it; one Compute cannot create
/// carries the last attempt's error (a quota or a stockout shows only there).
fn managed_instance(i: &FakeInstance, creation_error: Option<&(String, String)>) -> Value {
    let mut m = json!({
        "instance": format!("{LINKS}/projects/{PROJECT}/zones/{}/instances/{}", i.zone, i.name),
        "id": i.numeric_id.to_string(),
        "name": i.name,
        "currentAction": i.action,
        "version": {"instanceTemplate": format!("{LINKS}/projects/{PROJECT}/global/instanceTemplates/ci-runner")},
    });
    if !i.status.is_empty() {
        m["instanceStatus"] = json!(i.status);
    }
    if let (Some((code, message)), "CREATING") = (creation_error, i.action.as_str()) {
        m["lastAttempt"] = json!({"errors": {"errors": [{
            "code": code,
            "message": message.replace("{instance}", &i.name),
        }]}});
    }
    m
}

/// An instance as `instances.get` reports it (the fields the plugin reads, and neighbours).
fn instance(i: &FakeInstance) -> Value {
    json!({
        "kind": "compute#instance",
        "id": i.numeric_id.to_string(),
        "name": i.name,
        "zone": format!("{LINKS}/projects/{PROJECT}/zones/{}", i.zone),
        "status": if i.status.is_empty() { "PROVISIONING" } else { i.status.as_str() },
        "machineType": format!("{LINKS}/projects/{PROJECT}/zones/{}/machineTypes/e2-standard-2", i.zone),
        "networkInterfaces": [{
            "kind": "compute#networkInterface",
            "name": "nic0",
            "network": format!("{LINKS}/projects/{PROJECT}/global/networks/default"),
            "networkIP": i.internal_ip,
            "stackType": "IPV4_ONLY",
            "accessConfigs": [{
                "kind": "compute#accessConfig",
                "type": "ONE_TO_ONE_NAT",
                "name": "External NAT",
                "natIP": i.external_ip,
                "networkTier": "PREMIUM",
            }],
        }],
        "disks": [{
            "kind": "compute#attachedDisk",
            "boot": true,
            "architecture": "X86_64",
            "guestOsFeatures": [{"type": "VIRTIO_SCSI_MULTIQUEUE"}, {"type": "GVNIC"}],
        }],
        "selfLink": format!("{LINKS}/projects/{PROJECT}/zones/{}/instances/{}", i.zone, i.name),
    })
}

impl State {
    /// Moves the group towards its target: new instances, settled ones, deleted ones gone.
    fn reconcile(&mut self, now: Instant) {
        let settle = self.settle;
        self.instances
            .retain(|i| !(i.action == "DELETING" && now.duration_since(i.since) >= settle));
        let blocked = self.creation_error.is_some();
        for i in &mut self.instances {
            // The group retries the creation for ever; the instance never gets a status.
            if blocked && i.action == "CREATING" {
                continue;
            }
            // REFRESHING applies configuration without stopping the instance, and ends.
            if i.action == "REFRESHING" && now.duration_since(i.since) >= settle {
                i.action = "NONE".into();
            }
            if i.action == "CREATING" && now.duration_since(i.since) >= settle / 2 {
                i.status = "STAGING".into();
            }
            if i.action == "CREATING" && now.duration_since(i.since) >= settle {
                i.status = "RUNNING".into();
                i.action = "NONE".into();
            }
        }
        let mut live = self
            .instances
            .iter()
            .filter(|i| i.action != "DELETING")
            .count() as u32;
        while live < self.target_size {
            self.next_instance += 1;
            let n = self.next_instance;
            let zone = if self.regional {
                REGION_ZONES[(n as usize) % REGION_ZONES.len()]
            } else {
                ZONE
            };
            self.instances.push(FakeInstance {
                name: format!("{GROUP}-{n:04x}"),
                zone: zone.to_string(),
                numeric_id: 4_000_000_000_000 + n,
                status: String::new(),
                action: "CREATING".into(),
                since: now,
                created: now,
                internal_ip: format!("{}{}", self.address_prefix, n % 250 + 2),
                external_ip: format!("34.70.1.{}", n % 250 + 2),
            });
            live += 1;
        }
        // A resize below the live count: the group picks the newest.
        while live > self.target_size {
            if let Some(i) = self
                .instances
                .iter_mut()
                .rev()
                .find(|i| i.action != "DELETING")
            {
                i.action = "DELETING".into();
                i.since = now;
            }
            live -= 1;
        }
    }

    /// The group as `instanceGroupManagers.get` reports it.
    fn manager(&self, location: &str) -> Value {
        let creating = self
            .instances
            .iter()
            .filter(|i| i.action == "CREATING")
            .count();
        let deleting = self
            .instances
            .iter()
            .filter(|i| i.action == "DELETING")
            .count();
        let mut status = json!({
            "isStable": creating == 0 && deleting == 0,
            "versionTarget": {"isReached": true},
            "stateful": {"hasStatefulConfig": false},
        });
        // Attached whatever its mode: OFF "disables the autoscaler but maintains its
        // configuration" (discovery doc, AutoscalingPolicy.mode) and the Autoscaler keeps its
        // `target`. That `status.autoscaler` still names it in mode OFF is inferred, not
        // documented: gcloud (`managed_instance_groups_utils.ResolveAutoscalingStatusForMig`)
        // reports any attached autoscaler as autoscaling, whatever its mode.
        if let Some(a) = &self.autoscaler {
            status["autoscaler"] = json!(a);
        }
        json!({
            "kind": "compute#instanceGroupManager",
            "id": "5551234567890",
            "name": GROUP,
            "baseInstanceName": GROUP,
            (if self.regional { "region" } else { "zone" }): format!("{LINKS}/projects/{PROJECT}/{location}"),
            "instanceTemplate": format!("{LINKS}/projects/{PROJECT}/global/instanceTemplates/ci-runner"),
            "instanceGroup": format!("{LINKS}/projects/{PROJECT}/{location}/instanceGroups/{GROUP}"),
            "targetSize": self.target_size,
            "listManagedInstancesResults": self.list_results,
            "updatePolicy": {
                "type": "OPPORTUNISTIC",
                "minimalAction": "REPLACE",
                "instanceRedistributionType": if self.regional { "NONE" } else { "PROACTIVE" },
                "replacementMethod": "SUBSTITUTE",
            },
            "currentActions": {
                "creating": creating, "deleting": deleting, "none": self.instances.len() - creating - deleting,
                "abandoning": 0, "recreating": 0, "refreshing": 0, "restarting": 0, "verifying": 0,
                "creatingWithoutRetries": 0, "resuming": 0, "starting": 0, "stopping": 0, "suspending": 0,
            },
            "status": status,
            "selfLink": format!("{LINKS}/projects/{PROJECT}/{location}/instanceGroupManagers/{GROUP}"),
        })
    }

    /// A new operation: RUNNING until polled `operation_polls` times (DONE at once when 0).
    /// <https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations#Operation>
    fn operation(&mut self, kind: &str, location: &str) -> Value {
        self.next_operation += 1;
        let name = format!(
            "operation-1764600000000-{:012x}-4f1a2b3c-9d8e7f60",
            self.next_operation
        );
        let mut op = json!({
            "kind": "compute#operation",
            "id": (7_000_000_000u64 + self.next_operation).to_string(),
            "name": name,
            (if self.regional { "region" } else { "zone" }): format!("{LINKS}/projects/{PROJECT}/{location}"),
            "operationType": format!("compute.instanceGroupManagers.{kind}"),
            "targetLink": format!("{LINKS}/projects/{PROJECT}/{location}/instanceGroupManagers/{GROUP}"),
            "targetId": "5551234567890",
            "status": if self.operation_polls == 0 { "DONE" } else { "RUNNING" },
            "user": "flotilla@ci-project-1.iam.gserviceaccount.com",
            "progress": if self.operation_polls == 0 { 100 } else { 0 },
            "insertTime": "2026-12-01T10:00:00.000-08:00",
            "startTime": "2026-12-01T10:00:00.100-08:00",
            "selfLink": format!("{LINKS}/projects/{PROJECT}/{location}/operations/{name}"),
        });
        if let Some((code, message)) = self.fail_next_operation.take() {
            op["status"] = json!("DONE");
            op["error"] = json!({"errors": [{"code": code, "message": message}]});
            op["httpErrorStatusCode"] = json!(403);
            op["httpErrorMessage"] = json!("FORBIDDEN");
        }
        self.operations
            .insert(name, (self.operation_polls, op.clone()));
        op
    }
}
