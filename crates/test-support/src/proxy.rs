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
