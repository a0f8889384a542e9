//! A TCP proxy that holds every chunk from client to server for a while before passing it on,
//! so a call to the peer behind it stays in flight long enough for a test to kill its caller
//! in the middle of it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct LatencyProxy {
    /// `http://127.0.0.1:PORT`, to use in place of the upstream's endpoint.
    pub endpoint: String,
    task: JoinHandle<()>,
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The upstream's `host:port`, and a loopback listener in front of it with its endpoint.
async fn front(upstream: &str) -> (String, TcpListener, String) {
    let target = upstream
        .strip_prefix("http://")
        .unwrap_or(upstream)
        .trim_end_matches('/')
        .to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    (target, listener, endpoint)
}

impl LatencyProxy {
    /// Forwards to `upstream` (`http://host:port`), delaying each client chunk by `delay`.
    pub async fn start(upstream: &str, delay: Duration) -> LatencyProxy {
        let (target, listener, endpoint) = front(upstream).await;
        let task = tokio::spawn(async move {
            loop {
                let client = crate::serve::next_connection(&listener).await;
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await {
                        relay(client, server, delay).await;
                    }
                });
            }
        });
        LatencyProxy { endpoint, task }
    }
}

/// Client to server with the delay, server to client as it comes; ends when either side does.
async fn relay(client: TcpStream, server: TcpStream, delay: Duration) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    // Deliberate: the latency this proxy adds.
                    tokio::time::sleep(delay).await;
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let down = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        () = up => {}
        _ = down => {}
    }
}

/// A unix-socket proxy in front of a Docker Engine that holds every container-create request
/// for `delay` before passing it on, and says when it holds one: a driver killed in that
/// moment leaves a creation in flight that lands after its death, as a real engine's can.
pub struct SlowCreates {
    /// The proxy's socket, to use as the machines' `docker_socket`.
    pub socket: std::path::PathBuf,
    /// Creations held so far.
    pub held: std::sync::Arc<std::sync::atomic::AtomicU32>,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for SlowCreates {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowCreates {
    /// Proxies to the engine's socket `upstream`.
    pub fn start(upstream: std::path::PathBuf, delay: Duration) -> SlowCreates {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("slow.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let held = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = held.clone();
        let task = tokio::spawn(async move {
            loop {
                let client = crate::serve::next_unix_connection(&listener).await;
                let upstream = upstream.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::UnixStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let up = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            match client_read.read(&mut buf).await {
                                // Dropping the write half tells the engine the caller is done.
                                Ok(0) | Err(_) => return,
                                Ok(n) => {
                                    let chunk = &buf[..n];
                                    if chunk.starts_with(b"POST ")
                                        && chunk.windows(18).any(|w| w == b"/containers/create")
                                    {
                                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                        // Deliberate: the slow creation this stand-in plays.
                                        tokio::time::sleep(delay).await;
                                    }
                                    if server_write.write_all(chunk).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    };
                    let down = tokio::io::copy(&mut server_read, &mut client_write);
                    // The request goes on even when the caller is gone: the engine finishes
                    // what it was asked, as it does when a client dies.
                    let (_, _) = tokio::join!(up, down);
                });
            }
        });
        SlowCreates {
            socket,
            held,
            task,
            _dir: dir,
        }
    }
}

/// How a [`LosingProxy`] loses the answer to a request it passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The connection is closed without a byte of the answer (a reset mid-flight).
    Reset,
    /// A gateway's 504 in place of the answer, as a load balancer sends when its upstream
    /// took too long (the upstream still applied the request).
    GatewayTimeout,
    /// Nothing comes back for this long, then the connection closes (a client timeout).
    Stall(Duration),
}

/// How long a reset or a 504 takes to come: a lost answer is seldom lost at once, and the
/// caller goes on meanwhile (here, more leases come in).
const LOSS_TAKES: Duration = Duration::from_secs(1);

type Matcher = Box<dyn Fn(&str, &str, &[u8]) -> bool + Send + Sync>;
/// Rewrites an answer's body, given the request's body.
type Rewriter = Box<dyn Fn(&[u8], bytes::Bytes) -> bytes::Bytes + Send + Sync>;
type Rules = std::sync::Arc<std::sync::Mutex<(Vec<(Matcher, Loss)>, Option<Rewriter>)>>;

/// An HTTP proxy in front of a cloud stand-in that passes every request on and, for requests
/// an armed rule matches, lets the upstream apply it and then loses the answer: the case of a
/// scaling write that took effect while its caller heard nothing. It can also rewrite answers
/// (states an emulator does not serve).
pub struct LosingProxy {
    /// `http://127.0.0.1:PORT`, to use in place of the upstream's endpoint.
    pub endpoint: String,
    rules: Rules,
    lost: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for LosingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LosingProxy {
    /// Forwards to `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> LosingProxy {
        let (target, listener, endpoint) = front(upstream).await;
        let rules: Rules = Default::default();
        let lost = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (r, l) = (rules.clone(), lost.clone());
        let task = tokio::spawn(async move {
            loop {
                let client = crate::serve::next_connection(&listener).await;
                tokio::spawn(serve_losing(client, target.clone(), r.clone(), l.clone()));
            }
        });
        LosingProxy {
            endpoint,
            rules,
            lost,
            task,
        }
    }

    /// The next request for which `matches(method, path_and_query, body)` holds is applied
    /// upstream and its answer lost as `loss`; the rule is then spent.
    pub fn lose_next(
        &self,
        matches: impl Fn(&str, &str, &[u8]) -> bool + Send + Sync + 'static,
        loss: Loss,
    ) {
        self.rules.lock().unwrap().0.push((Box::new(matches), loss));
    }

    /// Every answer passed on from now is rewritten by `f(request_body, answer_body)`.
    pub fn rewrite(&self, f: impl Fn(&[u8], bytes::Bytes) -> bytes::Bytes + Send + Sync + 'static) {
        self.rules.lock().unwrap().1 = Some(Box::new(f));
    }

    /// Answers lost so far.
    pub fn lost(&self) -> usize {
        self.lost.load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn serve_losing(
    client: TcpStream,
    target: String,
    rules: Rules,
    lost: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use http_body_util::{BodyExt, Full};
    let kill = std::sync::Arc::new(tokio::sync::Notify::new());
    let killer = kill.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let (target, rules, lost, kill) =
            (target.clone(), rules.clone(), lost.clone(), killer.clone());
        async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let path = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string();
            let loss = {
                let mut rules = rules.lock().unwrap();
                let hit = rules
                    .0
                    .iter()
                    .position(|(m, _)| m(parts.method.as_str(), &path, &body));
                hit.map(|i| rules.0.remove(i).1)
            };
            let upstream = TcpStream::connect(&target).await.expect("the upstream");
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(upstream))
                    .await
                    .expect("an upstream connection");
            tokio::spawn(conn);
            let forwarded = hyper::Request::from_parts(parts, Full::new(body.clone()));
            let answer = sender
                .send_request(forwarded)
                .await
                .expect("the upstream's answer");
            let (parts, incoming) = answer.into_parts();
            let answer = incoming
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            match loss {
                None => {
                    let answer = match &rules.lock().unwrap().1 {
                        Some(f) => f(&body, answer),
                        None => answer,
                    };
                    let mut parts = parts;
                    parts.headers.remove(hyper::header::CONTENT_LENGTH);
                    Ok::<_, std::convert::Infallible>(hyper::Response::from_parts(
                        parts,
                        Full::new(answer),
                    ))
                }
                Some(Loss::GatewayTimeout) => {
                    lost.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(LOSS_TAKES).await;
                    let mut r = hyper::Response::new(Full::new(bytes::Bytes::from_static(
                        b"upstream request timeout",
                    )));
                    *r.status_mut() = hyper::StatusCode::GATEWAY_TIMEOUT;
                    Ok(r)
                }
                Some(loss) => {
                    lost.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let wait = match loss {
                        Loss::Stall(d) => d,
                        _ => LOSS_TAKES,
                    };
                    tokio::time::sleep(wait).await;
                    kill.notify_one();
                    std::future::pending().await
                }
            }
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(client), service);
    tokio::select! {
        _ = conn => {}
        _ = kill.notified() => {}
    }
}
