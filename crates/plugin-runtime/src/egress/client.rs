//! The HTTP client behind the egress hook: keep-alive connections per pool, TLS with the
//! pool's roots, connecting only to addresses the hook already checked, and response bodies
//! with a byte cap and a between-bytes timeout. Policy decisions are not made here.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::EgressPolicy;

/// Idle HTTP/1 connections of one pool's plugin, reused across requests and instances.
///
/// Keyed by scheme, host name and the already-checked address, so reuse never skips the
/// allow-list, the resolution or the address check, which run for every request.
#[derive(Default)]
pub struct ConnectionPool {
    idle: Mutex<HashMap<PoolKey, Vec<(tokio::time::Instant, Sender)>>>,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionPool")
    }
}

type Sender = hyper::client::conn::http1::SendRequest<WasiBody>;
type PoolKey = (bool, String, SocketAddr);
const MAX_IDLE_PER_KEY: usize = 8;
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

impl ConnectionPool {
    async fn take(&self, key: &PoolKey) -> Option<Sender> {
        loop {
            let (at, mut sender) = self.idle.lock().get_mut(key)?.pop()?;
            if sender.is_closed() || at.elapsed() > IDLE_TIMEOUT {
                continue;
            }
            let ready = std::future::poll_fn(|cx| Poll::Ready(sender.poll_ready(cx))).await;
            if let Poll::Ready(Ok(())) = ready {
                return Some(sender);
            }
        }
    }

    fn put(&self, key: PoolKey, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock();
        let list = idle.entry(key).or_default();
        if list.len() < MAX_IDLE_PER_KEY {
            list.push((tokio::time::Instant::now(), sender));
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    pub connect: Duration,
    pub first_byte: Duration,
    pub between_bytes: Duration,
}

/// Reads a whole request body, refusing more than `limit` bytes.
pub(super) async fn collect_limited(body: &mut WasiBody, limit: usize) -> Result<Bytes, HttpError> {
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if out.len() + data.len() > limit {
                return Err(HttpError::HttpRequestBodySize(Some(limit as u64)));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

/// The TLS client of one pool: Web PKI roots plus the pool's extra roots, built once.
pub(super) type TlsCell = OnceLock<Option<Arc<rustls::ClientConfig>>>;

pub(super) fn tls_config(
    policy: &EgressPolicy,
    cell: &TlsCell,
) -> Result<Arc<rustls::ClientConfig>, HttpError> {
    cell.get_or_init(|| {
        let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.into() };
        for cert in &policy.extra_roots {
            if let Err(e) = roots.add(cert.clone()) {
                tracing::warn!(target: "flotilla::egress", "ignoring an unusable extra CA certificate: {e}");
            }
        }
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .ok()
            .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
    })
    .clone()
    .ok_or(HttpError::InternalError(Some("TLS setup failed".into())))
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// Opens a connection to the first reachable checked address (never re-resolving the name).
async fn connect(
    host: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    addrs: &[SocketAddr],
    timeouts: Timeouts,
) -> Result<(Sender, SocketAddr), HttpError> {
    let connect = async {
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok((s, *addr)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
    };
    let (tcp, addr) = match tokio::time::timeout(timeouts.connect, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(HttpError::ConnectionRefused);
        }
        Ok(Err(e)) => return Err(HttpError::Connect(e)),
        Err(_) => return Err(HttpError::ConnectionTimeout),
    };
    // Latency only: a socket that refuses TCP_NODELAY still works.
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Stream> = if let Some(config) = tls {
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|_| HttpError::HttpRequestUriInvalid)?;
        let tls = tokio_rustls::TlsConnector::from(config);
        match tokio::time::timeout(timeouts.connect, tls.connect(name, tcp)).await {
            Ok(Ok(s)) => Box::new(s),
            Ok(Err(e)) => return Err(HttpError::Tls(e)),
            Err(_) => return Err(HttpError::ConnectionTimeout),
        }
    } else {
        Box::new(tcp)
    };
    let (sender, conn) = tokio::time::timeout(
        timeouts.connect,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| HttpError::ConnectionTimeout)??;
    // The connection task ends when the last handle to it is gone.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(target: "flotilla::egress", "connection closed: {e}");
        }
    });
    Ok((sender, addr))
}

/// Sends over a pooled or new connection to the checked addresses.
pub(super) async fn send_pinned(
    mut request: http::Request<WasiBody>,
    host: &str,
    addrs: &[SocketAddr],
    timeouts: Timeouts,
    max_response_bytes: u64,
    pool: &Arc<ConnectionPool>,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<http::Response<WasiBody>, HttpError> {
    let https = tls.is_some();
    let mut reused = None;
    for addr in addrs {
        let key = (https, host.to_string(), *addr);
        if let Some(sender) = pool.take(&key).await {
            reused = Some((sender, key));
            break;
        }
    }
    let (mut sender, key) = match reused {
        Some(r) => r,
        None => {
            let (sender, addr) = connect(host, tls, addrs, timeouts).await?;
            (sender, (https, host.to_string(), addr))
        }
    };
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;
    let response = tokio::time::timeout(timeouts.first_byte, sender.send_request(request))
        .await
        .map_err(|_| HttpError::ConnectionReadTimeout)??;
    let between = timeouts.between_bytes.max(Duration::from_millis(1));
    let reuse = Some((pool.clone(), key, sender));
    let response = response.map(|incoming| {
        CappedBody {
            incoming,
            timer: Box::pin(tokio::time::sleep(between)),
            between,
            left: max_response_bytes,
            cap: max_response_bytes,
            reuse,
        }
        .boxed_unsync()
    });
    Ok(response)
}

/// A response body with a byte cap and a between-bytes timeout.
struct CappedBody {
    incoming: hyper::body::Incoming,
    timer: Pin<Box<tokio::time::Sleep>>,
    between: Duration,
    left: u64,
    cap: u64,
    /// Returned to the pool once the body has been read to the end.
    reuse: Option<(Arc<ConnectionPool>, PoolKey, Sender)>,
}

impl http_body::Body for CappedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => {
                if let Some((pool, key, sender)) = self.reuse.take() {
                    pool.put(key, sender);
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(HttpError::from(e)))),
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                if len > self.left {
                    self.left = 0;
                    return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(self.cap)))));
                }
                self.left -= len;
                let deadline = tokio::time::Instant::now() + self.between;
                self.timer.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }
}
