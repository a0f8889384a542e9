//! The smallest complete Flotilla provider plugin. Copy this directory to start your own.
//!
//! It drives a simple REST API (the "example cloud", documented in README.md) over
//! `wasi:http`. Every request names the pool's credential in the `flotilla-credential`
//! header; the host strips that header and adds the real authorisation, so this code never
//! sees a secret. Scaling policy lives in the host: this plugin only translates calls.

use serde::Deserialize;
use serde_json::json;
use wstd::http::{Body, Client, Method, Request, Response, StatusCode};

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

/// Maps an HTTP status to the contract's error cases.
fn status_error(action: &str, response: &Response<Body>, body: &str) -> Error {
    let status = response.status();
    let message = format!(
        "{action}: HTTP {status}: {}",
        body.chars().take(300).collect::<String>()
    );
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::Unauthorized(message),
        StatusCode::NOT_FOUND => Error::NotFound(message),
        StatusCode::TOO_MANY_REQUESTS => {
            let retry = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            Error::Throttled(Throttle {
                retry_after_seconds: retry,
                message,
            })
        }
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => Error::InvalidConfig(message),
        s if s.is_server_error() => Error::Transient(message),
        _ => Error::Other(message),
    }
}

/// Sends one JSON request, authenticated by the host, and decodes the JSON answer.
fn call<T: for<'de> Deserialize<'de>>(
    action: &str,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<T, Error> {
    let s = settings()?;
    let url = format!(
        "{}/v1/groups/{}{path}",
        s.endpoint.trim_end_matches('/'),
        s.group
    );
    wstd::runtime::block_on(async move {
        let mut builder = Request::builder()
            .method(method)
            .uri(&url)
            .header("accept", "application/json");
        if let Some(name) = &s.credential {
            // The host replaces this with real authorisation; the secret never reaches us.
            builder = builder.header("flotilla-credential", name);
        }
        let request = match body {
            Some(json) => builder
                .header("content-type", "application/json")
                .body(Body::from(json.to_string().into_bytes())),
            // An explicitly empty stream: wstd's Body::empty() races with servers that close.
            None => builder.body(Body::from_stream(futures_lite::stream::empty::<Vec<u8>>())),
        }
        .map_err(|e| Error::InvalidConfig(format!("{action}: bad request for {url}: {e}")))?;
        let mut response = Client::new()
            .send(request)
            .await
            .map_err(|e| Error::Transient(format!("{action}: {url}: {e}")))?;
        let text = response
            .body_mut()
            .str_contents()
            .await
            .map_err(|e| Error::Transient(format!("{action}: reading response: {e}")))?
            .to_string();
        if !response.status().is_success() {
            return Err(status_error(action, &response, &text));
        }
        serde_json::from_str(&text)
            .map_err(|e| Error::Other(format!("{action}: unexpected response: {e}")))
    })
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
        let group: Group = call("GetGroup", Method::GET, "", None)?;
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
        let list: InstanceList = call("ListInstances", Method::GET, "/instances", None)?;
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
            Method::POST,
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
            Method::POST,
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
            Method::GET,
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
