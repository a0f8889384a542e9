//! The smallest complete Flotilla provider plugin. Copy this directory to start your own.
//!
//! It drives a simple REST API (the "example cloud", documented in README.md) over
//! `wasi:http`. Every request names the pool's credential in the `flotilla-credential`
//! header; the host strips that header and adds the real authorisation, so this code never
//! sees a secret. Scaling policy lives in the host: this plugin only translates calls.

use serde::Deserialize;
use serde_json::json;

wit_bindgen::generate!({
    path: "wit",
    world: "flotilla:provider/provider",
    generate_all,
});

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::log::{Level, emit};
use flotilla::provider::types::{
    Arch, Capabilities, Connection, Error, Instance, InstanceState, Os, Protocol, ProviderInfo,
    Throttle,
};
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasi::io::streams::StreamError;

/// The pool's `plugin_config`. Unknown keys are rejected.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// Base URL of the API, e.g. `https://api.example.com`. Must be in the pool's allow-list.
    endpoint: String,
    /// The group to manage.
    group: String,
    /// Name of the pool credential the host should apply to every request.
    #[serde(default)]
    credential: Option<String>,
}

static SETTINGS: std::sync::Mutex<Option<Settings>> = std::sync::Mutex::new(None);

fn settings() -> Result<Settings, Error> {
    SETTINGS
        .lock()
        .ok()
        .and_then(|s| s.clone())
        .ok_or_else(|| Error::Other("init has not been called".into()))
}

/// The settings keys; any other key is a problem.
const KEYS: [&str; 3] = ["endpoint", "group", "credential"];

/// Reads the settings, reporting every problem at once: each unknown key, a missing or
/// mistyped key, and each bad value.
fn parse_settings(text: &str) -> Result<Settings, Error> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::InvalidConfig(format!("settings: not valid JSON: {e}")))?;
    let Some(map) = value.as_object() else {
        return Err(Error::InvalidConfig(
            "settings: must be a JSON object".into(),
        ));
    };
    let mut problems: Vec<String> = map
        .keys()
        .filter(|k| !KEYS.contains(&k.as_str()))
        .map(|k| format!("{k}: unknown key (known: {})", KEYS.join(", ")))
        .collect();
    let known: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .filter(|(k, _)| KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match serde_json::from_value::<Settings>(serde_json::Value::Object(known)) {
        Err(e) => problems.push(format!("settings: {e}")),
        Ok(s) => {
            if !(s.endpoint.starts_with("https://") || s.endpoint.starts_with("http://")) {
                problems.push("endpoint: must start with https:// or http://".into());
            }
            if s.group.is_empty() || s.group.contains('/') {
                problems.push("group: must be a non-empty name without '/'".into());
            }
            if s.credential.as_deref().is_some_and(str::is_empty) {
                problems.push("credential: must not be empty when given".into());
            }
            if problems.is_empty() {
                return Ok(s);
            }
        }
    }
    Err(Error::InvalidConfig(problems.join("; ")))
}

/// Maps a non-2xx answer to the provider error the host expects.
fn status_error(action: &str, status: u16, retry_after: Option<u32>, body: &str) -> Error {
    let message = format!(
        "{action}: HTTP {status}: {}",
        body.chars().take(300).collect::<String>()
    );
    match status {
        401 | 403 => Error::Unauthorized(message),
        404 => Error::NotFound(message),
        429 => Error::Throttled(Throttle {
            retry_after_seconds: retry_after.unwrap_or(0),
            message,
        }),
        400 | 422 => Error::InvalidConfig(message),
        500..=599 => Error::Transient(message),
        _ => Error::Other(message),
    }
}

/// The largest response body read whole (the host caps it too).
const MAX_BODY: usize = 16 << 20;

/// The request's headers: JSON both ways, the credential the host applies, and the body's
/// length.
fn request_headers(credential: Option<&str>, payload: Option<&[u8]>) -> Vec<(String, Vec<u8>)> {
    let mut headers = vec![("accept".to_string(), b"application/json".to_vec())];
    if let Some(name) = credential {
        // The host signs or authorises the request with this credential; the secret stays there.
        headers.push(("flotilla-credential".to_string(), name.as_bytes().to_vec()));
    }
    if let Some(payload) = payload {
        headers.push(("content-type".to_string(), b"application/json".to_vec()));
        // Sent with its length, not chunked: some APIs refuse chunked requests.
        let length = payload.len().to_string().into_bytes();
        headers.push(("content-length".to_string(), length));
    }
    headers
}

/// Sends one JSON request, authenticated by the host, and decodes the JSON answer.
///
/// It speaks `wasi:http` through the bindings wit-bindgen generated for the world: build the
/// request, hand it to the host, block until the answer comes, and read the body with blocking
/// reads. About 20 host calls per request; the host's deadline bounds every wait.
fn call<T: for<'de> Deserialize<'de>>(
    action: &str,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<T, Error> {
    let s = settings()?;
    let endpoint = s.endpoint.trim_end_matches('/');
    let path = format!("/v1/groups/{}{path}", s.group);
    let (scheme, rest) = match endpoint.split_once("://") {
        Some(("https", rest)) => (Scheme::Https, rest),
        Some(("http", rest)) => (Scheme::Http, rest),
        _ => {
            return Err(Error::InvalidConfig(format!(
                "{action}: bad endpoint {endpoint:?}"
            )));
        }
    };
    let (authority, base) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    // The URL is spelled out only in an error.
    let transient = |what: String| Error::Transient(format!("{action}: {endpoint}{path}: {what}"));
    let invalid = |what: &str| {
        Error::InvalidConfig(format!(
            "{action}: bad request for {endpoint}{path}: {what}"
        ))
    };

    let payload = body.map(|json| json.to_string().into_bytes());
    let headers = request_headers(s.credential.as_deref(), payload.as_deref());
    let fields = Fields::from_list(&headers).map_err(|e| invalid(&format!("{e:?}")))?;
    let request = OutgoingRequest::new(fields);
    // A new request is a GET already; only other methods are set (one host call less a GET).
    if !matches!(method, Method::Get) {
        request
            .set_method(&method)
            .map_err(|()| invalid("method"))?;
    }
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| invalid("authority"))?;
    request
        .set_path_with_query(Some(&format!("{base}{path}")))
        .map_err(|()| invalid("path"))?;
    // A GET has no body resource at all: the host sends it with an empty body.
    let outgoing = match payload {
        Some(_) => Some(request.body().map_err(|()| invalid("body"))?),
        None => None,
    };
    let pending =
        outgoing_handler::handle(request, None).map_err(|e| transient(format!("{e:?}")))?;
    let sent = match (outgoing, payload) {
        (Some(outgoing), Some(payload)) => send_body(outgoing, &payload),
        _ => Ok(()),
    };
    // A request the host refused (or that failed) ends its body too: its answer says why, so
    // it is read before a failed write is reported.
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(e))) => return Err(transient(format!("{e:?}"))),
        _ => return Err(transient("no response".into())),
    };
    sent.map_err(|e| transient(format!("sending: {e}")))?;
    decode(action, &response)
}

/// The answer's JSON, or the error its status means.
fn decode<T: for<'de> Deserialize<'de>>(
    action: &str,
    response: &IncomingResponse,
) -> Result<T, Error> {
    let status = response.status();
    let bytes = read_body(response)
        .map_err(|e| Error::Transient(format!("{action}: reading response: {e}")))?;
    if !(200..300).contains(&status) {
        let retry_after = (status == 429)
            .then(|| response.headers().get("retry-after"))
            .and_then(|values| values.first().cloned())
            .and_then(|v| String::from_utf8(v).ok())
            .and_then(|v| v.trim().parse().ok());
        return Err(status_error(
            action,
            status,
            retry_after,
            &String::from_utf8_lossy(&bytes),
        ));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::Other(format!("{action}: unexpected response: {e}")))
}

/// Writes a request body and finishes it (the stream goes first, as wasi:http asks).
fn send_body(body: OutgoingBody, payload: &[u8]) -> Result<(), String> {
    let stream = body.write().map_err(|()| "no body stream".to_string())?;
    // `blocking-write-and-flush` takes at most 4096 bytes a call.
    for chunk in payload.chunks(4096) {
        stream
            .blocking_write_and_flush(chunk)
            .map_err(|e| format!("{e:?}"))?;
    }
    drop(stream);
    OutgoingBody::finish(body, None).map_err(|e| format!("{e:?}"))
}

/// Reads a whole response body, refusing more than `MAX_BODY` bytes.
fn read_body(response: &IncomingResponse) -> Result<Vec<u8>, String> {
    let body = response.consume().map_err(|()| "no body".to_string())?;
    let stream = body.stream().map_err(|()| "no body stream".to_string())?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) if bytes.len() + chunk.len() <= MAX_BODY => bytes.extend(chunk),
            Ok(_) => return Err(format!("more than {MAX_BODY} bytes")),
            Err(StreamError::Closed) => return Ok(bytes),
            Err(StreamError::LastOperationFailed(e)) => return Err(e.to_debug_string()),
        }
    }
}

#[derive(Deserialize)]
struct Group {
    max_size: u32,
}

#[derive(Deserialize)]
struct ApiInstance {
    id: String,
    state: String,
    #[serde(default)]
    address: Option<String>,
    #[serde(default)]
    zone: Option<String>,
}

#[derive(Deserialize)]
struct InstanceList {
    instances: Vec<ApiInstance>,
}

fn map_state(state: &str) -> InstanceState {
    match state {
        "pending" | "provisioning" => InstanceState::Creating,
        "running" => InstanceState::Running,
        "stopping" | "terminating" => InstanceState::Deleting,
        "terminated" => InstanceState::Deleted,
        other => InstanceState::Failed(format!("cloud state {other:?}")),
    }
}

struct Template;

impl Guest for Template {
    fn init(text: String) -> Result<ProviderInfo, Error> {
        let s = parse_settings(&text)?;
        let id = format!("example/{}", s.group);
        if let Ok(mut slot) = SETTINGS.lock() {
            *slot = Some(s);
        }
        let group: Group = call("GetGroup", Method::Get, "", None)?;
        emit(
            Level::Info,
            &format!("managing {id} (max size {})", group.max_size),
        );
        Ok(ProviderInfo {
            id,
            version: env!("CARGO_PKG_VERSION").to_string(),
            max_size: group.max_size,
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: false,
            },
        })
    }

    fn update() -> Result<Vec<Instance>, Error> {
        let list: InstanceList = call("ListInstances", Method::Get, "/instances", None)?;
        Ok(list
            .instances
            .into_iter()
            .map(|i| Instance {
                state: map_state(&i.state),
                id: i.id,
            })
            .collect())
    }

    fn increase(delta: u32) -> Result<u32, Error> {
        #[derive(Deserialize)]
        struct Requested {
            requested: u32,
        }
        let r: Requested = call(
            "Increase",
            Method::Post,
            "/increase",
            Some(json!({ "delta": delta })),
        )?;
        Ok(r.requested.min(delta))
    }

    fn decrease(ids: Vec<String>) -> Result<Vec<String>, Error> {
        #[derive(Deserialize)]
        struct Accepted {
            accepted: Vec<String>,
        }
        let r: Accepted = call(
            "Decrease",
            Method::Post,
            "/decrease",
            Some(json!({ "ids": ids })),
        )?;
        Ok(r.accepted
            .into_iter()
            .filter(|id| ids.contains(id))
            .collect())
    }

    fn connect_info(id: String) -> Result<Connection, Error> {
        let i: ApiInstance = call(
            "GetInstance",
            Method::Get,
            &format!("/instances/{id}"),
            None,
        )?;
        Ok(Connection {
            id: i.id,
            os: Os::Linux,
            arch: Arch::Amd64,
            protocol: Protocol::Ssh,
            internal_address: i.address,
            external_address: None,
            port: 22,
            username: "ci".to_string(),
            expires: None,
            zone: i.zone,
        })
    }

    fn heartbeat(_id: String) -> Result<(), Error> {
        Err(Error::Unsupported("heartbeat".into()))
    }

    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

export!(Template);
