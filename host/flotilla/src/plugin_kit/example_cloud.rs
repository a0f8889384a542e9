//! The example cloud: the small REST API the plugin templates drive (plugin-template/*/README.md),
//! served on loopback by `flotilla plugin test --example-cloud`, so a new plugin can be tried
//! end to end before it meets a real cloud.
//!
//! One group, `example`, of at most [`MAX_SIZE`] instances. A new instance is `pending` for
//! half a second, then `running`; a deleted one is `terminating` for half a second, then gone.
//! Deleting an instance that is terminating or gone is accepted again (deletion is
//! idempotent); an id the group never had is not. Every request must carry the bearer token
//! the host's credential adds.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// The group's name.
pub const GROUP: &str = "example";
/// The most instances the group holds.
pub const MAX_SIZE: u32 = 5;
/// How long an instance is pending, and terminating.
const SETTLE: Duration = Duration::from_millis(500);

struct Instance {
    id: String,
    since: Instant,
    terminating: bool,
}

struct Cloud {
    token: String,
    next: u32,
    instances: Vec<Instance>,
    gone: BTreeSet<String>,
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

/// Checks the bearer token and the group; the refusal otherwise.
fn admit(cloud: &Cloud, headers: &HeaderMap, group: &str) -> Result<(), Answer> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(cloud.token.as_str()) {
        return Err(message(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token",
        ));
    }
    if group != GROUP {
        return Err(message(StatusCode::NOT_FOUND, "no such group"));
    }
    Ok(())
}

async fn group(State(s): State<Shared>, headers: HeaderMap, Path(g): Path<String>) -> Answer {
    let cloud = s.lock();
    if let Err(e) = admit(&cloud, &headers, &g) {
        return e;
    }
    (StatusCode::OK, Json(json!({ "max_size": MAX_SIZE })))
}

async fn list(State(s): State<Shared>, headers: HeaderMap, Path(g): Path<String>) -> Answer {
    let mut cloud = s.lock();
    if let Err(e) = admit(&cloud, &headers, &g) {
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

async fn one(
    State(s): State<Shared>,
    headers: HeaderMap,
    Path((g, id)): Path<(String, String)>,
) -> Answer {
    let mut cloud = s.lock();
    if let Err(e) = admit(&cloud, &headers, &g) {
        return e;
    }
    cloud.settle();
    match cloud.instances.iter().find(|i| i.id == id) {
        Some(i) => (
            StatusCode::OK,
            Json(json!({ "id": i.id, "state": Cloud::state(i), "address": "127.0.0.1" })),
        ),
        None => message(StatusCode::NOT_FOUND, "no such instance"),
    }
}

async fn increase(
    State(s): State<Shared>,
    headers: HeaderMap,
    Path(g): Path<String>,
    Json(body): Json<Value>,
) -> Answer {
    let mut cloud = s.lock();
    if let Err(e) = admit(&cloud, &headers, &g) {
        return e;
    }
    let Some(delta) = body.get("delta").and_then(Value::as_u64) else {
        return message(StatusCode::BAD_REQUEST, "delta: a whole number is required");
    };
    cloud.settle();
    let live = cloud.instances.iter().filter(|i| !i.terminating).count() as u32;
    let n = u32::try_from(delta)
        .unwrap_or(u32::MAX)
        .min(MAX_SIZE.saturating_sub(live));
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
    headers: HeaderMap,
    Path(g): Path<String>,
    Json(body): Json<Value>,
) -> Answer {
    let mut cloud = s.lock();
    if let Err(e) = admit(&cloud, &headers, &g) {
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

/// A running example cloud.
pub struct ExampleCloud {
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The address it listens on.
    pub addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ExampleCloud {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl ExampleCloud {
    /// Starts it on a free loopback port; requests must carry `Authorization: Bearer token`.
    pub async fn start(token: &str) -> std::io::Result<ExampleCloud> {
        let shared: Shared = Arc::new(Mutex::new(Cloud {
            token: token.to_string(),
            next: 0,
            instances: Vec::new(),
            gone: BTreeSet::new(),
        }));
        let app = axum::Router::new()
            .route("/v1/groups/{group}", get(group))
            .route("/v1/groups/{group}/instances", get(list))
            .route("/v1/groups/{group}/instances/{id}", get(one))
            .route("/v1/groups/{group}/increase", post(increase))
            .route("/v1/groups/{group}/decrease", post(decrease))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await; // ends when the kit drops it
        });
        Ok(ExampleCloud {
            endpoint: format!("http://{addr}"),
            addr,
            server,
        })
    }
}
