//! Docker Engine on an instance, reached through the instance's SSH session: every HTTP
//! connection bollard makes is one `direct-streamlocal` channel to the remote unix socket, so
//! no port is opened on the instance and nothing but the host holds the key.

use std::sync::Arc;
use std::time::Duration;

use bollard::{API_DEFAULT_VERSION, BollardRequest, Docker};
use hyper_util::rt::TokioIo;

use crate::ssh::Session;

/// The Host header sent to the engine (Docker over a socket ignores it, but HTTP/1.1 needs one).
const HOST: &str = "docker.flotilla.invalid";

/// A bollard client whose transport is the SSH session's channels to `socket`.
pub(crate) fn over_ssh(
    session: Arc<Session>,
    socket: String,
    timeout: Duration,
) -> Result<Docker, String> {
    let transport = move |request: BollardRequest| {
        let session = session.clone();
        let socket = socket.clone();
        async move {
            let (mut parts, body) = request.into_parts();
            // bollard builds absolute URIs; a raw HTTP/1 connection wants origin-form.
            if let Some(path) = parts.uri.path_and_query().cloned() {
                parts.uri = path.into();
            }
            parts
                .headers
                .insert(http::header::HOST, http::HeaderValue::from_static(HOST));
            let stream = session
                .open_unix_socket(&socket)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                // The connection ends with the request or the channel; exec and attach need
                // upgrades. Its error, if any, reaches the caller through `send_request`.
                let _ = connection.with_upgrades().await;
            });
            Ok::<_, bollard::errors::Error>(
                sender
                    .send_request(http::Request::from_parts(parts, body))
                    .await?,
            )
        }
    };
    Docker::connect_with_custom_transport(
        transport,
        Some(format!("http://{HOST}")),
        timeout.as_secs().max(1),
        API_DEFAULT_VERSION,
    )
    .map_err(|e| e.to_string())
}

/// `/_ping` alone: the cheap liveness probe of a ready instance.
pub(crate) async fn ping(docker: Docker) -> Result<(), String> {
    docker
        .ping()
        .await
        .map(|_| ())
        .map_err(|e| format!("Docker Engine /_ping failed: {e}"))
}

/// Negotiates the API version, then checks `/_ping` and `/version`; the engine's version on
/// success.
pub(crate) async fn check(docker: Docker) -> Result<String, String> {
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|e| format!("Docker Engine does not answer: {e}"))?;
    docker
        .ping()
        .await
        .map_err(|e| format!("Docker Engine /_ping failed: {e}"))?;
    let version = docker
        .version()
        .await
        .map_err(|e| format!("Docker Engine /version failed: {e}"))?;
    Ok(version.version.unwrap_or_else(|| "unknown".to_string()))
}
