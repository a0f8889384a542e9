//! Docker Engine on an instance, through whichever stream reaches it: a `direct-streamlocal`
//! channel of the instance's SSH session to the remote unix socket (no port is opened on the
//! instance and nothing but the host holds the key), or a TLS connection with the pool's client
//! certificate for `docker-tls` instances. Every HTTP connection bollard makes is one new
//! stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bollard::{API_DEFAULT_VERSION, BollardRequest, Docker};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::ssh::Session;
use crate::tls::DockerTls;

/// The Host header sent to the engine (Docker over a socket ignores it, but HTTP/1.1 needs one).
pub(crate) const HOST: &str = "docker.flotilla.invalid";

/// A byte stream to an engine.
pub(crate) trait EngineStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> EngineStream for T {}

/// A boxed stream to an engine, or why none could be opened.
type Opened = Pin<Box<dyn Future<Output = Result<Box<dyn EngineStream>, String>> + Send>>;

/// Opens a new stream to one instance's engine.
#[derive(Clone)]
pub(crate) enum Route {
    /// A channel to `socket` over the instance's SSH session.
    Ssh {
        /// The kept session.
        session: Arc<Session>,
        /// The engine's socket on the instance.
        socket: String,
    },
    /// TLS to `host:port` with the pool's client certificate.
    Tls {
        /// The pool's TLS configuration.
        tls: DockerTls,
        /// The engine's address.
        host: String,
        /// Its port.
        port: u16,
        /// Connect and handshake deadline.
        limit: Duration,
    },
}

impl Route {
    /// A new stream to the engine.
    pub(crate) fn open(&self) -> Opened {
        let route = self.clone();
        Box::pin(async move {
            match route {
                Route::Ssh { session, socket } => session
                    .open_unix_socket(&socket)
                    .await
                    .map(|s| Box::new(s) as Box<dyn EngineStream>)
                    .map_err(|e| e.to_string()),
                Route::Tls {
                    tls,
                    host,
                    port,
                    limit,
                } => tls
                    .connect(&host, port, limit)
                    .await
                    .map(|s| Box::new(s) as Box<dyn EngineStream>),
            }
        })
    }
}

/// A bollard client whose transport is a new stream of `route` per connection.
pub(crate) fn client(route: Route, timeout: Duration) -> Result<Docker, String> {
    let transport = move |request: BollardRequest| {
        let opened = route.open();
        async move {
            let (mut parts, body) = request.into_parts();
            // bollard builds absolute URIs; a raw HTTP/1 connection wants origin-form.
            if let Some(path) = parts.uri.path_and_query().cloned() {
                parts.uri = path.into();
            }
            parts
                .headers
                .insert(http::header::HOST, http::HeaderValue::from_static(HOST));
            let stream = opened.await.map_err(std::io::Error::other)?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                // The connection ends with the request or the stream; exec and attach need
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
