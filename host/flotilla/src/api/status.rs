//! The process's and the pools' state: `/v1/pools`, a pool's instances, `/metrics` and
//! `/readyz`.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flotilla_api::status::{
    InstanceState, InstanceView, InstancesAnswer, NotReady, Paused, PoolStatus, PoolsAnswer,
    Readiness, ReadyAnswer, Restart, ScalerStatus, Slots,
};
use flotilla_scaler::{InstState, PoolSnapshot};

use super::{ApiError, Shared, running};

pub(super) async fn pools(State(state): State<Shared>) -> Json<PoolsAnswer> {
    Json(PoolsAnswer {
        pools: state.pools.status(),
    })
}

/// A running pool's state as `GET /v1/pools` shows it.
pub(crate) fn pool_status(s: &PoolSnapshot) -> PoolStatus {
    let instances = InstState::ALL.map(|st| (instance_state(st), s.instances.get(st.name())));
    let paused = s.paused.iter().map(|(call, p)| {
        let paused = Paused {
            reason: p.reason.clone(),
            retry_at: p.retry_at,
        };
        (call.to_string(), paused)
    });
    let scaler = ScalerStatus {
        acquires_waiting: s.acquires_waiting,
        capacity_per_instance: s.capacity_per_instance,
        desired: s.desired,
        instances: instances
            .into_iter()
            .map(|(st, n)| (st, n.copied().unwrap_or(0)))
            .collect(),
        last_error: s.last_error.clone(),
        max_instances: s.max_instances,
        paused: paused.collect(),
        pending: s.pending,
        restart: Restart {
            adopted_after_ms: s.restart.adopted_after_ms,
            instances_adopted: s.restart.instances_adopted,
            leases_expired: s.restart.leases_expired,
            leases_lost: s.restart.leases_lost,
            leases_restored: s.restart.leases_restored,
        },
        slots: Slots {
            acquired: s.slots.acquired,
            idle: s.slots.idle,
            reserved: s.slots.reserved,
            unavailable: s.slots.unavailable,
        },
    };
    PoolStatus {
        health: crate::pools::health_view(&s.health),
        scaler: Some(scaler),
    }
}

fn instance_state(s: InstState) -> InstanceState {
    match s {
        InstState::Creating => InstanceState::Creating,
        InstState::Running => InstanceState::Running,
        InstState::Ready => InstanceState::Ready,
        InstState::Draining => InstanceState::Draining,
        InstState::Deleting => InstanceState::Deleting,
        InstState::Failed => InstanceState::Failed,
    }
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
