//! The example cloud: the small REST API the plugin templates drive (plugin-template/*/README.md),
//! served on loopback by `flotilla plugin test --example-cloud`, so a new plugin can be tried
//! end to end before it meets a real cloud. The tests drive the templates against this same
//! server: there is one example cloud.
//!
//! One group (by default `example`, of at most [`MAX_SIZE`] instances). A new instance is
//! `pending` for [`SETTLE`], then `running`; a deleted one is `terminating` for as long, then
//! gone. Deleting an instance that is terminating or gone is accepted again (deletion is
//! idempotent); an id the group never had is not. With a token, every request must carry it
//! as the bearer token the host's credential adds.
//!
//! It records every request it receives ([`ExampleCloud::seen`], the last [`MAX_SEEN`], each
//! body cut at [`MAX_SEEN_BODY`]), so a test can assert what really left the sandbox, and it
//! can be told to fail every request with a status ([`ExampleCloud::fail_with`]).

use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// The default group's name.
pub const GROUP: &str = "example";
/// The most instances the default group holds.
pub const MAX_SIZE: u32 = 5;
/// How long an instance is pending, and terminating.
pub const SETTLE: Duration = Duration::from_millis(500);
/// Requests kept by [`ExampleCloud::seen`]; with [`MAX_SEEN_BODY`], a `plugin test` that runs
/// for hours holds at most about 4 MiB of them.
pub const MAX_SEEN: usize = 1_000;
/// Bytes of each request body kept in the record (the handler gets the whole body).
pub const MAX_SEEN_BODY: usize = 4 << 10;
/// The most bytes of a request body read.
const MAX_BODY: usize = 64 << 10;

/// How the cloud is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// The bearer token every request must carry; `None` checks none.
    pub token: Option<String>,
    /// The group's name.
    pub group: String,
    /// The most instances the group holds.
    pub max_size: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            group: GROUP.to_string(),
            max_size: MAX_SIZE,
        }
    }
}

/// One request as the cloud saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Its method.
    pub method: String,
    /// Its path.
    pub path: String,
    /// Its headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// Its body, as text.
    pub body: String,
}

struct Instance {
    id: String,
    since: Instant,
    terminating: bool,
}

struct Cloud {
    options: Options,
    next: u32,
    instances: Vec<Instance>,
    gone: BTreeSet<String>,
    seen: VecDeque<Seen>,
    fail_with: Option<StatusCode>,
}

impl Cloud {
    /// Moves instances on: pending ones run, terminating ones go.
    fn settle(&mut self) {
        let now = Instant::now();
        let (gone, kept): (Vec<Instance>, Vec<Instance>) = self
            .instances
            .drain(..)
            .partition(|i| i.terminating && now.duration_since(i.since) >= SETTLE);
        self.gone.extend(gone.into_iter().map(|i| i.id));
        self.instances = kept;
    }

    fn state(i: &Instance) -> &'static str {
        match (i.terminating, i.since.elapsed() >= SETTLE) {
            (true, _) => "terminating",
            (false, true) => "running",
            (false, false) => "pending",
        }
    }
}

type Shared = Arc<Mutex<Cloud>>;
type Answer = (StatusCode, Json<Value>);

fn message(status: StatusCode, text: &str) -> Answer {
    (status, Json(json!({ "message": text })))
}

/// Records the request, then refuses it when told to fail or when its token is wrong.
async fn gate(State(s): State<Shared>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_default();
    let (fail, token) = {
        let mut cloud = s.lock();
        if cloud.seen.len() >= MAX_SEEN {
            cloud.seen.pop_front();
        }
        cloud.seen.push_back(Seen {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: String::from_utf8_lossy(bytes.get(..MAX_SEEN_BODY).unwrap_or(&bytes))
                .into_owned(),
        });
        (cloud.fail_with, cloud.options.token.clone())
    };
    if let Some(status) = fail {
        let mut answer = message(status, "failing on purpose").into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            answer
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("7"));
        }
        return answer;
    }
    if let Some(token) = token
        && !bearer_is(&parts.headers, &token)
    {
        return message(StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn bearer_is(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        == Some(token)
}

/// The refusal of a group the cloud does not have.
fn admit(cloud: &Cloud, group: &str) -> Result<(), Answer> {
    if group != cloud.options.group {
        return Err(message(StatusCode::NOT_FOUND, "no such group"));
    }
    Ok(())
}

async fn group(State(s): State<Shared>, Path(g): Path<String>) -> Answer {
    let cloud = s.lock();
    if let Err(e) = admit(&cloud, &g) {
        return e;
    }
    (
        StatusCode::OK,
        Json(json!({ "max_size": cloud.options.max_size })),
    )
}

async fn list(State(s): State<Shared>, Path(g): Path<String>) -> Answer {
    let mut cloud = s.lock();
    if let Err(e) = admit(&cloud, &g) {
        return e;
    }
    cloud.settle();
    let instances: Vec<Value> = cloud
        .instances
        .iter()
        .map(|i| json!({ "id": i.id, "state": Cloud::state(i) }))
        .collect();
    (StatusCode::OK, Json(json!({ "instances": instances })))
}

async fn one(State(s): State<Shared>, Path((g, id)): Path<(String, String)>) -> Answer {
    let mut cloud = s.lock();
    if let Err(e) = admit(&cloud, &g) {
        return e;
    }
    cloud.settle();
    match cloud.instances.iter().find(|i| i.id == id) {
        Some(i) => (
            StatusCode::OK,
            Json(
                json!({ "id": i.id, "state": Cloud::state(i), "address": "127.0.0.1", "zone": "example-1a" }),
            ),
        ),
        None => message(StatusCode::NOT_FOUND, "no such instance"),
    }
}

async fn increase(
    State(s): State<Shared>,
    Path(g): Path<String>,
    Json(body): Json<Value>,
) -> Answer {
    let mut cloud = s.lock();
    if let Err(e) = admit(&cloud, &g) {
        return e;
    }
    let Some(delta) = body.get("delta").and_then(Value::as_u64) else {
        return message(StatusCode::BAD_REQUEST, "delta: a whole number is required");
    };
    cloud.settle();
    let live = cloud.instances.iter().filter(|i| !i.terminating).count() as u32;
    let n = u32::try_from(delta)
        .unwrap_or(u32::MAX)
        .min(cloud.options.max_size.saturating_sub(live));
    for _ in 0..n {
        cloud.next += 1;
        let id = format!("i-{:04}", cloud.next);
        cloud.instances.push(Instance {
            id,
            since: Instant::now(),
            terminating: false,
        });
    }
    (StatusCode::OK, Json(json!({ "requested": n })))
}

async fn decrease(
    State(s): State<Shared>,
    Path(g): Path<String>,
    Json(body): Json<Value>,
) -> Answer {
    let mut cloud = s.lock();
    if let Err(e) = admit(&cloud, &g) {
        return e;
    }
    let Some(ids) = body.get("ids").and_then(Value::as_array) else {
        return message(StatusCode::BAD_REQUEST, "ids: a list is required");
    };
    cloud.settle();
    let mut accepted = Vec::new();
    for id in ids.iter().filter_map(Value::as_str) {
        if cloud.gone.contains(id) {
            accepted.push(id.to_string());
        } else if let Some(i) = cloud.instances.iter_mut().find(|i| i.id == id) {
            if !i.terminating {
                i.terminating = true;
                i.since = Instant::now();
            }
            accepted.push(id.to_string());
        }
    }
    (StatusCode::OK, Json(json!({ "accepted": accepted })))
}

/// A running example cloud; it stops when dropped.
pub struct ExampleCloud {
    /// The address it listens on.
    pub addr: SocketAddr,
    shared: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ExampleCloud {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl ExampleCloud {
    /// Starts it on a free loopback port.
    pub async fn start(options: Options) -> std::io::Result<ExampleCloud> {
        let shared: Shared = Arc::new(Mutex::new(Cloud {
            options,
            next: 0,
            instances: Vec::new(),
            gone: BTreeSet::new(),
            seen: VecDeque::new(),
            fail_with: None,
        }));
        let app = axum::Router::new()
            .route("/v1/groups/{group}", get(group))
            .route("/v1/groups/{group}/instances", get(list))
            .route("/v1/groups/{group}/instances/{id}", get(one))
            .route("/v1/groups/{group}/increase", post(increase))
            .route("/v1/groups/{group}/decrease", post(decrease))
            .layer(axum::middleware::from_fn_with_state(shared.clone(), gate))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await; // ends when the owner drops it
        });
        Ok(ExampleCloud {
            addr,
            shared,
            server,
        })
    }

    /// Its base URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests it received, oldest first (the last [`MAX_SEEN`]).
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.lock().seen.iter().cloned().collect()
    }

    /// From now on, answers every request with `status` (and `Retry-After: 7` on 429);
    /// `None` serves again.
    pub fn fail_with(&self, status: Option<u16>) {
        self.shared.lock().fail_with = status.and_then(|s| StatusCode::from_u16(s).ok());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One HTTP/1.1 exchange over a fresh connection: the status and the whole answer.
    async fn exchange(cloud: &ExampleCloud, request: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(cloud.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let status = answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, answer)
    }

    fn get(path: &str, token: Option<&str>) -> String {
        let auth = token
            .map(|t| format!("authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        format!("GET {path} HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n")
    }

    #[tokio::test]
    async fn with_a_token_only_requests_that_carry_it_are_served_and_all_are_recorded() {
        let cloud = ExampleCloud::start(Options {
            token: Some("t0k".into()),
            ..Options::default()
        })
        .await
        .unwrap();
        let (status, _) = exchange(&cloud, &get("/v1/groups/example", None)).await;
        assert_eq!(status, 401);
        let (status, _) = exchange(&cloud, &get("/v1/groups/example", Some("wrong"))).await;
        assert_eq!(status, 401);
        let (status, answer) = exchange(&cloud, &get("/v1/groups/example", Some("t0k"))).await;
        assert_eq!(status, 200, "{answer}");
        assert!(answer.contains("\"max_size\":5"), "{answer}");
        let (status, _) = exchange(&cloud, &get("/v1/groups/other", Some("t0k"))).await;
        assert_eq!(status, 404);
        let seen = cloud.seen();
        assert_eq!(seen.len(), 4);
        assert!(seen.get(2).is_some_and(|s| {
            s.headers
                .iter()
                .any(|(k, v)| k == "authorization" && v == "Bearer t0k")
        }));
    }

    #[tokio::test]
    async fn told_to_fail_it_answers_every_request_with_the_status() {
        let cloud = ExampleCloud::start(Options::default()).await.unwrap();
        cloud.fail_with(Some(429));
        let (status, answer) = exchange(&cloud, &get("/v1/groups/example", None)).await;
        assert_eq!(status, 429);
        assert!(
            answer.to_ascii_lowercase().contains("retry-after: 7"),
            "{answer}"
        );
        cloud.fail_with(None);
        let (status, _) = exchange(&cloud, &get("/v1/groups/example", None)).await;
        assert_eq!(status, 200);
    }
}
