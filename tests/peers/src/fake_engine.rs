//! A small Docker Engine stand-in on a unix socket, for the load harness's largest runs (1,000
//! jobs on a 2-core machine, where a real engine's own cost would be most of the figures).
//!
//! It answers only what the GitLab driver and the host's readiness check ask: `/_ping`,
//! `/version`, `/info`; images (every image is present); containers, networks and volumes,
//! kept by name with their labels, so the driver's label sweeps and name removals find what it
//! made, with Docker's status codes (201, 204, 404 for a missing object, 409 for a name in
//! use); archives put into a container; execs with an upgraded, multiplexed stream.
//!
//! An exec plays what a container's `sh` would print for the driver's commands:
//! - a stage's detached start (`P='<dir>/<run>'` ... `mkdir "$P.d"`): the start marker, one line
//!   of output, then, after [`FakeEngine::start`]'s `script_time` for a `step_script` or
//!   `build_script` run, the status line `flotilla-status 0` on standard error;
//! - a root command that ends by echoing `flotilla-exit $?`: `flotilla-exit 0`;
//! - anything else: no output, exit code 0.
//!
//! Whatever it does not know is answered 404 and recorded in [`EngineState::unknown`], so a
//! harness that meets a new endpoint reports it instead of measuring a failure.
//!
//! Its answers follow the Docker Engine API reference (v1.47,
//! <https://docs.docker.com/reference/api/engine/version/v1.47/>), as dockerd behaves:
//! - `ContainerCreate` answers 201 `{Id, Warnings}`, and 409 for a name in use;
//! - `NetworkCreate` answers 409 for a name in use: since v1.44 `CheckDuplicate` is deprecated
//!   and always on;
//! - `VolumeCreate` of an existing name answers with that volume, unchanged (`docker volume
//!   create` is idempotent);
//! - removals answer 204, or 404 `{"message": "No such ..."}`;
//! - `ExecStart` with attached output answers `101 UPGRADED` and then the multiplexed stream
//!   (a frame is the stream's id, three zero bytes and a big-endian length; the reference's
//!   "Attach to a container" section);
//! - `/_ping` carries an `Api-Version` header, which clients negotiate with;
//! - a volume carries its creation time as `CreatedAt` (RFC 3339), which a test may set back;
//! - list filters are JSON `{"label": ["key" | "key=value"]}`, every one to match (the old map
//!   form is read too).
//!
//! A container's creation, with [`EngineState::create_delay`], runs to its end even when its
//! client has gone, as dockerd's does: what a killed `prepare` was creating still lands.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// One container, network or volume: its id and labels.
#[derive(Debug, Clone)]
pub struct Object {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    /// When it was created (a volume's `CreatedAt`).
    pub created: chrono::DateTime<chrono::Utc>,
}

impl Object {
    /// An object made now, with `labels`.
    pub fn new(id: String, labels: BTreeMap<String, String>) -> Object {
        Object {
            id,
            labels,
            created: chrono::Utc::now(),
        }
    }
}

/// One exec, as created.
#[derive(Debug, Clone)]
struct Exec {
    command: String,
}

/// What the engine holds and has seen.
#[derive(Debug, Default)]
pub struct EngineState {
    pub containers: BTreeMap<String, Object>,
    pub networks: BTreeMap<String, Object>,
    pub volumes: BTreeMap<String, Object>,
    execs: HashMap<String, Exec>,
    next: u64,
    /// Requests answered.
    pub requests: u64,
    /// Containers created over the engine's life.
    pub created: u64,
    /// Stage runs started (detached starts seen).
    pub stage_runs: u64,
    /// Requests it had no answer for: `METHOD path`.
    pub unknown: Vec<String>,
    /// Connections open now (a client that never closes one leaks it on the machine too).
    pub open_connections: u64,
    /// How long a container's creation takes (none by default). It runs to its end even when
    /// the client goes away, as dockerd's does.
    pub create_delay: Duration,
    /// Creations that have started and not finished (with a `create_delay`).
    pub creating: u64,
    /// The last request of each open connection, by connection.
    pub last_request: BTreeMap<u64, String>,
    /// Every request's method and path (without the API version), in the order they came.
    pub log: Vec<String>,
    /// Connections accepted over the engine's life.
    pub accepted: u64,
}

/// A running stand-in; it serves until the runtime that started it ends.
pub struct FakeEngine {
    pub state: Arc<Mutex<EngineState>>,
    dir: tempfile::TempDir,
}

type Answer = Response<Full<Bytes>>;

impl FakeEngine {
    /// Serves on a fresh socket; a build stage's run takes `script_time` before its status.
    pub fn start(script_time: Duration) -> FakeEngine {
        let dir = tempfile::tempdir().expect("engine dir");
        let state = Arc::new(Mutex::new(EngineState::default()));
        let listener =
            tokio::net::UnixListener::bind(dir.path().join("docker.sock")).expect("bind");
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    // Out of descriptors for a moment: a real engine keeps accepting after.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let id = {
                        let mut s = state.lock().expect("engine state");
                        s.open_connections += 1;
                        s.accepted += 1;
                        s.accepted
                    };
                    let handler = state.clone();
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let state = handler.clone();
                        let line = format!("{} {}", request.method(), request.uri().path());
                        state
                            .lock()
                            .expect("engine state")
                            .last_request
                            .insert(id, line);
                        async move { Ok::<_, Infallible>(answer(&state, request, script_time).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                    let mut s = state.lock().expect("engine state");
                    s.open_connections -= 1;
                    s.last_request.remove(&id);
                });
            }
        });
        FakeEngine { state, dir }
    }

    /// The engine's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    /// Reads the state.
    pub fn with<T>(&self, f: impl FnOnce(&EngineState) -> T) -> T {
        f(&self.state.lock().expect("engine state"))
    }

    /// Changes the state.
    pub fn with_mut<T>(&self, f: impl FnOnce(&mut EngineState) -> T) -> T {
        f(&mut self.state.lock().expect("engine state"))
    }
}

fn json_answer(status: StatusCode, body: &Value) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(body.to_string())));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    answer
}

fn status(status: StatusCode) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::new()));
    *answer.status_mut() = status;
    answer
}

fn missing(what: &str, name: &str) -> Answer {
    json_answer(
        StatusCode::NOT_FOUND,
        &json!({ "message": format!("No such {what}: {name}") }),
    )
}

/// The path without its `/v1.NN` version prefix, split into segments.
fn segments(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map_or_else(|| s.to_string(), |(_, v)| v.into_owned())
        })
        .collect();
    if parts.first().is_some_and(|v| {
        v.starts_with('v') && v[1..].chars().all(|c| c.is_ascii_digit() || c == '.')
    }) {
        parts.remove(0);
    }
    parts
}

fn query(request: &Request<Incoming>) -> HashMap<String, String> {
    url::form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// Whether `labels` pass the `label` filters of `query` (`key` or `key=value`, every one).
fn passes(query: &HashMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    let Some(filters) = query.get("filters") else {
        return true;
    };
    let parsed: Value = serde_json::from_str(filters).unwrap_or(Value::Null);
    let wanted: Vec<String> = match &parsed["label"] {
        Value::Array(list) => list
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        Value::Object(map) => map.keys().cloned().collect(),
        _ => Vec::new(),
    };
    wanted.iter().all(|w| match w.split_once('=') {
        Some((k, v)) => labels.get(k).is_some_and(|have| have == v),
        None => labels.contains_key(w),
    })
}

fn labels_of(body: &Value) -> BTreeMap<String, String> {
    body["Labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

async fn answer(
    state: &Arc<Mutex<EngineState>>,
    mut request: Request<Incoming>,
    script_time: Duration,
) -> Answer {
    let method = request.method().clone();
    let parts = segments(request.uri().path());
    let line = format!("{method} /{}", parts.join("/"));
    state.lock().expect("engine state").log.push(line);
    let query = query(&request);
    let upgrade = hyper::upgrade::on(&mut request);
    let body = crate::serve::json_body(request.into_body()).await;
    let delay = state.lock().expect("engine state").create_delay;
    if method == hyper::Method::POST
        && parts.last().is_some_and(|p| p == "create")
        && parts.iter().rev().nth(1).is_some_and(|p| p == "containers")
        && !delay.is_zero()
    {
        // As dockerd does, the creation runs to its end even when the client goes away.
        let state = state.clone();
        state.lock().expect("engine state").creating += 1;
        let made = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut s = state.lock().expect("engine state");
            s.requests += 1;
            s.creating -= 1;
            create_container(&mut s, &query, &body)
        });
        return made
            .await
            .unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR));
    }
    let mut s = state.lock().expect("engine state");
    s.requests += 1;
    let p: Vec<&str> = parts.iter().map(String::as_str).collect();
    let m = method.as_str();
    match (m, p.as_slice()) {
        ("GET" | "HEAD", ["_ping"]) => {
            let mut a = Response::new(Full::new(Bytes::from_static(b"OK")));
            a.headers_mut()
                .insert("api-version", http::HeaderValue::from_static("1.47"));
            a
        }
        ("GET", ["version"]) => json_answer(
            StatusCode::OK,
            &json!({ "Version": "27.5.1", "ApiVersion": "1.47", "MinAPIVersion": "1.24",
                     "Os": "linux", "Arch": "amd64", "KernelVersion": "6.1.0" }),
        ),
        ("GET", ["info"]) => json_answer(
            StatusCode::OK,
            &json!({ "Architecture": "x86_64", "OSType": "linux", "NCPU": 2,
                     "ServerVersion": "27.5.1" }),
        ),
        ("GET", ["images", .., "json"]) => json_answer(
            StatusCode::OK,
            &json!({ "Id": "sha256:0000000000000000000000000000000000000000000000000000000000000001",
                     "Os": "linux", "Architecture": "amd64", "Config": {} }),
        ),
        ("POST", ["images", "create"]) => json_answer(
            StatusCode::OK,
            &json!({ "status": "Status: Image is up to date" }),
        ),
        ("GET", ["containers", "json"]) => {
            let list: Vec<Value> = s
                .containers
                .iter()
                .filter(|(_, o)| passes(&query, &o.labels))
                .map(|(name, o)| {
                    json!({ "Id": o.id, "Names": [format!("/{name}")], "Labels": o.labels,
                            "State": "running" })
                })
                .collect();
            json_answer(StatusCode::OK, &Value::Array(list))
        }
        ("POST", ["containers", "create"]) => create_container(&mut s, &query, &body),
        ("POST", ["containers", name, "start"]) => match s.container(name) {
            Some(_) => status(StatusCode::NO_CONTENT),
            None => missing("container", name),
        },
        ("GET", ["containers", name, "json"]) => match s.container(name) {
            Some((n, o)) => json_answer(
                StatusCode::OK,
                &json!({ "Id": o.id, "Name": format!("/{n}"),
                         "State": { "Status": "running", "Running": true },
                         "Config": { "Labels": o.labels } }),
            ),
            None => missing("container", name),
        },
        ("PUT", ["containers", name, "archive"]) => match s.container(name) {
            Some(_) => status(StatusCode::OK),
            None => missing("container", name),
        },
        ("DELETE", ["containers", name]) => match s.container(name).map(|(n, _)| n) {
            Some(n) => {
                s.containers.remove(&n);
                status(StatusCode::NO_CONTENT)
            }
            None => missing("container", name),
        },
        ("POST", ["containers", name, "exec"]) => match s.container(name) {
            Some(_) => {
                let id = s.new_id();
                let command = body["Cmd"]
                    .as_array()
                    .and_then(|c| c.last())
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                s.execs.insert(id.clone(), Exec { command });
                json_answer(StatusCode::CREATED, &json!({ "Id": id }))
            }
            None => missing("container", name),
        },
        ("POST", ["exec", id, "start"]) => {
            let Some(exec) = s.execs.get(*id).cloned() else {
                return missing("exec instance", id);
            };
            let (stdout, stderr, hold) = play(&exec.command, script_time);
            if hold.is_some() || !stderr.is_empty() {
                s.stage_runs += 1;
            }
            drop(s);
            tokio::spawn(async move {
                if let Ok(upgraded) = upgrade.await {
                    let mut io = hyper_util::rt::TokioIo::new(upgraded);
                    let _ = io.write_all(&frame(1, stdout.as_bytes())).await;
                    let _ = io.flush().await;
                    if let Some(hold) = hold {
                        tokio::time::sleep(hold).await;
                    }
                    if !stderr.is_empty() {
                        let _ = io.write_all(&frame(2, stderr.as_bytes())).await;
                    }
                    let _ = io.shutdown().await;
                }
            });
            let mut a = status(StatusCode::SWITCHING_PROTOCOLS);
            let h = a.headers_mut();
            h.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("Upgrade"),
            );
            h.insert(http::header::UPGRADE, http::HeaderValue::from_static("tcp"));
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/vnd.docker.multiplexed-stream"),
            );
            a
        }
        ("GET", ["exec", id, "json"]) => match s.execs.get(*id) {
            Some(_) => json_answer(
                StatusCode::OK,
                &json!({ "ID": id, "Running": false, "ExitCode": 0 }),
            ),
            None => missing("exec instance", id),
        },
        ("POST", ["exec", id, "resize"]) => match s.execs.get(*id) {
            Some(_) => status(StatusCode::OK),
            None => missing("exec instance", id),
        },
        ("GET", ["networks"]) => {
            let list: Vec<Value> = s
                .networks
                .iter()
                .filter(|(_, o)| passes(&query, &o.labels))
                .map(|(name, o)| json!({ "Name": name, "Id": o.id, "Labels": o.labels }))
                .collect();
            json_answer(StatusCode::OK, &Value::Array(list))
        }
        ("POST", ["networks", "create"]) => {
            let name = body["Name"].as_str().unwrap_or_default().to_string();
            if s.networks.contains_key(&name) {
                return json_answer(
                    StatusCode::CONFLICT,
                    &json!({ "message": format!("network with name {name} already exists") }),
                );
            }
            let id = s.new_id();
            s.networks
                .insert(name, Object::new(id.clone(), labels_of(&body)));
            json_answer(StatusCode::CREATED, &json!({ "Id": id, "Warning": "" }))
        }
        ("DELETE", ["networks", name]) => {
            let found = s
                .networks
                .iter()
                .find(|(n, o)| n.as_str() == *name || o.id == *name)
                .map(|(n, _)| n.clone());
            match found {
                Some(n) => {
                    s.networks.remove(&n);
                    status(StatusCode::NO_CONTENT)
                }
                None => missing("network", name),
            }
        }
        ("GET", ["volumes"]) => {
            let list: Vec<Value> = s
                .volumes
                .iter()
                .filter(|(_, o)| passes(&query, &o.labels))
                .map(|(name, o)| volume(name, o))
                .collect();
            json_answer(StatusCode::OK, &json!({ "Volumes": list, "Warnings": [] }))
        }
        ("POST", ["volumes", "create"]) => {
            let name = body["Name"].as_str().unwrap_or_default().to_string();
            // Docker answers an existing volume's create with the volume, unchanged.
            if !s.volumes.contains_key(&name) {
                let id = s.new_id();
                s.volumes
                    .insert(name.clone(), Object::new(id, labels_of(&body)));
            }
            let o = s.volumes.get(&name).cloned().expect("just made");
            json_answer(StatusCode::CREATED, &volume(&name, &o))
        }
        ("DELETE", ["volumes", name]) => match s.volumes.remove(*name) {
            Some(_) => status(StatusCode::NO_CONTENT),
            None => missing("volume", name),
        },
        _ => {
            s.unknown.push(format!("{m} /{}", parts.join("/")));
            json_answer(
                StatusCode::NOT_FOUND,
                &json!({ "message": "page not found" }),
            )
        }
    }
}

/// `POST /containers/create?name=`: 201 with the new id, or 409 for a name in use.
fn create_container(s: &mut EngineState, query: &HashMap<String, String>, body: &Value) -> Answer {
    let name = query.get("name").cloned().unwrap_or_default();
    if s.containers.contains_key(&name) {
        return json_answer(
            StatusCode::CONFLICT,
            &json!({ "message": format!("Conflict. The container name \"/{name}\" is already in use") }),
        );
    }
    let id = s.new_id();
    s.created += 1;
    let labels = labels_of(body);
    s.containers.insert(name, Object::new(id.clone(), labels));
    json_answer(StatusCode::CREATED, &json!({ "Id": id, "Warnings": [] }))
}

impl EngineState {
    fn new_id(&mut self) -> String {
        self.next += 1;
        format!("{:064x}", self.next)
    }

    /// A container by name or id: its name and object.
    fn container(&self, name_or_id: &str) -> Option<(String, Object)> {
        self.containers
            .iter()
            .find(|(n, o)| n.as_str() == name_or_id || o.id == name_or_id)
            .map(|(n, o)| (n.clone(), o.clone()))
    }
}

fn volume(name: &str, o: &Object) -> Value {
    json!({ "Name": name, "Driver": "local", "Mountpoint": format!("/var/lib/docker/volumes/{name}/_data"),
            "Labels": o.labels, "Scope": "local", "Options": {},
            "CreatedAt": o.created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true) })
}

/// One frame of Docker's multiplexed stream: `kind` 1 standard output, 2 standard error.
fn frame(kind: u8, data: &[u8]) -> Vec<u8> {
    let mut out = vec![kind, 0, 0, 0];
    out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// What `sh -c command` would print for the driver's commands: standard output, standard
/// error, and how long to wait between them.
fn play(command: &str, script_time: Duration) -> (String, String, Option<Duration>) {
    let run = command.lines().find_map(|l| l.strip_prefix("P=")).map(|p| {
        p.trim_matches('\'')
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string()
    });
    if let Some(run) = run
        && command.contains("mkdir \"$P.d\"")
    {
        let build = run.contains("step_script") || run.contains("build_script");
        return (
            format!("flotilla-start {run}\nflotilla-load: {run} ran\n"),
            "flotilla-status 0\n".to_string(),
            build.then_some(script_time),
        );
    }
    if command.contains("flotilla-exit $?") {
        return ("flotilla-exit 0\n".to_string(), String::new(), None);
    }
    (String::new(), String::new(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_and_escaped_paths_are_read_as_docker_routes_them() {
        assert_eq!(
            segments("/v1.47/containers/a%2Fb/json"),
            ["containers", "a/b", "json"]
        );
        assert_eq!(segments("/_ping"), ["_ping"]);
        assert_eq!(segments("/volumes/v1"), ["volumes", "v1"]);
    }

    #[test]
    fn label_filters_match_by_key_or_by_key_and_value() {
        let labels = BTreeMap::from([("job".to_string(), "7".to_string())]);
        let q = |f: &str| HashMap::from([("filters".to_string(), f.to_string())]);
        assert!(passes(&q(r#"{"label":["job=7"]}"#), &labels));
        assert!(passes(&q(r#"{"label":["job"]}"#), &labels));
        assert!(!passes(&q(r#"{"label":["job=8"]}"#), &labels));
        assert!(passes(&q(r#"{"label":{"job=7":true}}"#), &labels));
        assert!(passes(&HashMap::new(), &labels));
    }

    #[test]
    fn a_detached_start_is_played_with_its_marker_and_status() {
        let (out, err, hold) = play(
            "P='/tmp/flotilla-step_script-1a'\nif mkdir \"$P.d\" 2>/dev/null; then\n:\nfi",
            Duration::from_secs(3),
        );
        assert!(
            out.starts_with("flotilla-start flotilla-step_script-1a\n"),
            "{out}"
        );
        assert_eq!(err, "flotilla-status 0\n");
        assert_eq!(hold, Some(Duration::from_secs(3)));
        let (out, _, hold) = play("( x ) 2>&1; echo \"flotilla-exit $?\"", Duration::ZERO);
        assert_eq!((out.as_str(), hold), ("flotilla-exit 0\n", None));
    }
}
