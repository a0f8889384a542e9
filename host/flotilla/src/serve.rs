//! Serving a router on a listener with the limits a listener open to a network needs: a cap
//! on connections, a deadline for a request's headers (which also ends idle keep-alive
//! connections), and a bound on connections that have not yet made an authenticated request,
//! so a flood of idle or half-sent connections can never keep an API client out.
//!
//! Owns: the accept loop and the connection accounting. Must not know: routes or tokens; the
//! router marks a connection as authenticated through the [`Connection`] ticket it finds in
//! each request's extensions.
//!
//! The HTTP side is hyper-util's server (`auto::Builder`, HTTP/1 only, with upgrades for
//! Docker's exec and attach) and its `GracefulShutdown`; hyper's own `header_read_timeout`
//! bounds header reads. The two counts are a tokio `Semaphore` (every connection) and a queue
//! of the connections still unauthenticated, oldest first: when it is full, the oldest one is
//! closed to make room, so a newcomer always gets a chance to authenticate.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; a further one is answered 503 `too_many_requests` at once
    /// and closed.
    pub max_connections: usize,
    /// Connections that have not made an authenticated request yet; past it the oldest is
    /// closed.
    pub max_unauthenticated: usize,
    /// How long a client may take to send a request's headers, and how long a kept-alive
    /// connection may sit idle.
    pub header_read_timeout: Duration,
    /// Requests that wait long (acquires) at once. A connection waiting in one leaves
    /// `max_connections` for this bound, so a burst of waiting jobs cannot keep other
    /// requests out; past it a long poll is answered 503 `too_many_requests` at once.
    pub max_long_polls: usize,
    /// Upgraded streams (Docker exec and attach through a lease's handle) open at once; they
    /// outlive their connection's slot. Past it an upgrade is answered 503
    /// `too_many_requests`.
    pub max_streams: usize,
}

impl Limits {
    /// These bounds within a process that may open `open_files` descriptors: connections
    /// take at most three quarters of them (the rest are the journal, plugins, SSH sessions and
    /// engine streams), and unauthenticated ones a quarter of those, so a flood of idle
    /// connections is pushed out before it runs the process out of descriptors and a
    /// newcomer can still be accepted.
    pub fn within_open_files(self, open_files: u64) -> Limits {
        let cap = usize::try_from(open_files.saturating_mul(3) / 4)
            .unwrap_or(usize::MAX)
            .max(16);
        let max_connections = self.max_connections.min(cap);
        Limits {
            max_connections,
            max_unauthenticated: self.max_unauthenticated.min((max_connections / 4).max(1)),
            ..self
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_unauthenticated: 1024,
            header_read_timeout: Duration::from_secs(10),
            max_long_polls: 4096,
            max_streams: 2048,
        }
    }
}

/// How long a stop waits for open connections (long Docker streams among them) to finish.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// One served connection, as the router sees it in a request's extensions.
#[derive(Debug, Clone)]
pub struct Connection(Arc<Ticket>);

#[derive(Debug)]
struct Ticket {
    id: u64,
    authenticated: AtomicBool,
    tracker: Arc<Unauthenticated>,
    /// Its place under `max_connections`; given up while it waits in a long poll.
    slot: Mutex<Option<OwnedSemaphorePermit>>,
    bounds: Arc<Bounds>,
}

/// The listener's three bounds.
#[derive(Debug)]
struct Bounds {
    slots: Arc<Semaphore>,
    long_polls: Arc<Semaphore>,
    streams: Arc<Semaphore>,
}

/// A connection waiting in a long poll: counted under `max_long_polls`, not under
/// `max_connections`.
#[derive(Debug)]
pub struct Parked {
    ticket: Arc<Ticket>,
    _permit: OwnedSemaphorePermit,
}

impl Parked {
    /// The wait is over: the connection takes a place under `max_connections` again. `false`
    /// when none is free: the answer must close the connection (`connection: close`).
    pub fn resume(self) -> bool {
        match self.ticket.bounds.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                *self.ticket.slot.lock() = Some(slot);
                true
            }
            Err(_) => false,
        }
    }
}

impl Connection {
    /// The request is about to wait long (an acquire): the connection moves from the
    /// connection bound to the long polls' bound. `None` when that bound is full.
    pub fn park(&self) -> Option<Parked> {
        let permit = self.0.bounds.long_polls.clone().try_acquire_owned().ok()?;
        drop(self.0.slot.lock().take());
        Some(Parked {
            ticket: self.0.clone(),
            _permit: permit,
        })
    }

    /// The request opens an upgraded stream: its place under `max_streams`, to hold for the
    /// stream's life. `None` when the bound is full.
    pub fn stream(&self) -> Option<OwnedSemaphorePermit> {
        self.0.bounds.streams.clone().try_acquire_owned().ok()
    }

    /// The connection made a request that passed authentication: it no longer counts against
    /// the unauthenticated bound and is never evicted.
    pub fn authenticated(&self) {
        if !self.0.authenticated.swap(true, Ordering::Relaxed) {
            self.0.tracker.remove(self.0.id);
        }
    }
}

/// The connections not authenticated yet, oldest first.
#[derive(Debug)]
struct Unauthenticated {
    max: usize,
    queue: Mutex<VecDeque<(u64, CancellationToken)>>,
}

impl Unauthenticated {
    /// Adds a connection; closes the oldest ones beyond the bound.
    fn admit(&self, id: u64, evict: CancellationToken) {
        let mut queue = self.queue.lock();
        queue.push_back((id, evict));
        while queue.len() > self.max {
            if let Some((_, oldest)) = queue.pop_front() {
                oldest.cancel();
            }
        }
    }

    fn remove(&self, id: u64) {
        self.queue.lock().retain(|(other, _)| *other != id);
    }
}

/// Serves `router` on `listener` (over TLS with `tls`) until `stop` resolves, then lets open
/// connections finish for a few seconds.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: Limits,
    tls: Option<Arc<crate::tls::ServerTls>>,
    connections: Option<crate::metrics::Connections>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let server = Server {
        bounds: Arc::new(Bounds {
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            long_polls: Arc::new(Semaphore::new(limits.max_long_polls.max(1))),
            streams: Arc::new(Semaphore::new(limits.max_streams.max(1))),
        }),
        unauthenticated: Arc::new(Unauthenticated {
            max: limits.max_unauthenticated.max(1),
            queue: Mutex::new(VecDeque::new()),
        }),
        builder: Arc::new(builder),
        graceful: GracefulShutdown::new(),
        ids: AtomicU64::new(0),
        refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
        router,
        tls,
        handshake_limit: limits.header_read_timeout,
        connections,
    };
    tokio::pin!(stop);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: the process is out of descriptors for a moment.
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        server.admit(stream);
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_WAIT, server.graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("connections still open after {SHUTDOWN_WAIT:?} are closed");
    }
}

/// What every accepted connection shares: its bounds, the HTTP builder, the router and TLS.
struct Server {
    bounds: Arc<Bounds>,
    unauthenticated: Arc<Unauthenticated>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    graceful: GracefulShutdown,
    ids: AtomicU64,
    refusing: Arc<Semaphore>,
    router: axum::Router,
    tls: Option<Arc<crate::tls::ServerTls>>,
    handshake_limit: Duration,
    connections: Option<crate::metrics::Connections>,
}

impl Server {
    /// Serves one accepted connection in a task of its own, or refuses it past the bound.
    fn admit(&self, stream: tokio::net::TcpStream) {
        // Latency only: a socket that refuses TCP_NODELAY still works.
        let _ = stream.set_nodelay(true);
        // Past the bound a connection is answered at once and closed, never left waiting in
        // the kernel's backlog; past the refusals' own bound it is closed unanswered.
        let Ok(slot) = self.bounds.slots.clone().try_acquire_owned() else {
            if let Ok(refusal) = self.refusing.clone().try_acquire_owned() {
                let plain = self.tls.is_none();
                tokio::spawn(async move {
                    if plain {
                        refuse(stream).await;
                    }
                    drop(refusal);
                });
            }
            return;
        };
        let evict = CancellationToken::new();
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.unauthenticated.admit(id, evict.clone());
        let ticket = Connection(Arc::new(Ticket {
            id,
            authenticated: AtomicBool::new(false),
            tracker: self.unauthenticated.clone(),
            slot: Mutex::new(Some(slot)),
            bounds: self.bounds.clone(),
        }));
        let held = ticket.clone();
        let router = self.router.clone();
        let service = hyper::service::service_fn(move |mut request| {
            request.extensions_mut().insert(ticket.clone());
            tower::ServiceExt::oneshot(router.clone(), request)
        });
        let builder = self.builder.clone();
        let watcher = self.graceful.watcher();
        let tracker = self.unauthenticated.clone();
        let tls = self.tls.as_ref().map(|t| t.acceptor());
        let handshake_limit = self.handshake_limit;
        let open = self
            .connections
            .as_ref()
            .map(crate::metrics::Connections::opened);
        tokio::spawn(async move {
            let _open = open;
            let served = async {
                match tls {
                    None => {
                        let connection =
                            builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                        // A client that hung up or broke the protocol: nothing to report.
                        let _ = watcher.watch(connection.into_owned()).await;
                    }
                    Some(acceptor) => {
                        // The handshake is bounded like a request's headers, so a client
                        // that opens a connection and says nothing holds no slot for long.
                        let Ok(Ok(stream)) =
                            tokio::time::timeout(handshake_limit, acceptor.accept(stream)).await
                        else {
                            return;
                        };
                        let connection =
                            builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                        let _ = watcher.watch(connection.into_owned()).await;
                    }
                }
            };
            tokio::select! {
                () = served => {}
                () = evict.cancelled() => {}
            }
            tracker.remove(id);
            drop(held.0.slot.lock().take());
        });
    }
}

/// Connections being refused at once (past `max_connections`).
const MAX_REFUSING: usize = 256;

/// How long a refused connection may take to send its request's head.
const REFUSAL_READ: Duration = Duration::from_secs(1);

/// Answers a connection past the bound with 503 `too_many_requests` and `Retry-After: 1`,
/// after reading its request's head (at most 16 KiB, for at most a second), so the client
/// reads the answer rather than a reset.
async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read = async {
        while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or_default()),
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_READ, read).await;
    let code = flotilla_api::ErrorCode::TooManyRequests;
    let body = serde_json::json!({"error": {
        "code": code.name(),
        "message": "the server serves as many connections as it may; retry in a second",
    }})
    .to_string();
    let answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        code.status().as_u16(),
        code.status().canonical_reason().unwrap_or_default(),
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_READ, async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Connections waiting to authenticate, for tests of the accounting.
#[cfg(test)]
fn waiting(tracker: &Unauthenticated) -> usize {
    tracker.queue.lock().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exchange(addr: std::net::SocketAddr) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("send");
        let mut text = String::new();
        tokio::time::timeout(Duration::from_secs(3), c.read_to_string(&mut text))
            .await
            .expect("an answer, not a wait in the backlog")
            .expect("read");
        text
    }

    /// `router` served on a loopback port with `limits`; its address, and what stops it.
    async fn serving(
        router: axum::Router,
        limits: Limits,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, router, limits, None, None, async {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// A connection past `max_connections` gets 503 `too_many_requests` with `Retry-After`
    /// at once, not a place in the backlog; once the slot is free, connections are served.
    #[tokio::test]
    async fn a_connection_past_the_bound_is_refused_at_once() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "served" }));
        let limits = Limits {
            max_connections: 1,
            ..Limits::default()
        };
        let (addr, stop) = serving(router, limits).await;
        // The first connection holds the one slot: kept alive after its answer.
        let mut held = tokio::net::TcpStream::connect(addr).await.expect("connect");
        held.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("send");
        let mut buf = [0u8; 512];
        let n = held.read(&mut buf).await.expect("read");
        assert!(String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).contains("served"));

        let refused = exchange(addr).await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(refused.contains("retry-after: 1"), "{refused}");
        assert!(
            refused.contains(r#""code":"too_many_requests""#),
            "{refused}"
        );

        drop(held);
        let mut served = String::new();
        for _ in 0..50 {
            served = exchange(addr).await;
            if served.contains("served") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(served.contains("served"), "{served}");
        let _ = stop.send(());
    }

    /// A connection waiting in a long poll leaves `max_connections` for `max_long_polls`:
    /// with two connection slots, a waiting poll holds neither, so two other connections are
    /// served meanwhile; a second poll past `max_long_polls` is refused at once; the first,
    /// answered while the others hold both slots, closes its connection after its answer.
    #[tokio::test]
    async fn long_polls_have_their_own_bound() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let release = Arc::new(tokio::sync::Notify::new());
        let waiting = release.clone();
        let poll = move |connection: axum::Extension<Connection>| {
            let release = waiting.clone();
            async move {
                let Some(parked) = connection.park() else {
                    return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "full");
                };
                release.notified().await;
                if parked.resume() {
                    (axum::http::StatusCode::OK, "bound, kept")
                } else {
                    (axum::http::StatusCode::OK, "bound, closing")
                }
            }
        };
        let router = axum::Router::new()
            .route("/", axum::routing::get(|| async { "served" }))
            .route("/poll", axum::routing::get(poll));
        let limits = Limits {
            max_connections: 2,
            max_long_polls: 1,
            ..Limits::default()
        };
        let (addr, stop) = serving(router, limits).await;
        let send = |path: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            c.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .expect("send");
            c
        };
        let read = |mut c: tokio::net::TcpStream| async move {
            let mut buf = [0u8; 512];
            let n = tokio::time::timeout(Duration::from_secs(3), c.read(&mut buf))
                .await
                .expect("an answer")
                .expect("read");
            (
                String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned(),
                c,
            )
        };
        let first = send("/poll").await;
        // Until the first poll has parked, a second one may still find the bound free.
        let mut second = String::new();
        for _ in 0..50 {
            (second, _) = read(send("/poll").await).await;
            if second.contains("full") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            second.starts_with("HTTP/1.1 503") && second.contains("full"),
            "{second}"
        );
        // Both slots are free for other requests while the poll waits (once the refused
        // poll's connection has closed), and stay held.
        let mut held = Vec::new();
        for _ in 0..100 {
            let (text, c) = read(send("/").await).await;
            if text.contains("served") {
                held.push(c);
            }
            if held.len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(held.len(), 2, "two connections served while the poll waits");

        release.notify_waiters();
        let (answer, _) = read(first).await;
        assert!(answer.contains("bound, closing"), "{answer}");
        let _ = stop.send(());
    }

    /// Upgraded streams have their own bound: with one connection slot and one stream
    /// place, an open stream leaves the slot to the next connection, whose upgrade is refused
    /// while the stream is open and served once it closes.
    #[tokio::test]
    async fn upgraded_streams_have_their_own_bound() {
        use axum::http::{StatusCode, header};
        use axum::response::IntoResponse;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upgrade = |connection: axum::Extension<Connection>,
                       mut request: axum::extract::Request| async move {
            let Some(place) = connection.stream() else {
                return (StatusCode::SERVICE_UNAVAILABLE, "no stream place").into_response();
            };
            let upgraded = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                let Ok(upgraded) = upgraded.await else { return };
                let mut io = TokioIo::new(upgraded);
                // The place is held until the client closes the stream.
                let mut buf = [0u8; 64];
                while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {}
                drop(place);
            });
            let headers = [(header::CONNECTION, "upgrade"), (header::UPGRADE, "test")];
            (StatusCode::SWITCHING_PROTOCOLS, headers).into_response()
        };
        let router = axum::Router::new().route("/stream", axum::routing::get(upgrade));
        let limits = Limits {
            max_connections: 1,
            max_streams: 1,
            ..Limits::default()
        };
        let (addr, stop) = serving(router, limits).await;
        let open = || async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let ask =
                "GET /stream HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: test\r\n\r\n";
            c.write_all(ask.as_bytes()).await.expect("send");
            let mut buf = [0u8; 512];
            let n = tokio::time::timeout(Duration::from_secs(3), c.read(&mut buf))
                .await
                .expect("an answer")
                .expect("read");
            let text = String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned();
            (text, c)
        };
        // Until the stream's connection has handed its slot back, the next may be refused by
        // the connection bound instead.
        let until = |want: &'static str| async move {
            for _ in 0..100 {
                let (text, c) = open().await;
                if text.contains(want) {
                    return (text, c);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("no answer with {want:?}");
        };
        let (first, stream) = open().await;
        assert!(first.starts_with("HTTP/1.1 101"), "{first}");
        let (refused, _) = until("no stream place").await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        drop(stream);
        let (second, _) = until("HTTP/1.1 101").await;
        assert!(second.starts_with("HTTP/1.1 101"), "{second}");
        let _ = stop.send(());
    }

    #[test]
    fn the_bounds_fit_the_open_file_limit_and_are_kept_when_they_do() {
        let d = Limits::default();
        assert_eq!(d.within_open_files(1 << 20), d);
        let small = d.within_open_files(1024);
        assert_eq!(
            (small.max_connections, small.max_unauthenticated),
            (768, 192)
        );
        assert_eq!(small.max_long_polls, d.max_long_polls);
    }

    #[test]
    fn the_oldest_unauthenticated_connections_make_room() {
        let tracker = Unauthenticated {
            max: 2,
            queue: Mutex::new(VecDeque::new()),
        };
        let tokens: Vec<CancellationToken> = (0..3).map(|_| CancellationToken::new()).collect();
        for (id, token) in tokens.iter().enumerate() {
            tracker.admit(id as u64, token.clone());
        }
        assert!(tokens[0].is_cancelled());
        assert!(!tokens[1].is_cancelled() && !tokens[2].is_cancelled());
        tracker.remove(1);
        assert_eq!(waiting(&tracker), 1);
    }
}
