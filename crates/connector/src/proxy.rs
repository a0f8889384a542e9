//! Docker Engine on a leased instance, served by the host: a job runner sends Docker API
//! requests to the host's lease API, and each one is forwarded over the instance's SSH session
//! to the engine's unix socket (or over TLS with the pool's client certificate, for
//! `docker-tls` instances). The runner never holds the pool's key or certificate. Upgraded connections (`attach`, `exec` start with `Upgrade: tcp`) are spliced both
//! ways once the engine switches protocols.

use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;

use crate::docker::{HOST, Route};

/// Why a request could not be forwarded to the engine.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The pool does not check Docker (`docker = false`), so there is no socket to reach.
    #[error("the pool's connector does not use Docker (docker = false)")]
    NoDocker,
    /// SSH or the engine failed.
    #[error("instance {instance}: {why}")]
    Unreachable {
        /// The instance.
        instance: String,
        /// What failed.
        why: String,
    },
}

/// Request headers that must not reach the instance: the caller's credentials for the host's
/// API, and proxy-only headers.
const STRIPPED: [http::HeaderName; 3] = [
    http::header::AUTHORIZATION,
    http::header::PROXY_AUTHORIZATION,
    http::header::COOKIE,
];

/// Sends `request` (origin-form URI) to the engine over a new stream of `route`.
pub(crate) async fn forward<B>(
    route: &Route,
    instance: &str,
    mut request: http::Request<B>,
) -> Result<http::Response<Incoming>, ForwardError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let failed = |why: String| ForwardError::Unreachable {
        instance: instance.to_string(),
        why,
    };
    // Taken before the request moves on: the caller's side of an upgrade, if it asks for one.
    let caller = hyper::upgrade::on(&mut request);
    let headers = request.headers_mut();
    for name in STRIPPED {
        headers.remove(name);
    }
    headers.insert(http::header::HOST, http::HeaderValue::from_static(HOST));
    let stream = route.open().await.map_err(failed)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(format!("Docker Engine: {e}")))?;
    tokio::spawn(async move {
        // Ends with the response body or the upgraded stream; errors reach the caller as a
        // truncated body.
        let _ = connection.with_upgrades().await;
    });
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|e| failed(format!("Docker Engine: {e}")))?;
    if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        let engine = hyper::upgrade::on(&mut response);
        let instance = instance.to_string();
        tokio::spawn(async move {
            match tokio::join!(caller, engine) {
                (Ok(caller), Ok(engine)) => {
                    let (mut a, mut b) = (TokioIo::new(caller), TokioIo::new(engine));
                    if let Err(e) = tokio::io::copy_bidirectional(&mut a, &mut b).await {
                        tracing::debug!(instance, "upgraded Docker stream ended: {e}");
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
    Ok(response)
}
