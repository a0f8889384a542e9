//! The lease's Docker handle: Docker Engine API requests forwarded to the instance of an
//! acquired lease over the host's SSH session, the refusal of privileged containers and execs
//! in pools that do not allow them (the body read as Docker's Go decoder reads it), and the
//! watch that cuts a lease's streams when the lease ends.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::Response;
use flotilla_connector::ForwardError;
use flotilla_scaler::{LeaseState, PoolHandle};

use super::shell::{TERMINAL_HEADER, TerminalSession, UpgradedStream, stream_permit};
use super::{ApiError, Caller, ErrorCode, LeasePath, Shared, acquired_instance, holder};
use crate::pools::RunningPool;

/// The Docker API path of a request to `/v1/pools/{pool}/leases/{id}/docker/...`, exactly as
/// the caller sent it (still percent-encoded), with its query: routing decodes path
/// parameters, and a decoded `%3F`, `%23` or `%25` would change what the engine is asked.
fn raw_docker_path(uri: &axum::http::Uri) -> Option<String> {
    // "", "v1", "pools", pool, "leases", id, "docker", then the Docker path.
    let rest = uri.path().splitn(8, '/').nth(7)?;
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    Some(format!("/{rest}{query}"))
}

/// Forwards a Docker Engine API request to the instance of an acquired lease (see
/// [`DockerHandle`]). Only while the lease is acquired; the bearer token is not forwarded,
/// and every stream it opens is cut when the lease ends ([`watch_lease_channels`]).
pub(super) async fn docker(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (name, running) = holder(&state, &name, id)?;
    let p = &running.handle;
    let instance = acquired_instance(p, id)?;
    let connector = running.connector.as_ref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NoDocker,
            format!("pool {name} has no [pool.connector]; the host serves no Docker API for it"),
        )
    })?;
    let (mut parts, body) = request.into_parts();
    let body = privileged_refused(&parts, body, connector.allows_privileged(), &name).await?;
    let said = parts.headers.remove(TERMINAL_HEADER);
    if parts.headers.contains_key(header::UPGRADE) {
        // An upgraded stream outlives its connection's slot: it has a bound of its own.
        let permit = stream_permit(&parts.extensions)?;
        let caller = parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or(Caller::Api);
        // A terminal says so; any stream an operator's token opens is one too.
        let session = (said.is_some() || caller != Caller::Api).then(|| {
            let job = p.with_core(|c| c.lease(id).map(|l| l.labels.clone()));
            TerminalSession::open(
                said.as_ref(),
                &caller,
                &name,
                id,
                &instance,
                job.unwrap_or_default(),
            )
        });
        let stream = UpgradedStream {
            _permit: permit,
            _session: session,
            _open: state.metrics.docker_stream_opened(),
        };
        parts
            .extensions
            .insert(flotilla_connector::StreamGuard(Arc::new(stream)));
    }
    let path = raw_docker_path(&parts.uri);
    parts.uri = path.as_deref().unwrap_or("").parse().map_err(|_| {
        ApiError::new(
            ErrorCode::NotFound,
            format!("{:?} is not a Docker API path", parts.uri.path()),
        )
    })?;
    let forwarded = connector
        .forward_docker(
            p.provider().as_ref(),
            &instance,
            id,
            axum::http::Request::from_parts(parts, body),
        )
        .await
        .map_err(ApiError::from)?;
    Ok(forwarded.map(axum::body::Body::new))
}

/// The largest container-create body the host reads to check it (an engine takes far less:
/// the job's variables are the biggest part).
const CREATE_BODY_LIMIT: usize = 8 << 20;

/// A container create (`POST /[v1.NN/]containers/create`) or an exec create
/// (`POST /[v1.NN/]containers/{id}/exec`) asking for privileges is refused unless the pool
/// allows them: the driver's `--privileged` is the job runner's wish, `allow_privileged` the
/// fleet operator's consent. The request is read as the engine reads it: the path
/// percent-decoded, and the body's keys matched case-insensitively with Go's folding
/// (`hostconfig`, `PRIVILEGED` and `Hoſtconfig` are all `HostConfig` to `encoding/json`). A
/// body this side cannot read is refused rather than passed on. Other requests pass
/// untouched, their bodies still streaming.
async fn privileged_refused(
    parts: &axum::http::request::Parts,
    body: axum::body::Body,
    allowed: bool,
    pool: &str,
) -> Result<axum::body::Body, ApiError> {
    let route = if parts.method == axum::http::Method::POST {
        raw_docker_path(&parts.uri).and_then(|p| privileged_route(&p))
    } else {
        None
    };
    let Some(route) = route.filter(|_| !allowed) else {
        return Ok(body);
    };
    let bytes = axum::body::to_bytes(body, CREATE_BODY_LIMIT)
        .await
        .map_err(|e| {
            ApiError::new(
                ErrorCode::BadRequest,
                format!("container create body: {e} (at most {CREATE_BODY_LIMIT} bytes)"),
            )
        })?;
    let asked: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            ErrorCode::BadRequest,
            format!("the {route} body is not JSON this host can check: {e}"),
        )
    })?;
    let privileged = |config: &serde_json::Value| {
        go_fields(config, "Privileged").any(|v| v.as_bool() == Some(true))
    };
    let asks = match route {
        PrivilegedRoute::Create => go_fields(&asked, "HostConfig").any(privileged),
        PrivilegedRoute::Exec => privileged(&asked),
    };
    if asks {
        return Err(ApiError::new(
            ErrorCode::NotAllowed,
            format!(
                "pool {pool} does not allow privileged containers; set allow_privileged = true in its [pool.connector] to let jobs run them (they can then take over the machine)"
            ),
        ));
    }
    Ok(axum::body::Body::from(bytes))
}

/// The Docker routes whose body can ask for privileges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrivilegedRoute {
    /// `POST /containers/create`: `HostConfig.Privileged`.
    Create,
    /// `POST /containers/{id}/exec`: `Privileged`.
    Exec,
}

impl std::fmt::Display for PrivilegedRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Create => "container create",
            Self::Exec => "exec create",
        })
    }
}

/// Which privileged route a Docker path (as sent, query included) names, after the decoding
/// and cleaning the engine's router does: percent-decoding, empty and `.` segments dropped,
/// `..` applied, an optional `/v1.NN` prefix.
fn privileged_route(raw: &str) -> Option<PrivilegedRoute> {
    let path = raw.split('?').next().unwrap_or_default();
    let decoded = percent_decoded(path);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let versioned = segments.first().is_some_and(|v| {
        v.strip_prefix('v')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
    });
    let rest = if versioned {
        segments.get(1..).unwrap_or_default()
    } else {
        &segments[..]
    };
    match rest {
        ["containers", "create"] => Some(PrivilegedRoute::Create),
        ["containers", _, "exec"] => Some(PrivilegedRoute::Exec),
        _ => None,
    }
}

/// `%XX` escapes decoded (an invalid escape stays as it is, as Go's router leaves it).
fn percent_decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = |at: usize| bytes.get(at).and_then(|c| (*c as char).to_digit(16));
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                // Two hex digits make at most 255.
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The values of an object's keys that Go's `encoding/json` would decode into the field
/// `name`: keys equal under Unicode simple case folding, where `ſ` (U+017F) is an `s` and the
/// Kelvin sign (U+212A) a `k`.
fn go_fields<'a>(
    object: &'a serde_json::Value,
    name: &'a str,
) -> impl Iterator<Item = &'a serde_json::Value> + 'a {
    let fold = |c: char| match c {
        '\u{17F}' => 's',
        '\u{212A}' => 'k',
        c => c.to_ascii_lowercase(),
    };
    object
        .as_object()
        .into_iter()
        .flatten()
        .filter(move |(key, _)| key.chars().map(fold).eq(name.chars().map(fold)))
        .map(|(_, value)| value)
}

/// A failure to reach the lease's machine, with its stable code.
impl From<ForwardError> for ApiError {
    fn from(e: ForwardError) -> Self {
        let code = match e {
            ForwardError::NoDocker => ErrorCode::NoDocker,
            ForwardError::NoShell { .. } => ErrorCode::NoShell,
            ForwardError::Unreachable { .. } => ErrorCode::InstanceUnreachable,
            ForwardError::LeaseEnded { .. } => ErrorCode::LeaseEnded,
        };
        ApiError::new(code, e.to_string())
    }
}

/// Whether lease `id` is acquired (bound, or restored and waiting to be bound again).
fn is_acquired(p: &PoolHandle, id: u64) -> bool {
    p.with_core(|c| {
        c.lease(id)
            .is_some_and(|l| matches!(l.state, LeaseState::Acquired { .. }))
    })
}

/// How often the lease channels are checked even when the pool signals no change (a TTL or
/// `max_job_duration` expiry is found by the pool's own timer).
const CHANNEL_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// Cuts the Docker channels of every lease that is no longer acquired (released,
/// unreserved, failed, expired, or released as broken), and closes the engine connections
/// kept idle too long. Runs for the pool's life.
pub async fn watch_lease_channels(pool: std::sync::Weak<RunningPool>) {
    loop {
        let Some(running) = pool.upgrade() else {
            return;
        };
        let Some(connector) = running.connector.clone() else {
            return;
        };
        for lease in connector.leases_with_channels() {
            if !is_acquired(&running.handle, lease) {
                connector.end_lease(lease);
                tracing::info!(pool = %running.handle.name, lease, "the lease ended: its Docker channels are closed");
            }
        }
        connector.close_stale_engine_connections();
        let handle = running.handle.clone();
        drop(running);
        tokio::select! {
            () = handle.changed() => {}
            () = tokio::time::sleep(CHANNEL_CHECK) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_privileged_routes_are_found_however_the_path_is_spelled() {
        for (path, route) in [
            ("/containers/create", Some(PrivilegedRoute::Create)),
            (
                "/v1.41/containers/create?name=x",
                Some(PrivilegedRoute::Create),
            ),
            (
                "//v1.44//containers/./create/",
                Some(PrivilegedRoute::Create),
            ),
            ("/containers/%63reate", Some(PrivilegedRoute::Create)),
            ("/v1.41/containers%2Fcreate", Some(PrivilegedRoute::Create)),
            (
                "/images/../containers/create",
                Some(PrivilegedRoute::Create),
            ),
            ("/containers/abc/exec", Some(PrivilegedRoute::Exec)),
            ("/v1.41/containers/abc/%65xec", Some(PrivilegedRoute::Exec)),
            ("/containers/abc/start", None),
            ("/exec/abc/start", None),
            ("/containers/create%3Fx/y", None),
            ("/v/containers/create", None),
        ] {
            assert_eq!(privileged_route(path), route, "{path}");
        }
    }

    #[test]
    fn keys_match_as_gos_encoding_json_matches_them() {
        let body = serde_json::json!({
            "hostconfig": {"PRIVILEGED": true},
            "Hoſtconfig": {"privileged": false},
            "Image": "x",
        });
        let found: Vec<_> = go_fields(&body, "HostConfig").collect();
        assert_eq!(found.len(), 2, "{found:?}");
        let kelvin = serde_json::json!({"\u{212A}ey": 1, "key": 2, "keys": 3});
        assert_eq!(go_fields(&kelvin, "Key").count(), 2);
        assert_eq!(go_fields(&body, "Config").count(), 0);
    }
}
