//! The HTTP server: the lease API (bearer-token guarded JSON), pool status, `/metrics`,
//! `/healthz` and `/readyz`. Errors are JSON with a stable `code`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};

use crate::metrics::Metrics;
use crate::pools::{Pools, RunningPool, Unavailable};
use flotilla_credentials::Secret;
use flotilla_scaler::driver::AcquireError;
use flotilla_scaler::{Lease, LeaseError, LeaseState, PoolHandle};

mod auth;
mod docker;
mod shell;
mod status;
mod wire;
pub(crate) use auth::Caller;
use auth::auth;
use docker::docker;
pub use docker::watch_lease_channels;
use shell::{EXEC_BODY_LIMIT, exec, terminal};
use status::{instances, metrics, pools, readyz};

/// Shared state of the server.
pub struct AppState {
    /// Every configured pool: starting, running, or waiting to try its start again.
    pub pools: Pools,
    /// The API token; `None` leaves `/v1` open (only allowed on loopback by `run`).
    pub token: Option<Secret>,
    /// The read-only token of `/sd/prometheus`; `None`: the endpoint is closed (401).
    pub sd_token: Option<Secret>,
    /// The operators' named tokens (`[[server.operator]]`), each as powerful as `token`.
    pub operators: Vec<(String, Secret)>,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Set once SIGTERM arrives.
    pub draining: AtomicBool,
}

/// An API error: a status, a stable code and a message.
#[derive(Debug)]
pub struct ApiError {
    code: ErrorCode,
    message: String,
}

pub use flotilla_api::ErrorCode;

impl ApiError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.code.status(),
            Json(flotilla_api::ErrorBody {
                error: flotilla_api::ErrorDetail {
                    code: self.code,
                    message: self.message,
                },
            }),
        )
            .into_response()
    }
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        let code = match &e {
            LeaseError::UnknownLease(_) => ErrorCode::UnknownLease,
            LeaseError::AlreadyAcquired(_) => ErrorCode::AlreadyAcquired,
            LeaseError::NotAcquired(_) => ErrorCode::NotAcquired,
            LeaseError::Acquired(_) => ErrorCode::Acquired,
            LeaseError::Failed { .. } => ErrorCode::LeaseFailed,
            LeaseError::AtCapacity(_) => ErrorCode::AtCapacity,
            LeaseError::NoIdleSlot => ErrorCode::NoIdleSlot,
            LeaseError::ShuttingDown => ErrorCode::ShuttingDown,
            LeaseError::Stopped(_) => ErrorCode::PoolStopped,
            LeaseError::LabelInUse { .. } => ErrorCode::LabelInUse,
            LeaseError::NotDurable(_) => ErrorCode::StoreFailed,
        };
        ApiError::new(code, e.to_string())
    }
}

type Shared = Arc<AppState>;

/// Builds the router.
pub fn router(state: Shared) -> Router {
    let v1 = Router::new()
        .route("/v1/pools", get(pools))
        .route("/v1/pools/{pool}/instances", get(instances))
        .route("/v1/pools/{pool}/leases", post(reserve).get(list_leases))
        .route(
            "/v1/pools/{pool}/leases/{id}",
            get(get_lease).delete(unreserve),
        )
        .route("/v1/pools/{pool}/leases/{id}/acquire", post(acquire))
        .route("/v1/pools/{pool}/leases/{id}/release", post(release))
        .route("/v1/pools/{pool}/leases/{id}/report", post(report))
        .route("/v1/pools/{pool}/leases/{id}/renew", post(renew))
        .route("/v1/pools/{pool}/leases/{id}/docker/{*path}", any(docker))
        .route(
            "/v1/pools/{pool}/leases/{id}/exec",
            post(exec).layer(axum::extract::DefaultBodyLimit::max(EXEC_BODY_LIMIT)),
        )
        .route("/v1/pools/{pool}/leases/{id}/terminal", get(terminal))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .merge(v1)
        .merge(health_routes())
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint") })
        .with_state(state)
}

async fn healthz() -> Json<flotilla_api::status::HealthAnswer> {
    Json(flotilla_api::status::HealthAnswer {
        status: "ok".into(),
    })
}

/// `/metrics`, `/healthz` and `/readyz`: unauthenticated, and all `server.metrics_listen`
/// serves.
fn health_routes() -> Router<Shared> {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/sd/prometheus", get(crate::sd::prometheus))
}

/// The router of `server.metrics_listen`: health and metrics only, never the lease API.
pub fn health_router(state: Shared) -> Router {
    health_routes()
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .fallback(|| async {
            ApiError::new(
                ErrorCode::NotFound,
                "this listener serves /metrics, /healthz, /readyz and /sd/prometheus only",
            )
        })
        .with_state(state)
}

/// Counts each request by route (the pattern, never the path: ids stay out of the labels),
/// method and status, times it to the end of its answer's head (a long poll's wait included;
/// an upgraded stream's life is not), and counts the requests in flight.
async fn observe(
    State(state): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // A matched path is a shared pattern: cloned, not copied.
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let method = request.method().clone();
    let start = std::time::Instant::now();
    let _in_flight = state.metrics.http_started();
    let response = next.run(request).await;
    state.metrics.http_finished(
        route.as_ref().map_or("unmatched", |r| r.as_str()),
        method.as_str(),
        response.status().as_u16(),
        start.elapsed(),
    );
    response
}

fn running(state: &AppState, name: &str) -> Result<Arc<RunningPool>, ApiError> {
    state.pools.get(name).map_err(|why| match why {
        Unavailable::Unknown => {
            ApiError::new(ErrorCode::UnknownPool, format!("no pool named {name:?}"))
        }
        Unavailable::Starting { attempt } => ApiError::new(
            ErrorCode::PoolStarting,
            format!("pool {name} is starting (try {attempt}); try again shortly"),
        ),
        Unavailable::Failed { reason, retry_at } => ApiError::new(
            ErrorCode::PoolStopped,
            format!(
                "pool {name} failed to start: {reason} (next try at {retry_at} ms since the epoch)"
            ),
        ),
    })
}

/// The running pool named `name`'s fallback, when it has one that runs.
fn fallback_of(state: &AppState, of: &RunningPool) -> Option<(String, Arc<RunningPool>)> {
    let name = of.fallback.as_ref()?;
    state.pools.get(name).ok().map(|p| (name.clone(), p))
}

/// Whether `p` holds lease `id` that pool `from` handed over.
fn handed(p: &PoolHandle, id: u64, from: &str) -> bool {
    p.with_core(|c| c.lease(id).and_then(|l| l.handed_from.clone()))
        .is_some_and(|f| f == from)
}

/// The pool that holds lease `id` of pool `name`: the pool itself, or its fallback when the
/// reservation was handed over (the holder keeps naming the pool it reserved in). With its
/// name, for messages, logs and metrics.
fn holder(state: &AppState, name: &str, id: u64) -> Result<(String, Arc<RunningPool>), ApiError> {
    let first = running(state, name)?;
    // A pool without a fallback takes no second look (and no second lock) per request.
    if first.fallback.is_some()
        && first.handle.with_core(|c| c.lease(id).is_none())
        && let Some((fallback, p)) = fallback_of(state, &first)
        && handed(&p.handle, id, name)
    {
        return Ok((fallback, p));
    }
    Ok((name.to_string(), first))
}

/// A lease route's `{pool}` and `{id}`, the id parsed: a bad one is refused `bad_lease_id`,
/// as every answer of the API is refused, never with axum's own plain-text rejection.
struct LeasePath {
    pool: String,
    id: u64,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for LeasePath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<LeasePath, ApiError> {
        let Path(params) =
            Path::<std::collections::HashMap<String, String>>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.body_text()))?;
        let (Some(pool), Some(id)) = (params.get("pool"), params.get("id")) else {
            return Err(ApiError::new(ErrorCode::NotFound, "no such endpoint"));
        };
        let id = id.parse().map_err(|_| {
            ApiError::new(ErrorCode::BadLeaseId, format!("{id:?} is not a lease id"))
        })?;
        Ok(LeasePath {
            pool: pool.clone(),
            id,
        })
    }
}

/// At most this many labels per lease, with keys and values this long.
const MAX_LABELS: usize = 16;
const MAX_LABEL_KEY: usize = 63;
const MAX_LABEL_VALUE: usize = 256;

fn parse_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("request body: {e}")))
}

fn check_label(key: &str, value: &str) -> Result<(), ApiError> {
    let key_ok = !key.is_empty()
        && key.len() <= MAX_LABEL_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
    if !key_ok {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "label key {:?}: 1-{MAX_LABEL_KEY} characters of a-z, A-Z, 0-9, '-', '_', '.', '/'",
                key.chars().take(80).collect::<String>()
            ),
        ));
    }
    if value.len() > MAX_LABEL_VALUE || value.chars().any(char::is_control) {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "label {key}: the value must be at most {MAX_LABEL_VALUE} bytes, without control characters"
            ),
        ));
    }
    Ok(())
}

/// A reservation's request checked: its labels and tenant within bounds; its deadline.
fn checked_reservation(
    body: &flotilla_api::ReserveRequest,
) -> Result<Option<std::time::Duration>, ApiError> {
    let deadline = match body.deadline_seconds {
        None => None,
        Some(s) if (1..=flotilla_api::ReserveRequest::MAX_DEADLINE_SECONDS).contains(&s) => {
            Some(std::time::Duration::from_secs(s))
        }
        Some(s) => {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!(
                    "deadline_seconds {s}: expected 1 to {}",
                    flotilla_api::ReserveRequest::MAX_DEADLINE_SECONDS
                ),
            ));
        }
    };
    if body.labels.len() > MAX_LABELS {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("at most {MAX_LABELS} labels per lease"),
        ));
    }
    for (key, value) in &body.labels {
        check_label(key, value)?;
    }
    if let Some(tenant) = &body.tenant {
        check_label("tenant", tenant)?;
        if tenant.is_empty() {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                "tenant: empty; leave it out for a lease without one",
            ));
        }
    }
    Ok(deadline)
}

async fn reserve(
    State(state): State<Shared>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    if state.draining.load(Ordering::Relaxed) {
        return Err(LeaseError::ShuttingDown.into());
    }
    let running = running(&state, &name)?;
    let p = &running.handle;
    let body: flotilla_api::ReserveRequest = parse_body(&body)?;
    let deadline = checked_reservation(&body)?;
    // A label is held once across the pool and the reservations it handed to its fallback.
    if let Some((_, f)) = fallback_of(&state, &running) {
        for (key, value) in &body.labels {
            let held = f
                .handle
                .with_core(|c| c.lease_by_label(key, value).cloned());
            if let Some(held) = held.filter(|l| l.handed_from.as_deref() == Some(name.as_str())) {
                return Err(LeaseError::LabelInUse {
                    key: key.clone(),
                    value: value.clone(),
                    lease: held.id,
                }
                .into());
            }
        }
    }
    let id = p
        .reserve_for(body.labels, deadline, body.tenant)
        .inspect_err(|e| match e {
            // The metric's reason is the error code the client gets.
            LeaseError::AtCapacity(_) => state
                .metrics
                .reservation_refused(&name, ErrorCode::AtCapacity.name()),
            LeaseError::NoIdleSlot => state
                .metrics
                .reservation_refused(&name, ErrorCode::NoIdleSlot.name()),
            _ => {}
        })?;
    let lease = p
        .with_core(|c| c.lease(id).map(wire::view))
        .ok_or(LeaseError::UnknownLease(id))?;
    tracing::info!(pool = %name, plugin_digest = %running.plugin_digest, lease = id, "lease reserved");
    Ok((
        StatusCode::CREATED,
        Json(flotilla_api::LeaseAnswer { pool: name, lease }),
    )
        .into_response())
}

/// The most `label` parameters one lease list takes.
const MAX_LABELS_PER_LIST: usize = 100;

/// The lease list: every lease of the pool, or with `?label=key=value`, the lease holding
/// that label. The parameter may repeat (`?label=k=a&label=k=b`): the answer holds each named
/// lease that exists, once, so a caller asks after many leases in one request.
async fn list_leases(
    State(state): State<Shared>,
    Path(name): Path<String>,
    query: Result<
        axum::extract::Query<Vec<(String, String)>>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Json<flotilla_api::LeaseList>, ApiError> {
    let first = running(&state, &name)?;
    let p = &first.handle;
    let query = query.map_err(|e| ApiError::new(ErrorCode::BadRequest, e.body_text()))?;
    // Reservations handed to the fallback are still this pool's to its holders.
    let fallback = fallback_of(&state, &first);
    let handed_here = |l: &Lease| l.handed_from.as_deref() == Some(name.as_str());
    let labels: Vec<&str> = query
        .0
        .iter()
        .filter(|(k, _)| k == "label")
        .map(|(_, v)| v.as_str())
        .collect();
    if labels.len() > MAX_LABELS_PER_LIST {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "{} label parameters; at most {MAX_LABELS_PER_LIST} in one request",
                labels.len()
            ),
        ));
    }
    if !labels.is_empty() {
        let mut pairs = Vec::with_capacity(labels.len());
        for label in labels {
            let (key, value) = label
                .split_once('=')
                .ok_or_else(|| ApiError::new(ErrorCode::BadRequest, "label: expected key=value"))?;
            check_label(key, value)?;
            pairs.push((key, value));
        }
        // One hold of each pool's core for all the names.
        let mut found: Vec<Option<Lease>> = p.with_core(|c| {
            pairs
                .iter()
                .map(|(key, value)| c.lease_by_label(key, value).cloned())
                .collect()
        });
        if let Some((_, f)) = &fallback
            && found.iter().any(Option::is_none)
        {
            f.handle.with_core(|c| {
                for (lease, (key, value)) in found.iter_mut().zip(&pairs) {
                    if lease.is_none() {
                        *lease = c
                            .lease_by_label(key, value)
                            .filter(|l| handed_here(l))
                            .cloned();
                    }
                }
            });
        }
        let mut found: Vec<Lease> = found.into_iter().flatten().collect();
        found.sort_by_key(|l| l.id);
        found.dedup_by_key(|l| l.id);
        return Ok(Json(flotilla_api::LeaseList {
            leases: found.iter().map(wire::view).collect(),
            pool: name,
        }));
    }
    let mut leases = p.with_core(|c| c.leases().cloned().collect::<Vec<_>>());
    if let Some((_, f)) = &fallback {
        f.handle
            .with_core(|c| leases.extend(c.leases().filter(|l| handed_here(l)).cloned()));
    }
    leases.sort_by_key(|l| l.id);
    Ok(Json(flotilla_api::LeaseList {
        leases: leases.iter().map(wire::view).collect(),
        pool: name,
    }))
}

async fn get_lease(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
) -> Result<Json<flotilla_api::LeaseAnswer>, ApiError> {
    let (name, running) = holder(&state, &name, id)?;
    let lease = running
        .handle
        .with_core(|c| c.lease(id).map(wire::view))
        .ok_or(LeaseError::UnknownLease(id))?;
    Ok(Json(flotilla_api::LeaseAnswer { pool: name, lease }))
}

/// `POST .../acquire`, a long poll: while it waits, its connection counts under
/// `max_long_polls` rather than `max_connections`, and it takes a connection slot again to
/// answer (or closes the connection after the answer when none is free).
async fn acquire(
    state: State<Shared>,
    path: LeasePath,
    connection: Option<axum::Extension<crate::serve::Connection>>,
) -> Response {
    let parked = match connection.map(|c| c.park()) {
        Some(None) => {
            return ApiError::new(
                ErrorCode::TooManyRequests,
                "as many acquires wait as the server lets wait (server.max_long_polls); retry in a second",
            )
            .into_response();
        }
        Some(Some(parked)) => Some(parked),
        None => None,
    };
    let mut answer = bind(state, path).await.into_response();
    if parked.is_some_and(|p| !p.resume()) {
        answer.headers_mut().insert(
            header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    answer
}

/// Binds the lease to a slot, waiting up to the pool's `instance_acquire_timeout`.
async fn bind(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
) -> Result<Json<flotilla_api::AcquireAnswer>, ApiError> {
    let asked = name;
    let (mut name, mut running) = holder(&state, &asked, id)?;
    // A reservation handed to the fallback while its acquire waits: the wait goes on there.
    let binding = loop {
        let result = running.handle.acquire(id).await;
        if let Err(AcquireError::Lease(LeaseError::UnknownLease(_))) = &result {
            let (now_at, now_running) = holder(&state, &asked, id)?;
            if now_at != name {
                (name, running) = (now_at, now_running);
                continue;
            }
        }
        break result.map_err(|e| match e {
            AcquireError::Lease(l) => ApiError::from(l),
            AcquireError::Timeout(_) => ApiError::new(ErrorCode::AcquireTimeout, e.to_string()),
        })?;
    };
    let p = &running.handle;
    state.metrics.lease_acquired(&name);
    tracing::info!(pool = %name, plugin_digest = %running.plugin_digest, lease = id, instance = %binding.instance, slot = binding.slot, "lease acquired");
    // The readiness check asked the plugin already: an answer that does not expire is read
    // from there, so an acquire costs no cloud request (a plugin call behind the pool's
    // plugin lock, which `update` holds too). Expiring answers (a key pushed for a minute)
    // are asked for anew.
    let kept = running
        .connector
        .as_ref()
        .and_then(|c| c.described(&binding.instance))
        .map(|(connection, _)| connection)
        .filter(|c| c.expires.is_none());
    let (connection, connection_error) = match kept {
        Some(c) => (Some(c), None),
        None => match p.connect_info(&binding.instance).await {
            Ok(c) => {
                if running.connector.is_none() {
                    running.described.keep(&binding.instance, &c);
                }
                (Some(c), None)
            }
            Err(e) => (None, Some(e.to_string())),
        },
    };
    let (connection, connection_error) = match connection.map(serde_json::to_value).transpose() {
        Ok(value) => (value, connection_error),
        Err(e) => (None, Some(format!("the plugin's connection details: {e}"))),
    };
    Ok(Json(flotilla_api::AcquireAnswer {
        lease: id,
        instance: binding.instance,
        slot: binding.slot,
        docker: running
            .connector
            .as_ref()
            .filter(|c| c.serves_docker())
            .map(|_| flotilla_api::DockerHandle {
                path: format!("/v1/pools/{name}/leases/{id}/docker"),
            }),
        pool: name,
        connection,
        connection_error,
    }))
}

/// The instance of an acquired lease; the lease's own error otherwise (unknown, only
/// reserved, or failed with its cause).
fn acquired_instance(p: &PoolHandle, id: u64) -> Result<String, ApiError> {
    let state = p
        .with_core(|c| c.lease(id).map(|l| l.state.clone()))
        .ok_or(LeaseError::UnknownLease(id))?;
    match state {
        LeaseState::Acquired { instance, .. } => Ok(instance),
        LeaseState::Reserved => Err(LeaseError::NotAcquired(id).into()),
        LeaseState::Failed { cause } => Err(LeaseError::Failed { id, cause }.into()),
    }
}

async fn release(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
    body: axum::body::Bytes,
) -> Result<Json<flotilla_api::ReleaseAnswer>, ApiError> {
    let (name, running) = holder(&state, &name, id)?;
    let p = &running.handle;
    let body: flotilla_api::ReleaseRequest = parse_body(&body)?;
    let instance = acquired_instance(p, id).unwrap_or_default();
    let broken = body.instance_broken.is_some();
    match body.instance_broken {
        Some(cause) => {
            let cause: String = cause
                .chars()
                .filter(|c| !c.is_control())
                .take(500)
                .collect();
            p.release_broken(id, &cause)?;
        }
        None => p.release(id)?,
    }
    tracing::info!(pool = %name, plugin_digest = %running.plugin_digest, lease = id, instance = %instance, broken, "lease released");
    Ok(Json(flotilla_api::ReleaseAnswer {
        pool: name,
        lease: id,
        released: true,
    }))
}

/// Renews a lease's TTL (pools with `lease_ttl`): `{"expires_at": <ms since the epoch>}`.
async fn renew(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
) -> Result<Json<flotilla_api::RenewAnswer>, ApiError> {
    let (name, running) = holder(&state, &name, id)?;
    let p = running.handle.clone();
    match p.renew(id)? {
        Some(until) => Ok(Json(flotilla_api::RenewAnswer {
            pool: name,
            lease: id,
            expires_at: until,
        })),
        None => Err(ApiError::new(
            ErrorCode::NoTtl,
            format!("pool {name} has no lease_ttl; leases need no renewal"),
        )),
    }
}

/// A duration a client reports: finite, not negative, at most a week.
fn seconds(name: &str, v: f64) -> Result<f64, ApiError> {
    if v.is_finite() && (0.0..=604_800.0).contains(&v) {
        Ok(v)
    } else {
        Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("{name}: expected seconds between 0 and 604800"),
        ))
    }
}

/// A lease holder's report on its job (`POST .../leases/{id}/report`), counted in the metrics.
/// Only an acquired lease may report.
async fn report(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
    body: axum::body::Bytes,
) -> Result<Json<flotilla_api::ReportAnswer>, ApiError> {
    let (name, running) = holder(&state, &name, id)?;
    let p = running.handle.clone();
    let body: flotilla_api::ReportRequest = parse_body(&body)?;
    acquired_instance(&p, id)?;
    if let Some(s) = body.job_started {
        let prepare = seconds("job_started.prepare_seconds", s.prepare_seconds)?;
        let pull = seconds("job_started.pull_seconds", s.pull_seconds)?;
        state.metrics.job_started(&name, prepare, pull);
    }
    if let Some(f) = body.job_finished {
        state.metrics.job_finished(&name, f.outcome);
    }
    Ok(Json(flotilla_api::ReportAnswer {
        pool: name,
        lease: id,
        reported: true,
    }))
}

async fn unreserve(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
) -> Result<Json<flotilla_api::UnreserveAnswer>, ApiError> {
    let (name, running) = holder(&state, &name, id)?;
    let p = running.handle.clone();
    p.unreserve(id)?;
    tracing::info!(pool = %name, lease = id, "lease unreserved");
    Ok(Json(flotilla_api::UnreserveAnswer {
        pool: name,
        lease: id,
        unreserved: true,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// The rows of docs/api.md's endpoint table: each method (`any method` as GET) and path,
    /// with `{pool}`, `{id}` and `...` filled in.
    fn documented() -> Vec<(String, String)> {
        let page = include_str!("../../../../docs/api.md");
        let table = page
            .split("## Endpoints")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .unwrap_or_default();
        let mut rows = Vec::new();
        for line in table.lines().filter(|l| l.starts_with("| ")) {
            let cell = line.split('|').nth(1).unwrap_or_default().trim();
            // `any method, `PATH`` is one endpoint; other cells list `METHOD PATH`s.
            let cell = match cell.strip_prefix("any method, ") {
                Some(path) => format!("`GET {}`", path.trim_matches('`')),
                None => cell.to_string(),
            };
            for endpoint in cell.split(", ") {
                let endpoint = endpoint.trim().trim_matches('`');
                let Some((method, path)) = endpoint.split_once(' ') else {
                    continue;
                };
                let path = path
                    .replace("{pool}", "nosuchpool")
                    .replace("{id}", "1")
                    .replace("...", "version");
                rows.push((method.to_string(), path));
            }
        }
        rows
    }

    /// Every endpoint docs/api.md lists is one the server routes, with that method: none
    /// answers the router's fallback (`not_found`, "no such endpoint") or 405. A row for a
    /// route that does not exist, or a method the route does not take, fails here.
    #[tokio::test]
    async fn every_documented_endpoint_is_routed() {
        let rows = documented();
        assert!(rows.len() >= 18, "the table was not read: {rows:?}");
        let state = Arc::new(AppState {
            pools: crate::pools::Pools::running([]),
            token: None,
            sd_token: None,
            operators: Vec::new(),
            metrics: Metrics::new().expect("metrics"),
            draining: std::sync::atomic::AtomicBool::new(false),
        });
        let app = router(state);
        let ask = |method: &str, path: &str| {
            let request = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::empty())
                .expect("a request");
            let app = app.clone();
            async move {
                let answer = app.oneshot(request).await.expect("an answer");
                let status = answer.status();
                let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
                    .await
                    .unwrap_or_default();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };
        for (method, path) in &rows {
            let (status, body) = ask(method, path).await;
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert!(
                !body.contains("no such endpoint"),
                "{method} {path}: {status} {body}"
            );
        }
        // The check can fail: a path the server does not have gets the fallback.
        let (status, body) = ask("GET", "/v1/nosuchroute").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("no such endpoint"), "{body}");
    }
}
