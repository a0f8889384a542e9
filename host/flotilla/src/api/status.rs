//! The process's and the pools' state: `/v1/pools`, a pool's instances, `/metrics` and
//! `/readyz`.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{ApiError, Shared, running};

pub(super) async fn pools(State(state): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({ "pools": state.pools.status() }))
}

/// Every instance of a pool: state, where the host reaches it (while it has a session to
/// it), when it became ready, slots and uses, and the last readiness or ping error.
pub(super) async fn instances(
    State(state): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let running = running(&state, &name)?;
    let (p, connector) = (&running.handle, running.connector.as_ref());
    let views = p.with_core(|c| c.instances());
    let list: Vec<serde_json::Value> = views
        .into_iter()
        .map(|v| {
            let address = connector.and_then(|c| c.address(&v.id));
            let mut entry = json!(v);
            if let Some(map) = entry.as_object_mut() {
                map.insert("address".into(), json!(address));
            }
            entry
        })
        .collect();
    Ok(Json(json!({ "pool": name, "instances": list })))
}

pub(super) async fn metrics(State(state): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

pub(super) async fn readyz(State(state): State<Shared>) -> Response {
    let mut not_ready = state.pools.not_ready();
    if state.draining.load(Ordering::Relaxed) {
        not_ready.insert("(process)".into(), json!("draining"));
    }
    if not_ready.is_empty() {
        (StatusCode::OK, Json(json!({"status": "ready"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not-ready", "pools": not_ready})),
        )
            .into_response()
    }
}
