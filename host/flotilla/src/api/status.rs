//! The process's and the pools' state: `/v1/pools`, a pool's instances, `/metrics` and
//! `/readyz`.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flotilla_api::status::{
    InstanceView, InstancesAnswer, NotReady, PoolsAnswer, Readiness, ReadyAnswer,
};

use super::{ApiError, Shared, running};
use crate::pools::instance_state;

pub(super) async fn pools(State(state): State<Shared>) -> Json<PoolsAnswer> {
    Json(PoolsAnswer {
        pools: state.pools.status(),
    })
}

/// Every instance of a pool: state, where the host reaches it (while it has a session to
/// it), when it became ready, slots and uses, and the last readiness or ping error.
pub(super) async fn instances(
    State(state): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<InstancesAnswer>, ApiError> {
    let running = running(&state, &name)?;
    let (p, connector) = (&running.handle, running.connector.as_ref());
    let views = p.with_core(|c| c.instances());
    let instances = views
        .into_iter()
        .map(|v| InstanceView {
            address: connector.and_then(|c| c.address(&v.id)),
            failures: v.failures,
            last_error: v.last_error,
            ready_since: v.ready_since,
            seen_at: v.seen_at,
            slots_used: v.slots_used,
            state: instance_state(v.state),
            tenant: v.tenant,
            use_count: v.use_count,
            id: v.id,
        })
        .collect();
    Ok(Json(InstancesAnswer {
        instances,
        pool: name,
    }))
}

pub(super) async fn metrics(State(state): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

pub(super) async fn readyz(State(state): State<Shared>) -> Response {
    let mut pools = state.pools.not_ready();
    if state.draining.load(Ordering::Relaxed) {
        pools.insert("(process)".into(), NotReady::Process("draining".into()));
    }
    let (code, status) = match pools.is_empty() {
        true => (StatusCode::OK, Readiness::Ready),
        false => (StatusCode::SERVICE_UNAVAILABLE, Readiness::NotReady),
    };
    (code, Json(ReadyAnswer { pools, status })).into_response()
}
