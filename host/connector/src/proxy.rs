//! Docker Engine on a leased instance, served by the host: a job runner sends Docker API
//! requests to the host's lease API, and each one is forwarded over the instance's SSH session
//! to the engine's unix socket (or over TLS with the pool's client certificate, for
//! `docker-tls` instances). The runner never holds the pool's key or certificate. Upgraded
//! connections (`attach`, `exec` start with `Upgrade: tcp`) are spliced both ways once the
//! engine switches protocols. Every channel is tied to its lease's token and cut when the
//! lease ends (see [`crate::channels`]).
//!
//! The request goes on as the caller sent it: its path and query byte for byte (never
//! decoded and encoded again), its headers without the hop-by-hop ones of RFC 9110 §7.6.1
//! and without the caller's credentials for the host.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::channels::LeaseBody;
use crate::docker::{HOST, Route};
use crate::idle::{EngineBody, EngineSender, IdleEngines};

/// Why a request could not be forwarded to the engine.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The pool does not check Docker (`docker = false`), so there is no socket to reach.
    #[error("the pool's connector does not use Docker (docker = false)")]
    NoDocker,
    /// The instance is not reached over SSH (`docker-tls`), so there is no shell to run in.
    #[error("instance {instance} is not reached over SSH, so the host cannot run commands there")]
    NoShell {
        /// The instance.
        instance: String,
    },
    /// SSH or the engine failed.
    #[error("instance {instance}: {why}")]
    Unreachable {
        /// The instance.
        instance: String,
        /// What failed.
        why: String,
    },
    /// The lease ended while the request was on its way.
    #[error("the lease ended; the request to instance {instance} was cut")]
    LeaseEnded {
        /// The instance.
        instance: String,
    },
}

/// Request headers that must not reach the instance: the caller's credentials for the host's
/// API, and proxy-only headers.
const STRIPPED: [http::HeaderName; 3] = [
    http::header::AUTHORIZATION,
    http::header::PROXY_AUTHORIZATION,
    http::header::COOKIE,
];

/// The hop-by-hop fields of RFC 9110 §7.6.1 (and the obsolete ones proxies still meet):
/// they describe one connection, so a proxy never forwards them. `Upgrade` is set again
/// for the engine when the caller asked to switch protocols, since the proxy splices the
/// upgraded streams itself.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
];

/// Removes the hop-by-hop fields, including every field the `Connection` header names;
/// the `Upgrade` protocol the caller asked for, if it asked.
pub(crate) fn strip_hop_by_hop(headers: &mut http::HeaderMap) -> Option<http::HeaderValue> {
    let named: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let upgrade = headers
        .get(http::header::UPGRADE)
        .filter(|_| named.iter().any(|t| t == "upgrade"))
        .cloned();
    for name in named.iter().map(String::as_str).chain(HOP_BY_HOP) {
        headers.remove(name);
    }
    upgrade
}

/// One lease's side of a forwarded request: its id, its channels' token (everything the
/// request opens ends when it is cancelled), and the engine connections it keeps.
pub(crate) struct ForLease<'a> {
    /// The lease.
    id: u64,
    /// Its channels' token.
    token: CancellationToken,
    /// The pool's idle engine connections.
    idle: &'a Arc<IdleEngines>,
}

impl<'a> ForLease<'a> {
    /// Lease `id`, its channels' `token` and the pool's `idle` connections.
    pub(crate) fn new(id: u64, token: CancellationToken, idle: &'a Arc<IdleEngines>) -> Self {
        ForLease { id, token, idle }
    }
}

/// Sends `request` (origin-form URI) to the engine over one of the lease's idle connections
/// ([`crate::idle`]), or a new stream of `route`; everything it opens ends when the lease's
/// token is cancelled. A connection whose answer is read to its end is kept for the lease's
/// next request, unless it was upgraded.
pub(crate) async fn forward<B>(
    route: &Route,
    instance: &str,
    mut request: http::Request<B>,
    lease: ForLease<'_>,
) -> Result<http::Response<LeaseBody<Incoming>>, ForwardError>
where
    B: Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // Taken before the request moves on: the caller's side of an upgrade, if it asks for one,
    // and what must live as long as the upgraded stream.
    let caller = hyper::upgrade::on(&mut request);
    let guard = request.extensions_mut().remove::<StreamGuard>();
    let upgrading = for_engine(request.headers_mut());
    let request = request.map(|body| body.map_err(Into::into).boxed_unsync());
    let (mut response, sender) = tokio::select! {
        answer = exchange(route, instance, &lease, request) => answer?,
        () = lease.token.cancelled() => {
            return Err(ForwardError::LeaseEnded { instance: instance.to_string() });
        }
    };
    let switching = response.status() == http::StatusCode::SWITCHING_PROTOCOLS;
    let protocol = strip_hop_by_hop(response.headers_mut());
    if switching {
        if let Some(protocol) = protocol {
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("Upgrade"),
            );
            headers.insert(http::header::UPGRADE, protocol);
        }
        let engine = hyper::upgrade::on(&mut response);
        splice(
            instance.to_string(),
            caller,
            engine,
            lease.token.clone(),
            guard,
        );
    }
    let body = |body| {
        let read = LeaseBody::new(body, lease.token.clone());
        if upgrading || switching {
            return read;
        }
        // Kept for the lease's next request once its answer is read to the end.
        let (id, token, idle) = (lease.id, lease.token.clone(), lease.idle.clone());
        read.when_read(move || idle.keep(id, sender, &token))
    };
    Ok(response.map(body))
}

/// Makes a caller's request headers the engine's: without the caller's credentials for the
/// host and the hop-by-hop fields, with the upgrade the caller asked for (if it asked) and
/// the engine's `Host`. Whether the request asks to switch protocols.
fn for_engine(headers: &mut http::HeaderMap) -> bool {
    for name in STRIPPED {
        headers.remove(name);
    }
    let upgrading = match strip_hop_by_hop(headers) {
        Some(protocol) => {
            headers.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("Upgrade"),
            );
            headers.insert(http::header::UPGRADE, protocol);
            true
        }
        None => false,
    };
    headers.insert(http::header::HOST, http::HeaderValue::from_static(HOST));
    upgrading
}

/// Sends `request` on the lease's most recently kept connection that takes it, or on a new
/// stream of `route`; the answer, and the connection's sender (to keep it afterwards).
async fn exchange(
    route: &Route,
    instance: &str,
    lease: &ForLease<'_>,
    mut request: http::Request<EngineBody>,
) -> Result<(http::Response<Incoming>, EngineSender), ForwardError> {
    let failed = |why: String| ForwardError::Unreachable {
        instance: instance.to_string(),
        why,
    };
    while let Some(mut kept) = lease.idle.take(lease.id) {
        // Kept as its answer was read: its connection turns idle a moment later.
        if !matches!(
            tokio::time::timeout(READY_WAIT, kept.ready()).await,
            Ok(Ok(()))
        ) {
            continue;
        }
        match kept.try_send_request(request).await {
            Ok(response) => return Ok((response, kept)),
            Err(mut e) => match e.take_message() {
                // The connection closed before the request went out: the next one.
                Some(unsent) => request = unsent,
                None => return Err(failed(format!("Docker Engine: {}", e.into_error()))),
            },
        }
    }
    let stream = route.open().await.map_err(failed)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(format!("Docker Engine: {e}")))?;
    tokio::spawn(async move {
        // Ends when its sender is dropped (it is not kept, or its lease ended) with no answer
        // left to read, or with the upgraded stream; errors reach the caller as a truncated
        // body.
        let _ = connection.with_upgrades().await;
    });
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| failed(format!("Docker Engine: {e}")))?;
    Ok((response, sender))
}

/// How long a kept connection may take to turn idle after its last answer was read.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Something a request to the Docker handle carries that must live as long as the stream it
/// opens: dropped when an upgraded stream (exec, attach) ends, or when the request is answered
/// without one. The host logs an operator's terminal session's end this way.
#[derive(Clone)]
pub struct StreamGuard(pub std::sync::Arc<dyn Send + Sync>);

/// Copies both ways between the caller's and the engine's upgraded connections until either
/// closes or the lease ends; `guard` goes with them.
fn splice(
    instance: String,
    caller: hyper::upgrade::OnUpgrade,
    engine: hyper::upgrade::OnUpgrade,
    lease: CancellationToken,
    guard: Option<StreamGuard>,
) {
    tokio::spawn(async move {
        let _guard = guard;
        let joined = tokio::select! {
            joined = async { tokio::join!(caller, engine) } => joined,
            () = lease.cancelled() => return,
        };
        match joined {
            (Ok(caller), Ok(engine)) => {
                let (mut a, mut b) = (TokioIo::new(caller), TokioIo::new(engine));
                tokio::select! {
                    copied = tokio::io::copy_bidirectional(&mut a, &mut b) => {
                        if let Err(e) = copied {
                            tracing::debug!(instance, "upgraded Docker stream ended: {e}");
                        }
                    }
                    () = lease.cancelled() => {
                        tracing::info!(instance, "the lease ended: its upgraded Docker stream is closed");
                    }
                }
            }
            (caller, engine) => tracing::warn!(
                instance,
                caller_ok = caller.is_ok(),
                engine_ok = engine.is_ok(),
                "a Docker upgrade could not be completed"
            ),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_and_the_ones_connection_names_are_dropped() {
        let mut headers = http::HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, X-Secret-Hop, Upgrade"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "tcp"),
            ("content-type", "application/json"),
        ] {
            headers.append(
                http::HeaderName::from_static(name),
                http::HeaderValue::from_static(value),
            );
        }
        let upgrade = strip_hop_by_hop(&mut headers);
        assert_eq!(upgrade.as_ref().and_then(|v| v.to_str().ok()), Some("tcp"));
        let left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-type"]);
    }

    #[test]
    fn an_upgrade_header_without_connection_upgrade_is_not_an_upgrade() {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::UPGRADE, http::HeaderValue::from_static("tcp"));
        assert_eq!(strip_hop_by_hop(&mut headers), None);
        assert!(headers.is_empty());
    }
}
