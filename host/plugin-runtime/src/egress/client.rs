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
    // Origin form on the wire: the path and query alone, reused as parsed (not parsed again).
    let mut origin_form = std::mem::take(request.uri_mut()).into_parts();
    origin_form.scheme = None;
    origin_form.authority = None;
    if origin_form
        .path_and_query
        .as_ref()
        .is_none_or(|p| p.as_str().is_empty())
    {
        origin_form.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    *request.uri_mut() =
        http::Uri::from_parts(origin_form).map_err(|_| HttpError::HttpRequestUriInvalid)?;
    let response = tokio::time::timeout(timeouts.first_byte, sender.send_request(request))
        .await
        .map_err(|_| HttpError::ConnectionReadTimeout)??;
    let between = timeouts.between_bytes.max(Duration::from_millis(1));
    let reuse = Some((pool.clone(), key, sender));
    let response = response.map(|incoming| {
        CappedBody {
            incoming,
            timer: None,
            waiting: false,
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
struct CappedBody<B = hyper::body::Incoming> {
    incoming: B,
    /// Runs while the body waits for bytes: armed when a wait begins, not on every frame, so
    /// a body whose bytes are already there touches no timer at all.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the last poll found no bytes (the timer then runs for the current wait).
    waiting: bool,
    between: Duration,
    left: u64,
    cap: u64,
    /// Returned to the pool once the body has been read to the end.
    reuse: Option<(Arc<ConnectionPool>, PoolKey, Sender)>,
}

impl<B> http_body::Body for CappedBody<B>
where
    B: http_body::Body<Data = Bytes, Error = hyper::Error> + Unpin,
{
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        let polled = Pin::new(&mut self.incoming).poll_frame(cx);
        let was_waiting = std::mem::replace(&mut self.waiting, polled.is_pending());
        match polled {
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
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                // A wait that began now gets the whole between-bytes time; one that goes on
                // keeps its deadline.
                let between = self.between;
                let timer = match (&mut self.timer, was_waiting) {
                    (Some(timer), true) => timer,
                    (Some(timer), false) => {
                        timer.as_mut().reset(tokio::time::Instant::now() + between);
                        timer
                    }
                    (timer @ None, _) => timer.insert(Box::pin(tokio::time::sleep(between))),
                };
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body whose bytes come from a channel, as slowly as the test sends them.
    struct Drip(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

    impl http_body::Body for Drip {
        type Data = Bytes;
        type Error = hyper::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
        }
    }

    fn capped(
        rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
        between: Duration,
    ) -> CappedBody<Drip> {
        CappedBody {
            incoming: Drip(rx),
            timer: None,
            waiting: false,
            between,
            left: 1 << 20,
            cap: 1 << 20,
            reuse: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_between_bytes_timer_restarts_with_each_wait_and_ends_a_stall() {
        let between = Duration::from_millis(300);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut body = capped(rx, between);
        // Six bytes 200 ms apart: 1 s in all, each gap under the 300 ms allowed.
        let drip = tokio::spawn(async move {
            for _ in 0..6 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if tx.send(Bytes::from_static(b"x")).is_err() {
                    return None;
                }
            }
            Some(tx) // kept open: after the sixth byte the body stalls
        });
        let start = tokio::time::Instant::now();
        let mut got = 0;
        let end = loop {
            match body.frame().await {
                Some(Ok(_)) => got += 1,
                other => break other,
            }
        };
        assert_eq!(
            got, 6,
            "a wait shorter than {between:?} ended the body early"
        );
        assert!(
            matches!(end, Some(Err(HttpError::ConnectionReadTimeout))),
            "a stall must end in a read timeout: {end:?}"
        );
        // The stall is timed from its own start: 1.2 s of drip, then 300 ms.
        assert_eq!(start.elapsed(), Duration::from_millis(1_500));
        drop(drip.await);
    }

    #[tokio::test(start_paused = true)]
    async fn time_the_reader_spends_between_polls_is_not_a_stall() {
        let between = Duration::from_millis(300);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut body = capped(rx, between);
        let _ = tx.send(Bytes::from_static(b"first"));
        assert!(matches!(body.frame().await, Some(Ok(_))));
        // The reader goes away for twice the allowed gap; the server sends nothing meanwhile.
        tokio::time::sleep(2 * between).await;
        // Its next wait is a new wait: bytes 200 ms into it arrive, not a timeout.
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = tx.send(Bytes::from_static(b"second"));
            tx
        });
        assert!(
            matches!(body.frame().await, Some(Ok(_))),
            "the reader's own pause was counted against the server"
        );
        drop(late.await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_whose_bytes_are_there_arms_no_timer() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut body = capped(rx, Duration::from_millis(300));
        for _ in 0..3 {
            let _ = tx.send(Bytes::from_static(b"ready"));
        }
        drop(tx);
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            assert!(frame.is_ok());
            frames += 1;
        }
        assert_eq!(frames, 3);
        assert!(body.timer.is_none(), "no wait, so no timer");
    }
}
