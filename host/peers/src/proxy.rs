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

impl LatencyProxy {
    /// Forwards to `upstream` (`http://host:port`), delaying each client chunk by `delay`.
    pub async fn start(upstream: &str, delay: Duration) -> LatencyProxy {
        let target = upstream
            .strip_prefix("http://")
            .unwrap_or(upstream)
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
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
            while let Ok((client, _)) = listener.accept().await {
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
