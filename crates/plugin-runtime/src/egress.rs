//! The outbound HTTP policy: the single place where a plugin's requests leave the sandbox.
//!
//! Every `wasi:http/outgoing-handler` request passes through [`EgressHooks::send_request`].
//! A request whose scheme, host and port do not match the pool's allow-list is denied with
//! `HTTP-request-denied`, logged with the pool, the target and the reason, and counted.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::uri::Scheme;
use http_body_util::{BodyExt, Full};
use ipnet::IpNet;
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use flotilla_credentials::{
    AWS_REGION_HEADER, AWS_SERVICE_HEADER, CREDENTIAL_HEADER, Credential, SigningHints,
};
use flotilla_net::{AllowList, blocked_reason};

/// Egress settings of one pool.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    /// Where the plugin may send requests.
    pub allow: AllowList,
    /// Address ranges that are normally refused (loopback, private, link-local...) but that
    /// this pool explicitly allows, e.g. `127.0.0.0/8` for a local emulator.
    pub allowed_ip_ranges: Vec<IpNet>,
    /// Fixed name resolution (like curl's `--resolve`), checked like any other answer.
    pub resolve_overrides: BTreeMap<String, Vec<IpAddr>>,
    /// Upper bound for the connect timeout a plugin may ask for.
    pub max_connect_timeout: Duration,
    /// Upper bound for the time to the first response byte.
    pub max_first_byte_timeout: Duration,
    /// Upper bound for the time between response body chunks.
    pub max_between_bytes_timeout: Duration,
    /// Response body bytes a plugin may read per request.
    pub max_response_bytes: u64,
    /// Request body bytes buffered for signing.
    pub max_signed_body_bytes: usize,
    /// Outgoing requests per export call.
    pub max_requests_per_call: u32,
    /// Named credentials the plugin may ask the host to apply.
    pub credentials: Vec<Credential>,
    /// Extra CA certificates (DER) trusted for HTTPS, on top of the Web PKI roots; for
    /// private endpoints and emulators.
    pub extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        EgressPolicy {
            allow: AllowList::default(),
            allowed_ip_ranges: Vec::new(),
            resolve_overrides: BTreeMap::new(),
            max_connect_timeout: Duration::from_secs(10),
            max_first_byte_timeout: Duration::from_secs(30),
            max_between_bytes_timeout: Duration::from_secs(30),
            max_response_bytes: 16 << 20,
            max_signed_body_bytes: 8 << 20,
            max_requests_per_call: 100,
            credentials: Vec::new(),
            extra_roots: Vec::new(),
        }
    }
}

fn clamp(asked: Option<Duration>, max: Duration) -> Duration {
    asked.map_or(max, |a| a.min(max))
}

impl EgressPolicy {
    /// Whether a resolved address may be contacted; `Err` says why not.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), String> {
        match blocked_reason(ip) {
            Some(reason) if !self.allowed_ip_ranges.iter().any(|r| r.contains(&ip)) => Err(
                format!("resolves to {ip}, a {reason} address the pool does not allow"),
            ),
            _ => Ok(()),
        }
    }

    fn credential(&self, name: &str) -> Option<&Credential> {
        self.credentials.iter().find(|c| c.name == name)
    }

    async fn resolve(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<Vec<SocketAddr>, String> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        if let Some(ips) = self.resolve_overrides.get(host) {
            return Ok(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect());
        }
        match tokio::time::timeout(timeout, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(addrs)) => Ok(addrs.collect()),
            Ok(Err(e)) => Err(format!("cannot resolve {host}: {e}")),
            Err(_) => Err(format!("resolving {host} timed out")),
        }
    }
}

/// Counts of what the policy did, for metrics.
#[derive(Debug, Default)]
pub struct EgressStats {
    /// Requests let through.
    pub allowed: AtomicU64,
    /// Requests denied.
    pub denied: AtomicU64,
}

/// What all instances of one pool's plugin share: the policy, counters and connections.
#[derive(Debug, Clone, Default)]
pub(crate) struct EgressShared {
    pub policy: Arc<EgressPolicy>,
    pub stats: Arc<EgressStats>,
    pub connections: Arc<ConnectionPool>,
    pub tls: Arc<TlsCell>,
}

/// The wasi-http hooks of one plugin instance.
pub(crate) struct EgressHooks {
    pub policy: Arc<EgressPolicy>,
    pub stats: Arc<EgressStats>,
    pub origin: super::output::Origin,
    /// Requests made in the current export call (reset before each call).
    pub requests_this_call: u32,
    /// Keep-alive connections shared by the pool's instances.
    pub connections: Arc<ConnectionPool>,
    /// The pool's TLS client configuration.
    pub tls: Arc<TlsCell>,
}

type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;
type SendFuture =
    Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>;

/// Logs and counts a denial; the guest sees `HTTP-request-denied`.
fn deny(
    origin: &super::output::Origin,
    stats: &EgressStats,
    request: &http::Request<WasiBody>,
    reason: &str,
) -> HttpError {
    stats.denied.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        target: "flotilla::egress",
        pool = %origin.pool,
        plugin = %origin.plugin,
        method = %request.method(),
        target_uri = %redact_query(request.uri()),
        reason = %reason,
        "denied plugin request"
    );
    HttpError::HttpRequestDenied
}

fn header_text(
    request: &mut http::Request<WasiBody>,
    name: &str,
) -> Result<Option<String>, String> {
    match request.headers_mut().remove(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim().to_string()))
            .map_err(|_| format!("{name} header is not valid text")),
    }
}

impl WasiHttpHooks for EgressHooks {
    fn default_scheme(&mut self) -> Option<Scheme> {
        None
    }

    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: IoFuture,
    ) -> SendFuture {
        drop(fut);
        let denied =
            |hooks: &EgressHooks, request: &http::Request<WasiBody>, reason: &str| -> SendFuture {
                let e = deny(&hooks.origin, &hooks.stats, request, reason);
                Box::new(async move { Err(e) })
            };
        self.requests_this_call = self.requests_this_call.saturating_add(1);
        if self.requests_this_call > self.policy.max_requests_per_call {
            let reason = format!(
                "more than {} requests in one call",
                self.policy.max_requests_per_call
            );
            return denied(self, &request, &reason);
        }
        if let Err(reason) = self.policy.allow.check(request.uri()) {
            return denied(self, &request, &reason);
        }
        let credential = match header_text(&mut request, CREDENTIAL_HEADER) {
            Err(reason) => return denied(self, &request, &reason),
            Ok(None) => None,
            Ok(Some(name)) => match self.policy.credential(&name) {
                None => return denied(self, &request, &format!("unknown credential {name:?}")),
                Some(c) => match c.hosts.check(request.uri()) {
                    Ok(()) => Some(c.clone()),
                    Err(_) => {
                        return denied(
                            self,
                            &request,
                            &format!("credential {name:?} is not bound to this host"),
                        );
                    }
                },
            },
        };
        let mut hints = SigningHints::default();
        for (header, slot) in [
            (AWS_SERVICE_HEADER, &mut hints.service),
            (AWS_REGION_HEADER, &mut hints.region),
        ] {
            match header_text(&mut request, header) {
                Ok(h) => *slot = h,
                Err(reason) => return denied(self, &request, &reason),
            }
        }
        let asked = options.unwrap_or_default();
        let policy = self.policy.clone();
        let timeouts = Timeouts {
            connect: clamp(asked.connect_timeout, policy.max_connect_timeout),
            first_byte: clamp(asked.first_byte_timeout, policy.max_first_byte_timeout),
            between_bytes: clamp(
                asked.between_bytes_timeout,
                policy.max_between_bytes_timeout,
            ),
        };
        let origin = self.origin.clone();
        let stats = self.stats.clone();
        let connections = self.connections.clone();
        let tls = self.tls.clone();
        Box::new(async move {
            let host = request
                .uri()
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_ascii_lowercase();
            let https = request.uri().scheme() == Some(&Scheme::HTTPS);
            let port = request
                .uri()
                .port_u16()
                .unwrap_or(if https { 443 } else { 80 });
            let addrs = match policy.resolve(&host, port, timeouts.connect).await {
                Ok(a) if !a.is_empty() => a,
                Ok(_) => {
                    return Err(HttpError::DnsError {
                        rcode: Some("no addresses".into()),
                        info_code: None,
                    });
                }
                Err(e) => {
                    tracing::info!(target: "flotilla::egress", pool = %origin.pool, "{e}");
                    return Err(HttpError::DnsError {
                        rcode: Some("lookup failed".into()),
                        info_code: None,
                    });
                }
            };
            // Every answer must pass, so a name cannot smuggle in a forbidden address.
            for addr in &addrs {
                if let Err(reason) = policy.check_ip(addr.ip()) {
                    return Err(deny(&origin, &stats, &request, &format!("{host} {reason}")));
                }
            }
            if let Some(credential) = credential {
                let body = request.body_mut();
                let bytes = match collect_limited(body, policy.max_signed_body_bytes).await {
                    Ok(b) => b,
                    Err(e) => return Err(e),
                };
                if let Err(e) = credential.apply(&mut request, &bytes, &hints).await {
                    return Err(deny(&origin, &stats, &request, &e.to_string()));
                }
                *request.body_mut() = Full::new(bytes)
                    .map_err(|never| match never {})
                    .boxed_unsync();
            }
            stats.allowed.fetch_add(1, Ordering::Relaxed);
            send_pinned(
                request,
                &host,
                &addrs,
                timeouts,
                policy.max_response_bytes,
                &connections,
                https.then(|| tls_config(&policy, &tls)).transpose()?,
            )
            .await
        })
    }
}

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
struct Timeouts {
    connect: Duration,
    first_byte: Duration,
    between_bytes: Duration,
}

/// Reads a whole request body, refusing more than `limit` bytes.
async fn collect_limited(body: &mut WasiBody, limit: usize) -> Result<Bytes, HttpError> {
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
type TlsCell = OnceLock<Option<Arc<rustls::ClientConfig>>>;

fn tls_config(
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
async fn send_pinned(
    mut request: http::Request<WasiBody>,
    host: &str,
    addrs: &[SocketAddr],
    timeouts: Timeouts,
    max_response_bytes: u64,
    pool: &Arc<ConnectionPool>,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<(http::Response<WasiBody>, IoFuture), HttpError> {
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
    let io: IoFuture = Box::new(async { Ok(()) });
    Ok((response, io))
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

/// The URI without its query, which may carry tokens.
fn redact_query(uri: &http::Uri) -> String {
    let mut s = String::new();
    if let Some(scheme) = uri.scheme_str() {
        s.push_str(scheme);
        s.push_str("://");
    }
    if let Some(a) = uri.authority() {
        s.push_str(a.host());
        if let Some(p) = a.port_u16() {
            s.push_str(&format!(":{p}"));
        }
    }
    s.push_str(uri.path());
    s
}
