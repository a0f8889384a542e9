//! A loopback Azure Resource Manager holding one virtual machine scale set (Uniform or
//! Flexible), plus the managed-identity token endpoint of the instance metadata service.
//! No Azure emulator exists, so this copies the documented REST shapes (field names,
//! `nextLink` pagination, long-running-operation headers and status bodies, error bodies,
//! `Retry-After`); each shape names its reference page. Every ARM request must carry a bearer
//! token this server minted and that has not expired.
//!
//! Knobs for tests: page size, operations that finish after N polls or fail, a 429 on the
//! next request of a kind, denied actions, a quota error on scale-out, deletes that fail for
//! one instance, expiring every token now; and records of requests and mints.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};

pub const SUBSCRIPTION: &str = "00000000-0000-0000-0000-00000000c0de";
pub const GROUP: &str = "ci-rg";
pub const SET: &str = "ci-vmss";
pub const LOCATION: &str = "westeurope";
const COMPUTE_API: &str = "2024-07-01";
const NETWORK_API: &str = "2024-05-01";
const VMSS_NETWORK_API: &str = "2018-10-01";
const IMDS_API: &str = "2018-02-01";

/// The set's orchestration mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Uniform,
    Flexible,
}

/// Which requests a knob applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Any,
    /// GET of ARM resources and lists (not operation polls).
    Read,
    /// PATCH and POST.
    Write,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    /// VMs running at start (the capacity).
    pub running: u32,
    pub page_size: usize,
    pub create_after: Duration,
    pub delete_after: Duration,
    pub token_lifetime: Duration,
    pub public_ips: bool,
    /// Polls of an operation until it ends (1: the first poll says Succeeded).
    pub lro_polls: u32,
    /// A new VM is missing from the lists for this long while the capacity already counts
    /// it, as a resource group's VM list has been seen to miss VMs just created
    /// (azure-sdk-for-python#8985) and a new set's NIC list to lag its instances by a minute
    /// (azure-cli#9871).
    pub list_lag: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Uniform,
            running: 0,
            page_size: 50,
            create_after: Duration::from_millis(300),
            delete_after: Duration::from_millis(300),
            token_lifetime: Duration::from_secs(3600),
            public_ips: true,
            lro_polls: 1,
            list_lag: Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone)]
struct Vm {
    id: String,
    name: String,
    index: u32,
    created: Instant,
    deleting: Option<Instant>,
    /// Azure reclaimed this Spot VM (eviction policy Deallocate): stopped and deallocated.
    evicted: bool,
    private_ip: String,
    public_ip: Option<String>,
}

#[derive(Debug, Clone)]
struct Operation {
    polls_left: u32,
    failure: Option<(String, String)>,
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub uri: String,
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, Default)]
struct Knobs {
    throttle: Option<(Kind, u32)>,
    denied: HashSet<String>,
    quota: bool,
    fail_next_operation: Option<(String, String)>,
    location_only: bool,
    fail_delete_of: HashSet<String>,
    /// Remaining calls Compute reports in its throttling windows.
    remaining: Option<u32>,
    /// Token requests IMDS answers with this status before it serves tokens (an identity
    /// being set up answers 404, a host upgrade 410).
    imds_unready: Vec<u16>,
    /// The next scale-out is refused as a state conflict (OperationNotAllowed, 409).
    conflict: bool,
}

#[derive(Debug)]
struct Cloud {
    options: Options,
    base: String,
    capacity: u32,
    vms: Vec<Vm>,
    next_index: u32,
    operations: BTreeMap<String, Operation>,
    tokens: Vec<(String, Instant)>,
    mints: u32,
    knobs: Knobs,
    requests: Vec<Recorded>,
}

pub struct AzureCloud {
    pub endpoint: String,
    /// The managed-identity endpoint (plain HTTP, as IMDS is).
    pub imds: String,
    /// The CA to trust when `endpoint` is HTTPS.
    pub ca: Option<rustls::pki_types::CertificateDer<'static>>,
    cloud: Arc<Mutex<Cloud>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for AzureCloud {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(()); // the server thread may have ended already
        }
    }
}

fn respond(status: u16, body: &Value, headers: &[(&str, String)]) -> Response<Full<Bytes>> {
    let mut b = Response::builder()
        .status(status)
        .header("content-type", "application/json; charset=utf-8")
        .header("x-ms-request-id", "00000000-0000-0000-0000-000000000001");
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    b.body(Full::new(Bytes::from(body.to_string())))
        .expect("a response")
}

/// The ARM error body.
/// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/common-deployment-errors>
fn error(status: u16, code: &str, message: &str) -> Response<Full<Bytes>> {
    respond(
        status,
        &json!({"error": {"code": code, "message": message}}),
        &[],
    )
}

fn query(uri: &hyper::Uri) -> Vec<(String, String)> {
    uri.query()
        .map(|q| crate::serve::form(q.as_bytes()))
        .unwrap_or_default()
}

impl AzureCloud {
    /// Starts the server on its own thread and runtime, so any test flavour can drive it.
    pub fn start(options: Options) -> AzureCloud {
        AzureCloud::launch(options, false)
    }

    /// Like [`AzureCloud::start`], ARM served as the real one is: HTTPS on port 443, so the
    /// endpoint is `https://127.0.0.N` and its `nextLink`s spell `:443` as ARM's do. IMDS
    /// stays plain HTTP on a port of its own.
    pub fn start_https(options: Options) -> AzureCloud {
        AzureCloud::launch(options, true)
    }

    fn launch(options: Options, https: bool) -> AzureCloud {
        let cloud = Arc::new(Mutex::new(Cloud {
            capacity: 0,
            vms: Vec::new(),
            next_index: 0,
            operations: BTreeMap::new(),
            tokens: Vec::new(),
            mints: 0,
            knobs: Knobs::default(),
            requests: Vec::new(),
            base: String::new(),
            options: options.clone(),
        }));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shared = cloud.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the fake cloud");
            rt.block_on(async move {
                let handler = move |req: Request<Incoming>| {
                    let cloud = shared.clone();
                    async move { Ok::<_, Infallible>(handle(cloud, req).await) }
                };
                let addr = crate::serve::serve_http(handler.clone()).await;
                let tls = if https {
                    Some(crate::serve::serve_https_443(handler).await)
                } else {
                    None
                };
                addr_tx.send((addr, tls)).expect("the starting test waits");
                let _ = stop_rx.await; // dropped sender: stop as well
            });
        });
        let (addr, tls) = addr_rx.recv().expect("the fake cloud's address");
        let imds = format!("http://{addr}");
        let (endpoint, ca) = match tls {
            Some((ip, ca)) => (format!("https://{ip}"), Some(ca)),
            None => (imds.clone(), None),
        };
        {
            let mut c = cloud.lock().unwrap();
            c.base = endpoint.clone();
            let now = Instant::now() - Duration::from_secs(60);
            for _ in 0..options.running {
                c.add_vm(now);
            }
            c.capacity = options.running;
        }
        AzureCloud {
            endpoint,
            imds,
            ca,
            cloud,
            stop: Some(stop_tx),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Cloud) -> T) -> T {
        let mut c = self.cloud.lock().unwrap();
        c.settle();
        f(&mut c)
    }

    pub fn capacity(&self) -> u32 {
        self.with(|c| c.capacity)
    }
    /// Ids of VMs that are not deleting, sorted.
    pub fn live(&self) -> Vec<String> {
        let mut ids = self.with(|c| {
            c.vms
                .iter()
                .filter(|v| v.deleting.is_none())
                .map(|v| v.id.clone())
                .collect::<Vec<_>>()
        });
        ids.sort();
        ids
    }
    /// Ids of every VM, deleting ones included.
    pub fn all(&self) -> Vec<String> {
        self.with(|c| c.vms.iter().map(|v| v.id.clone()).collect())
    }
    pub fn mints(&self) -> u32 {
        self.with(|c| c.mints)
    }
    /// Answers link to `endpoint` (operations, next pages) in place of this stand-in's own:
    /// for a proxy in front of it.
    pub fn link_to(&self, endpoint: &str) {
        self.with(|c| c.base = endpoint.to_string());
    }
    /// Azure evicts the Spot VM `id` (the set's VMs are Spot, eviction policy Deallocate):
    /// it stays in the set, stopped and deallocated, until it is deleted.
    /// <https://learn.microsoft.com/en-us/azure/virtual-machines/spot-vms#eviction-policy>
    pub fn evict(&self, id: &str) {
        self.with(|c| {
            if let Some(vm) = c.vms.iter_mut().find(|v| v.id == id) {
                vm.evicted = true;
            }
        });
    }

    /// Every token minted so far.
    pub fn tokens(&self) -> Vec<String> {
        self.with(|c| c.tokens.iter().map(|(t, _)| t.clone()).collect())
    }
    /// Every token expires now: the next ARM request gets `ExpiredAuthenticationToken`.
    pub fn expire_tokens(&self) {
        self.with(|c| {
            let now = Instant::now();
            for (_, until) in &mut c.tokens {
                *until = now;
            }
        })
    }
    pub fn throttle_next(&self, kind: Kind, retry_after: u32) {
        self.with(|c| c.knobs.throttle = Some((kind, retry_after)))
    }
    /// A throttle set by [`AzureCloud::throttle_next`] has not been served yet.
    pub fn throttle_pending(&self) -> bool {
        self.with(|c| c.knobs.throttle.is_some())
    }
    pub fn deny(&self, action: &str) {
        self.with(|c| c.knobs.denied.insert(action.to_string()));
    }
    pub fn allow_all(&self) {
        self.with(|c| c.knobs.denied.clear())
    }
    pub fn quota_on_scale_out(&self, on: bool) {
        self.with(|c| c.knobs.quota = on)
    }
    pub fn lro_polls(&self, polls: u32) {
        self.with(|c| c.options.lro_polls = polls.max(1))
    }
    /// The next operation ends `Failed` with this error (and changes nothing).
    pub fn fail_next_operation(&self, code: &str, message: &str) {
        self.with(|c| c.knobs.fail_next_operation = Some((code.into(), message.into())))
    }
    /// Operations answer with `Location` only (no `Azure-AsyncOperation`).
    pub fn location_only(&self, on: bool) {
        self.with(|c| c.knobs.location_only = on)
    }
    /// A Delete Instances request naming `id` fails with 409.
    /// Compute reports `left` calls remaining in its 3-minute window from now on.
    pub fn remaining_calls(&self, left: u32) {
        self.with(|c| c.knobs.remaining = Some(left));
    }

    /// The next token requests get these statuses from IMDS, one each, before it serves.
    pub fn imds_unready(&self, statuses: &[u16]) {
        self.with(|c| c.knobs.imds_unready = statuses.to_vec());
    }

    /// The next scale-out is refused as a state conflict.
    pub fn conflict_next_scale_out(&self) {
        self.with(|c| c.knobs.conflict = true);
    }

    pub fn fail_delete_of(&self, id: &str) {
        self.with(|c| c.knobs.fail_delete_of.insert(id.to_string()));
    }
    /// An operator deletes a VM by hand, with the capacity.
    pub fn remove(&self, id: &str) {
        self.with(|c| {
            let before = c.vms.len();
            c.vms.retain(|v| v.id != id);
            c.capacity = c.capacity.saturating_sub((before - c.vms.len()) as u32);
        })
    }
    pub fn requests(&self) -> Vec<Recorded> {
        self.with(|c| c.requests.clone())
    }
    /// Operation status polls received so far.
    pub fn polls(&self) -> usize {
        self.with(|c| {
            c.requests
                .iter()
                .filter(|r| r.uri.contains("/operations/"))
                .count()
        })
    }

    /// The set's resource id.
    pub fn set_id() -> String {
        format!(
            "/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Compute/virtualMachineScaleSets/{SET}"
        )
    }

    /// The plugin settings for this set.
    pub fn settings(&self) -> String {
        json!({
            "subscription_id": SUBSCRIPTION,
            "resource_group": GROUP,
            "name": SET,
            "endpoint": self.endpoint,
            "max_size": 8,
        })
        .to_string()
    }
}

impl Cloud {
    /// The scheme and authority ARM writes into `nextLink`s: with the port spelled out, even
    /// the default one (`https://management.azure.com:443/...`, azure-sdk-for-go #21296,
    /// azure-sdk-for-java #36506).
    fn next_link_base(&self) -> String {
        match self.base.strip_prefix("https://") {
            Some(host) if !host.contains(':') => format!("https://{host}:443"),
            _ => self.base.clone(),
        }
    }

    /// Compute's remaining-request counts on a read: the resource provider's windows and the
    /// subscription's (request-limits-and-throttling; troubleshooting-throttling-errors).
    fn ratelimit_headers(&self) -> Vec<(&'static str, String)> {
        let left = self.knobs.remaining.unwrap_or(107);
        vec![
            (
                "x-ms-ratelimit-remaining-resource",
                format!(
                    "Microsoft.Compute/HighCostGet3Min;{left},Microsoft.Compute/HighCostGet30Min;{}",
                    left * 9 + 44
                ),
            ),
            (
                "x-ms-ratelimit-remaining-subscription-reads",
                "11999".into(),
            ),
        ]
    }

    fn add_vm(&mut self, created: Instant) -> String {
        let index = self.next_index;
        self.next_index += 1;
        let (id, name) = match self.options.mode {
            Mode::Uniform => (index.to_string(), format!("{SET}_{index}")),
            Mode::Flexible => {
                let suffix = format!("{:08x}", index.wrapping_mul(2_654_435_761));
                let name = format!("{SET}_{suffix}");
                (name.clone(), name)
            }
        };
        self.vms.push(Vm {
            id: id.clone(),
            name,
            index,
            created,
            deleting: None,
            evicted: false,
            private_ip: format!("10.0.{}.{}", 1 + index / 250, 4 + index % 250),
            public_ip: self
                .options
                .public_ips
                .then(|| format!("20.50.{}.{}", 1 + index / 250, 4 + index % 250)),
        });
        id
    }

    /// Deleted VMs whose time has come are gone.
    fn settle(&mut self) {
        let after = self.options.delete_after;
        self.vms
            .retain(|v| v.deleting.is_none_or(|since| since.elapsed() < after));
    }

    fn vm(&self, id: &str) -> Option<&Vm> {
        self.vms.iter().find(|v| v.id.eq_ignore_ascii_case(id))
    }

    fn set_id(&self) -> String {
        AzureCloud::set_id()
    }

    /// Starts an operation; its headers.
    /// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/async-operations>
    fn operation(&mut self, failure: Option<(String, String)>) -> Vec<(&'static str, String)> {
        let id = format!("op-{:04}", self.operations.len() + 1);
        self.operations.insert(
            id.clone(),
            Operation {
                polls_left: self.options.lro_polls,
                failure,
            },
        );
        let url = format!(
            "{}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/{LOCATION}/operations/{id}?api-version={COMPUTE_API}",
            self.base
        );
        let mut headers = vec![("Retry-After", "0".to_string())];
        if self.knobs.location_only {
            headers.push(("Location", format!("{url}&monitor=true")));
        } else {
            headers.push(("Azure-AsyncOperation", url.clone()));
            headers.push(("Location", format!("{url}&monitor=true")));
        }
        headers
    }
}

/// Authorises one ARM request: a minted, unexpired bearer token.
/// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/authenticate-multi-tenant>
/// `None` when authorised, else the 401 answer.
fn authorise(c: &Cloud, req: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
    let challenge = [(
        "WWW-Authenticate",
        "Bearer authorization_uri=\"https://login.windows.net/\", error=\"invalid_token\""
            .to_string(),
    )];
    let Some(token) = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Some(respond(
            401,
            &json!({"error": {"code": "AuthenticationFailed", "message": "Authentication failed. The 'Authorization' header is missing."}}),
            &challenge,
        ));
    };
    match c.tokens.iter().find(|(t, _)| t == token) {
        Some((_, until)) if Instant::now() < *until => None,
        Some(_) => Some(respond(
            401,
            &json!({"error": {"code": "ExpiredAuthenticationToken", "message": "The access token expiry UTC time is earlier than current UTC time."}}),
            &challenge,
        )),
        None => Some(respond(
            401,
            &json!({"error": {"code": "InvalidAuthenticationToken", "message": "The access token is invalid."}}),
            &challenge,
        )),
    }
}

async fn handle(cloud: Arc<Mutex<Cloud>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().as_str().to_string();
    let uri = req.uri().clone();
    {
        let mut c = cloud.lock().unwrap();
        c.requests.push(Recorded {
            method: method.clone(),
            uri: uri.to_string(),
            headers: crate::serve::headers(&req),
        });
    }
    if uri.path() == "/metadata/identity/oauth2/token" {
        return imds(&cloud, &req).await;
    }
    let denied = {
        let c = cloud.lock().unwrap();
        authorise(&c, &req)
    };
    if let Some(answer) = denied {
        return answer;
    }
    let body = crate::serve::json_body(req.into_body()).await;
    let mut c = cloud.lock().unwrap();
    c.settle();
    route(&mut c, &method, &uri, &query(&uri), &body)
}

/// The managed-identity token endpoint: only with `Metadata: true`; `expires_in` is text.
/// <https://learn.microsoft.com/en-us/entra/identity/managed-identities-azure-resources/how-to-use-vm-token#get-a-token-using-http>
async fn imds(cloud: &Arc<Mutex<Cloud>>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let q = query(req.uri());
    let field = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    if req.headers().get("metadata").is_none_or(|v| v != "true") {
        return respond(
            400,
            &json!({"error": "invalid_request", "error_description": "Required metadata header not specified"}),
            &[],
        );
    }
    if field("api-version") != Some(IMDS_API)
        || field("resource") != Some("https://management.azure.com/")
    {
        return respond(
            400,
            &json!({"error": "invalid_resource", "error_description": "AADSTS50001: The application was not found in the tenant."}),
            &[],
        );
    }
    // Deliberate: a mint takes a moment, as the real one does, so concurrent callers overlap.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut c = cloud.lock().unwrap();
    // While a managed identity is being set up IMDS answers 404, during a host upgrade 410
    // ("Identity not found" / "IMDS is updating"); the SDKs retry both for at least 70 s
    // (how-to-use-vm-token#error-handling; azure-identity's ManagedIdentityCredential).
    if !c.knobs.imds_unready.is_empty() {
        let status = c.knobs.imds_unready.remove(0);
        let description = if status == 410 {
            "IMDS is currently upgrading; retry later."
        } else {
            "Identity not found"
        };
        return respond(
            status,
            &json!({"error": "invalid_request", "error_description": description}),
            &[],
        );
    }
    c.mints += 1;
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let token = format!(
        "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.fake-arm-{}-{nonce:08x}",
        c.mints
    );
    let lifetime = c.options.token_lifetime;
    c.tokens.push((token.clone(), Instant::now() + lifetime));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    respond(
        200,
        &json!({
            "access_token": token,
            "refresh_token": "",
            "expires_in": lifetime.as_secs().to_string(),
            "expires_on": (now + lifetime.as_secs()).to_string(),
            "not_before": now.to_string(),
            "resource": "https://management.azure.com/",
            "token_type": "Bearer",
        }),
        &[],
    )
}

type Answer = Response<Full<Bytes>>;

/// Percent-encodes a query value for `nextLink`s.
fn enc(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn api_mismatch(got: Option<&str>, want: &str, kind: &str) -> Option<Answer> {
    (got != Some(want)).then(|| {
        error(
            400,
            "NoRegisteredProviderFound",
            &format!(
                "No registered resource provider found for location '{LOCATION}' and API version '{}' for type '{kind}'. The supported api-versions are '{want}'.",
                got.unwrap_or("")
            ),
        )
    })
}

/// 403 for a denied action, naming it and the scope as ARM does.
/// <https://learn.microsoft.com/en-us/azure/role-based-access-control/troubleshooting#symptom---authorization-failed>
fn check_action(c: &Cloud, action: &str, scope: &str) -> Option<Answer> {
    c.knobs.denied.contains(action).then(|| {
        error(
            403,
            "AuthorizationFailed",
            &format!(
                "The client '6731de76-14a6-49ae-97bc-6eba6914391e' with object id '6731de76-14a6-49ae-97bc-6eba6914391e' does not have authorization to perform action '{action}' over scope '{scope}' or the scope is invalid. If access was recently granted, please refresh your credentials."
            ),
        )
    })
}

/// A throttled request, as Compute answers it (429, `Retry-After`, code OperationNotAllowed).
/// <https://learn.microsoft.com/en-us/troubleshoot/azure/virtual-machines/windows/troubleshooting-throttling-errors>
fn throttled(retry_after: u32) -> Answer {
    respond(
        429,
        &json!({"error": {
            "code": "OperationNotAllowed",
            "message": "The server rejected the request because too many requests have been received for this subscription.",
            "details": [{"code": "TooManyRequests", "target": "HighCostGet30Min",
                         "message": "{\"operationGroup\":\"HighCostGet30Min\",\"allowedRequestCount\":1000,\"measuredRequestCount\":1001}"}]
        }}),
        &[("Retry-After", retry_after.to_string())],
    )
}

fn not_found(what: &str) -> Answer {
    error(
        404,
        "ResourceNotFound",
        &format!(
            "The Resource '{what}' under resource group '{GROUP}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix"
        ),
    )
}

fn route(
    c: &mut Cloud,
    method: &str,
    uri: &hyper::Uri,
    q: &[(String, String)],
    body: &Value,
) -> Answer {
    let path = uri.path().trim_end_matches('/').to_string();
    let lower = path.to_ascii_lowercase();
    let seg: Vec<&str> = lower.split('/').skip(1).collect();
    let api = q
        .iter()
        .find(|(k, _)| k == "api-version")
        .map(|(_, v)| v.as_str());
    let is_poll = seg.len() == 8 && seg[6] == "operations";
    let kind = if method == "GET" {
        Kind::Read
    } else {
        Kind::Write
    };
    if let Some((k, secs)) = c.knobs.throttle
        && !is_poll
        && (k == Kind::Any || k == kind)
    {
        c.knobs.throttle = None;
        return throttled(secs);
    }
    let sub = SUBSCRIPTION.to_ascii_lowercase();
    if is_poll
        && seg[..6]
            == [
                "subscriptions",
                sub.as_str(),
                "providers",
                "microsoft.compute",
                "locations",
                LOCATION,
            ]
    {
        let monitor = q.iter().any(|(k, v)| k == "monitor" && v == "true");
        return poll(c, seg[7], monitor, uri);
    }
    let group = GROUP.to_ascii_lowercase();
    let prefix = [
        "subscriptions",
        sub.as_str(),
        "resourcegroups",
        group.as_str(),
        "providers",
    ];
    if seg.len() < 7 || seg[..5] != prefix {
        return error(
            404,
            "InvalidResourceNamespace",
            &format!("no route for {path}"),
        );
    }
    let rest = &seg[5..];
    let set = SET.to_ascii_lowercase();
    match (method, rest) {
        (
            _,
            [
                "microsoft.compute",
                "virtualmachinescalesets",
                name,
                tail @ ..,
            ],
        ) if *name == set => scale_set(c, method, tail, q, body, &path, api),
        (_, ["microsoft.compute", "virtualmachinescalesets", other, ..]) => not_found(&format!(
            "Microsoft.Compute/virtualMachineScaleSets/{}",
            other
        )),
        ("GET", ["microsoft.compute", "virtualmachines"]) => {
            if let Some(a) = api_mismatch(api, COMPUTE_API, "virtualMachines") {
                return a;
            }
            if let Some(a) = check_action(c, "Microsoft.Compute/virtualMachines/read", &path) {
                return a;
            }
            flexible_list(c, q, &path)
        }
        ("GET", ["microsoft.compute", "virtualmachines", name]) => {
            if let Some(a) = api_mismatch(api, COMPUTE_API, "virtualMachines") {
                return a;
            }
            if let Some(a) = check_action(c, "Microsoft.Compute/virtualMachines/read", &path) {
                return a;
            }
            let expand = q.iter().any(|(k, v)| k == "$expand" && v == "instanceView");
            match c.vm(name).filter(|_| c.options.mode == Mode::Flexible) {
                Some(vm) => respond(200, &flexible_vm(vm, expand, c.options.create_after), &[]),
                None => not_found(&format!("Microsoft.Compute/virtualMachines/{name}")),
            }
        }
        ("GET", ["microsoft.network", "networkinterfaces", nic]) => {
            if let Some(a) = api_mismatch(api, NETWORK_API, "networkInterfaces") {
                return a;
            }
            if let Some(a) = check_action(c, "Microsoft.Network/networkInterfaces/read", &path) {
                return a;
            }
            match nic
                .strip_suffix("-nic")
                .and_then(|n| c.vm(n))
                .filter(|_| c.options.mode == Mode::Flexible)
            {
                Some(vm) => respond(200, &flexible_nic(vm), &[]),
                None => not_found(&format!("Microsoft.Network/networkInterfaces/{nic}")),
            }
        }
        ("GET", ["microsoft.network", "publicipaddresses", ip]) => {
            if let Some(a) = api_mismatch(api, NETWORK_API, "publicIPAddresses") {
                return a;
            }
            if let Some(a) = check_action(c, "Microsoft.Network/publicIPAddresses/read", &path) {
                return a;
            }
            match ip
                .strip_suffix("-pip")
                .and_then(|n| c.vm(n))
                .filter(|v| v.public_ip.is_some())
            {
                Some(vm) => respond(200, &public_ip(&flexible_ids(vm).2, vm), &[]),
                None => not_found(&format!("Microsoft.Network/publicIPAddresses/{ip}")),
            }
        }
        _ => error(
            404,
            "InvalidResourceType",
            &format!("no route for {method} {path}"),
        ),
    }
}

/// Routes under the scale set: Get, Update, Delete Instances, the VMs and their NICs.
fn scale_set(
    c: &mut Cloud,
    method: &str,
    tail: &[&str],
    q: &[(String, String)],
    body: &Value,
    path: &str,
    api: Option<&str>,
) -> Answer {
    let compute = |kind| api_mismatch(api, COMPUTE_API, kind);
    match (method, tail) {
        ("GET", []) => compute("virtualMachineScaleSets")
            .or_else(|| check_action(c, "Microsoft.Compute/virtualMachineScaleSets/read", path))
            .unwrap_or_else(|| respond(200, &scale_set_json(c, "Succeeded"), &[])),
        ("PATCH", []) => {
            if let Some(a) = compute("virtualMachineScaleSets").or_else(|| {
                check_action(c, "Microsoft.Compute/virtualMachineScaleSets/write", path)
            }) {
                return a;
            }
            update(c, body)
        }
        ("POST", ["delete"]) => {
            if let Some(a) = compute("virtualMachineScaleSets").or_else(|| {
                check_action(
                    c,
                    "Microsoft.Compute/virtualMachineScaleSets/delete/action",
                    path,
                )
            }) {
                return a;
            }
            delete_instances(c, body)
        }
        ("GET", ["virtualmachines"]) => {
            if let Some(a) = compute("virtualMachineScaleSets/virtualMachines").or_else(|| {
                check_action(
                    c,
                    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
                    path,
                )
            }) {
                return a;
            }
            if c.options.mode == Mode::Flexible {
                return error(
                    400,
                    "BadRequest",
                    "This operation is not supported for a Virtual Machine Scale Set with orchestration mode 'Flexible'.",
                );
            }
            let expand = q.iter().any(|(k, v)| k == "$expand" && v == "instanceView");
            let items: Vec<Value> = c
                .vms
                .iter()
                .filter(|vm| vm.created.elapsed() >= c.options.list_lag)
                .map(|vm| uniform_vm(vm, expand, c.options.create_after))
                .collect();
            page(c, items, q, path)
        }
        // <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-set-vms/get>
        ("GET", ["virtualmachines", index]) => {
            if let Some(a) = compute("virtualMachineScaleSets/virtualMachines").or_else(|| {
                check_action(
                    c,
                    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
                    path,
                )
            }) {
                return a;
            }
            match c.vm(index).filter(|_| c.options.mode == Mode::Uniform) {
                Some(vm) => respond(200, &uniform_vm(vm, false, c.options.create_after), &[]),
                None => not_found(&format!(
                    "Microsoft.Compute/virtualMachineScaleSets/{SET}/virtualMachines/{index}"
                )),
            }
        }
        ("GET", ["virtualmachines", index, "networkinterfaces"]) => {
            if let Some(a) = api_mismatch(api, VMSS_NETWORK_API, "virtualMachineScaleSets/virtualMachines/networkInterfaces").or_else(|| {
                check_action(c, "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read", path)
            }) {
                return a;
            }
            match c.vm(index).filter(|_| c.options.mode == Mode::Uniform) {
                Some(vm) => page(c, vec![uniform_nic(vm)], q, path),
                None => not_found(&format!(
                    "Microsoft.Compute/virtualMachineScaleSets/{SET}/virtualMachines/{index}"
                )),
            }
        }
        (
            "GET",
            [
                "virtualmachines",
                index,
                "networkinterfaces",
                _,
                "ipconfigurations",
                _,
                "publicipaddresses",
                _,
            ],
        ) => {
            if let Some(a) = api_mismatch(api, VMSS_NETWORK_API, "virtualMachineScaleSets/virtualMachines/networkInterfaces/ipConfigurations/publicIPAddresses").or_else(|| {
                check_action(c, "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/ipConfigurations/publicIPAddresses/read", path)
            }) {
                return a;
            }
            match c.vm(index).filter(|v| v.public_ip.is_some()) {
                Some(vm) => respond(200, &public_ip(&uniform_ids(vm).2, vm), &[]),
                None => not_found(path),
            }
        }
        _ => error(
            404,
            "InvalidResourceType",
            &format!("no route for {method} {path}"),
        ),
    }
}

/// One page of a list, with a `nextLink` carrying `$skiptoken` when more follow.
/// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-set-vms/list#virtualmachinescalesetvmlistresult>
fn page(c: &Cloud, items: Vec<Value>, q: &[(String, String)], path: &str) -> Answer {
    page_with(c, items, q, path, false)
}

/// [`page`], with the `$filter` written raw into the `nextLink` when `raw_filter`.
fn page_with(
    c: &Cloud,
    items: Vec<Value>,
    q: &[(String, String)],
    path: &str,
    raw_filter: bool,
) -> Answer {
    let skip: usize = q
        .iter()
        .find(|(k, _)| k == "$skiptoken")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let size = c.options.page_size.max(1);
    let value: Vec<Value> = items.iter().skip(skip).take(size).cloned().collect();
    let mut out = json!({ "value": value });
    if skip + size < items.len() {
        let mut query: Vec<String> = q
            .iter()
            .filter(|(k, _)| k != "$skiptoken")
            .map(|(k, v)| {
                if raw_filter && k == "$filter" {
                    format!("$filter={v}")
                } else {
                    format!("{}={}", enc(k), enc(v))
                }
            })
            .collect();
        query.push(format!("%24skiptoken={}", skip + size));
        out["nextLink"] = json!(format!("{}{path}?{}", c.next_link_base(), query.join("&")));
    }
    respond(200, &out, &c.ratelimit_headers())
}

/// The scale set as Get returns it.
/// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-sets/get>
fn scale_set_json(c: &Cloud, provisioning: &str) -> Value {
    let mut properties = json!({
        "singlePlacementGroup": false,
        "orchestrationMode": match c.options.mode { Mode::Uniform => "Uniform", Mode::Flexible => "Flexible" },
        "virtualMachineProfile": {
            "osProfile": {"computerNamePrefix": "ci", "adminUsername": "azureuser"},
            "storageProfile": {"osDisk": {"osType": "Linux", "createOption": "FromImage", "caching": "ReadWrite"}},
        },
        "provisioningState": provisioning,
        "uniqueId": "b9e8e3c5-3d1b-4a40-9f0e-5a5a5a5a5a5a",
        "timeCreated": "2025-01-01T00:00:00.0000000+00:00",
    });
    if c.options.mode == Mode::Uniform {
        properties["upgradePolicy"] = json!({"mode": "Manual"});
        properties["overprovision"] = json!(false);
    } else {
        properties["platformFaultDomainCount"] = json!(1);
    }
    json!({
        "name": SET,
        "id": c.set_id(),
        "type": "Microsoft.Compute/virtualMachineScaleSets",
        "location": LOCATION,
        "sku": {"name": "Standard_D2s_v3", "tier": "Standard", "capacity": c.capacity},
        "properties": properties,
    })
}

/// Update with `sku.capacity`: 200 with the set (`Updating`) and the operation's headers.
/// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-sets/update>
fn update(c: &mut Cloud, body: &Value) -> Answer {
    let Some(target) = body.pointer("/sku/capacity").and_then(Value::as_u64) else {
        return error(
            400,
            "InvalidParameter",
            "The value of parameter sku.capacity is invalid.",
        );
    };
    let target = target as u32;
    // Compute refuses both a quota and a state conflict with the code OperationNotAllowed;
    // only the message tells them apart (troubleshoot/azure/virtual-machines error messages).
    if std::mem::take(&mut c.knobs.conflict) && target > c.capacity {
        return error(
            409,
            "OperationNotAllowed",
            &format!(
                "The operation 'Microsoft.Compute/virtualMachineScaleSets/write' is not allowed on VM scale set '{SET}' since it is marked for deletion. You can only retry the Delete operation (or wait for an ongoing one to complete)."
            ),
        );
    }
    if c.knobs.quota && target > c.capacity {
        return error(
            409,
            "OperationNotAllowed",
            "Operation could not be completed as it results in exceeding approved standardDSv3Family Cores quota. Additional details - Deployment Model: Resource Manager, Location: westeurope, Current Limit: 10, Current Usage: 8, Additional Required: 4, (Minimum) New Limit Required: 12.",
        );
    }
    if let Some(failure) = c.knobs.fail_next_operation.take() {
        let headers = c.operation(Some(failure));
        return respond(200, &scale_set_json(c, "Updating"), &headers);
    }
    let live: Vec<usize> = (0..c.vms.len())
        .filter(|&i| c.vms[i].deleting.is_none())
        .collect();
    if (target as usize) > live.len() {
        for _ in live.len()..target as usize {
            c.add_vm(Instant::now());
        }
    } else {
        // A scale-in by capacity: Azure picks the victims (the plugin never does this).
        for &i in live.iter().rev().take(live.len() - target as usize) {
            c.vms[i].deleting = Some(Instant::now());
        }
    }
    c.capacity = target;
    let headers = c.operation(None);
    respond(200, &scale_set_json(c, "Updating"), &headers)
}

/// Delete Instances: the named VMs go, and the capacity drops with them; 202 and the
/// operation's headers.
/// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-sets/delete-instances>
fn delete_instances(c: &mut Cloud, body: &Value) -> Answer {
    let ids: Vec<String> = body
        .get("instanceIds")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if ids.is_empty() {
        return error(
            400,
            "InvalidParameter",
            "The value of parameter instanceIds is invalid.",
        );
    }
    if let Some(bad) = ids.iter().find(|id| c.vm(id).is_none()) {
        return error(
            400,
            "InvalidParameter",
            &format!(
                "The provided instanceId {bad} is not an active Virtual Machine Scale Set VM instanceId."
            ),
        );
    }
    if let Some(bad) = ids.iter().find(|id| c.knobs.fail_delete_of.contains(*id)) {
        return error(
            409,
            "Conflict",
            &format!(
                "The operation on instance {bad} conflicts with another operation in progress."
            ),
        );
    }
    if let Some(failure) = c.knobs.fail_next_operation.take() {
        let headers = c.operation(Some(failure));
        return respond(202, &Value::Null, &headers);
    }
    let now = Instant::now();
    for id in &ids {
        if let Some(vm) = c.vms.iter_mut().find(|v| v.id.eq_ignore_ascii_case(id))
            && vm.deleting.is_none()
        {
            vm.deleting = Some(now);
            c.capacity = c.capacity.saturating_sub(1);
        }
    }
    let headers = c.operation(None);
    respond(202, &Value::Null, &headers)
}

/// An operation's status: `Azure-AsyncOperation` answers 200 with a status body; `Location`
/// answers 202 while it runs and 200 when done.
/// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/async-operations>
fn poll(c: &mut Cloud, id: &str, monitor: bool, uri: &hyper::Uri) -> Answer {
    let Some(op) = c.operations.get_mut(id) else {
        return not_found(&format!("operations/{id}"));
    };
    op.polls_left = op.polls_left.saturating_sub(1);
    let running = op.polls_left > 0;
    let failure = op.failure.clone();
    let times = json!({"startTime": "2025-01-01T00:00:00.0000000+00:00", "name": id});
    match (running, monitor, failure) {
        (true, false, _) => {
            let mut b = times;
            b["status"] = json!("InProgress");
            respond(200, &b, &[("Retry-After", "0".into())])
        }
        (true, true, _) => respond(
            202,
            &Value::Null,
            &[
                ("Retry-After", "0".into()),
                ("Location", format!("{}{uri}", c.base)),
            ],
        ),
        (false, false, Some((code, message))) => {
            let mut b = times;
            b["status"] = json!("Failed");
            b["endTime"] = json!("2025-01-01T00:00:05.0000000+00:00");
            b["error"] = json!({"code": code, "message": message});
            respond(200, &b, &[])
        }
        (false, true, Some((code, message))) => error(409, &code, &message),
        (false, false, None) => {
            let mut b = times;
            b["status"] = json!("Succeeded");
            b["endTime"] = json!("2025-01-01T00:00:05.0000000+00:00");
            respond(200, &b, &[])
        }
        (false, true, None) => respond(200, &json!({}), &[]),
    }
}

/// A VM's provisioning state and instance-view statuses.
/// <https://learn.microsoft.com/en-us/azure/virtual-machines/states-billing>
fn states(vm: &Vm, create_after: Duration) -> (&'static str, Value) {
    let (provisioning, statuses) = if vm.deleting.is_some() {
        (
            "Deleting",
            json!([
                {"code": "ProvisioningState/deleting", "level": "Info", "displayStatus": "Deleting"},
                {"code": "PowerState/stopping", "level": "Info", "displayStatus": "VM stopping"},
            ]),
        )
    } else if vm.evicted {
        (
            "Succeeded",
            json!([
                {"code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Provisioning succeeded", "time": "2025-01-01T00:00:05.0000000+00:00"},
                {"code": "PowerState/deallocated", "level": "Info", "displayStatus": "VM deallocated"},
            ]),
        )
    } else if vm.created.elapsed() < create_after {
        (
            "Creating",
            json!([
                {"code": "ProvisioningState/creating", "level": "Info", "displayStatus": "Creating"},
                {"code": "PowerState/starting", "level": "Info", "displayStatus": "VM starting"},
            ]),
        )
    } else {
        (
            "Succeeded",
            json!([
                {"code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Provisioning succeeded", "time": "2025-01-01T00:00:05.0000000+00:00"},
                {"code": "PowerState/running", "level": "Info", "displayStatus": "VM running"},
            ]),
        )
    };
    (provisioning, statuses)
}

fn uniform_ids(vm: &Vm) -> (String, String, String) {
    let vm_id = format!("{}/virtualMachines/{}", AzureCloud::set_id(), vm.id);
    let nic = format!("{vm_id}/networkInterfaces/{SET}-nic");
    let pip = format!("{nic}/ipConfigurations/{SET}-ipconfig/publicIPAddresses/{SET}-pip");
    (vm_id, nic, pip)
}

fn flexible_ids(vm: &Vm) -> (String, String, String) {
    let group = format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers");
    (
        format!("{group}/Microsoft.Compute/virtualMachines/{}", vm.name),
        format!(
            "{group}/Microsoft.Network/networkInterfaces/{}-nic",
            vm.name
        ),
        format!(
            "{group}/Microsoft.Network/publicIPAddresses/{}-pip",
            vm.name
        ),
    )
}

/// A Uniform set's VM as VMSS VMs - List returns it.
/// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-set-vms/list>
fn uniform_vm(vm: &Vm, expand: bool, create_after: Duration) -> Value {
    let (provisioning, statuses) = states(vm, create_after);
    let (vm_id, nic, _) = uniform_ids(vm);
    let mut properties = json!({
        "latestModelApplied": true,
        "vmId": format!("0f47b100-583c-48e3-a4c0-{:012x}", vm.index),
        "hardwareProfile": {"vmSize": "Standard_D2s_v3"},
        "storageProfile": {"osDisk": {"osType": "Linux", "createOption": "FromImage"}},
        "osProfile": {"computerName": format!("ci{:06x}", vm.index), "adminUsername": "azureuser"},
        "networkProfile": {"networkInterfaces": [{"id": nic}]},
        "provisioningState": provisioning,
        "priority": "Spot",
        "evictionPolicy": "Deallocate",
    });
    if expand {
        properties["instanceView"] =
            json!({"platformUpdateDomain": 0, "platformFaultDomain": 0, "statuses": statuses});
    }
    json!({
        "name": vm.name,
        "id": vm_id,
        "type": "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
        "location": LOCATION,
        "zones": [zone_of(vm)],
        "instanceId": vm.id,
        "sku": {"name": "Standard_D2s_v3", "tier": "Standard"},
        "properties": properties,
    })
}

/// A Flexible set's VM as Virtual Machines - List / Get return it.
/// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/get>
fn flexible_vm(vm: &Vm, expand: bool, create_after: Duration) -> Value {
    let (provisioning, statuses) = states(vm, create_after);
    let (vm_id, nic, _) = flexible_ids(vm);
    let mut properties = json!({
        "vmId": format!("0f47b100-583c-48e3-a4c0-{:012x}", vm.index),
        "virtualMachineScaleSet": {"id": AzureCloud::set_id()},
        "hardwareProfile": {"vmSize": "Standard_D2s_v3"},
        "storageProfile": {"osDisk": {"osType": "Linux", "name": format!("{}_OsDisk", vm.name), "createOption": "FromImage"}},
        "osProfile": {"computerName": format!("ci{:06x}", vm.index), "adminUsername": "azureuser"},
        "networkProfile": {"networkInterfaces": [{"id": nic, "properties": {"primary": true, "deleteOption": "Delete"}}]},
        "provisioningState": provisioning,
        "priority": "Spot",
        "evictionPolicy": "Deallocate",
    });
    if expand {
        properties["instanceView"] =
            json!({"computerName": format!("ci{:06x}", vm.index), "statuses": statuses});
    }
    json!({
        "name": vm.name,
        "id": vm_id,
        "type": "Microsoft.Compute/virtualMachines",
        "location": LOCATION,
        "zones": [zone_of(vm)],
        "properties": properties,
    })
}

/// The zone a VM of this zonal set was placed in: Azure spreads a set's VMs over its zones
/// ("1", "2", "3") and reports each VM's as a one-entry `zones` array.
/// <https://learn.microsoft.com/en-us/azure/virtual-machine-scale-sets/virtual-machine-scale-sets-use-availability-zones>
fn zone_of(vm: &Vm) -> String {
    (vm.index % 3 + 1).to_string()
}

/// Virtual Machines - List with `$filter=virtualMachineScaleSet/id eq '…'`; `$expand` needs
/// the filter. Without it, a VM outside the set shows too.
/// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/list>
fn flexible_list(c: &Cloud, q: &[(String, String)], path: &str) -> Answer {
    let filter = q
        .iter()
        .find(|(k, _)| k == "$filter")
        .map(|(_, v)| v.clone());
    let expand = q.iter().any(|(k, v)| k == "$expand" && v == "instanceView");
    // The property is quoted, as the spec's parameter text (virtualMachine.json,
    // VirtualMachines_List: "Allowed value is 'virtualMachineScaleSet/id' eq ...") and every
    // caller write it (azure-cli #24609, azure-sdk-for-java VirtualMachinesImpl, the Go and
    // Java SDK issues #21291 and #36506). The unquoted form's refusal with BadRequest on
    // 2024-07-01 is a field report (issue #31 of this project); no public record of it was
    // found, and the message below is this stand-in's own wording.
    let wanted = format!("'virtualMachineScaleSet/id' eq '{}'", AzureCloud::set_id());
    let filtered = match &filter {
        Some(f) if f.eq_ignore_ascii_case(&wanted) => true,
        Some(f) => {
            return error(
                400,
                "BadRequest",
                &format!("Invalid $filter '{f}' specified in the request."),
            );
        }
        None if expand => {
            return error(
                400,
                "InvalidParameter",
                "$expand=instanceView needs a valid $filter.",
            );
        }
        None => false,
    };
    let mut items: Vec<Value> = if c.options.mode == Mode::Flexible {
        c.vms
            .iter()
            .filter(|vm| vm.created.elapsed() >= c.options.list_lag)
            .map(|vm| flexible_vm(vm, expand, c.options.create_after))
            .collect()
    } else {
        Vec::new()
    };
    if !filtered {
        items.push(json!({"name": "build-box", "id": format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Compute/virtualMachines/build-box"), "type": "Microsoft.Compute/virtualMachines", "location": LOCATION, "properties": {"provisioningState": "Succeeded"}}));
    }
    // The filtered list's nextLink has carried the filter unencoded, spaces and quotes
    // included (azure-rest-api-specs #25640).
    page_with(c, items, q, path, filtered)
}

fn ip_configuration(nic: &str, pip: &str, vm: &Vm) -> Value {
    let mut properties = json!({
        "privateIPAddress": vm.private_ip,
        "privateIPAllocationMethod": "Dynamic",
        "privateIPAddressVersion": "IPv4",
        "subnet": {"id": format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Network/virtualNetworks/ci-vnet/subnets/default")},
        "primary": true,
        "provisioningState": "Succeeded",
    });
    if vm.public_ip.is_some() {
        properties["publicIPAddress"] = json!({"id": pip});
    }
    json!({"name": "ipconfig1", "id": format!("{nic}/ipConfigurations/ipconfig1"), "properties": properties})
}

/// A Uniform set's VM NIC (served by the set, Microsoft.Network 2018-10-01).
/// <https://learn.microsoft.com/en-us/rest/api/virtualnetwork/network-interface-in-vm-ss/list-virtual-machine-scale-set-vm-network-interfaces>
fn uniform_nic(vm: &Vm) -> Value {
    let (vm_id, nic, pip) = uniform_ids(vm);
    json!({
        "name": format!("{SET}-nic"),
        "id": nic,
        "properties": {
            "provisioningState": "Succeeded",
            "ipConfigurations": [ip_configuration(&nic, &pip, vm)],
            "primary": true,
            "enableAcceleratedNetworking": false,
            "virtualMachine": {"id": vm_id},
        },
    })
}

/// A Flexible VM's NIC.
/// <https://learn.microsoft.com/en-us/rest/api/virtualnetwork/network-interfaces/get>
fn flexible_nic(vm: &Vm) -> Value {
    let (vm_id, nic, pip) = flexible_ids(vm);
    json!({
        "name": format!("{}-nic", vm.name),
        "id": nic,
        "location": LOCATION,
        "type": "Microsoft.Network/networkInterfaces",
        "properties": {
            "provisioningState": "Succeeded",
            "ipConfigurations": [ip_configuration(&nic, &pip, vm)],
            "primary": true,
            "virtualMachine": {"id": vm_id},
        },
    })
}

/// A public IP address.
/// <https://learn.microsoft.com/en-us/rest/api/virtualnetwork/public-ip-addresses/get>
fn public_ip(id: &str, vm: &Vm) -> Value {
    json!({
        "name": id.rsplit('/').next().unwrap_or_default(),
        "id": id,
        "location": LOCATION,
        "properties": {
            "provisioningState": "Succeeded",
            "ipAddress": vm.public_ip,
            "publicIPAddressVersion": "IPv4",
            "publicIPAllocationMethod": "Static",
            "idleTimeoutInMinutes": 4,
        },
        "sku": {"name": "Standard", "tier": "Regional"},
    })
}
