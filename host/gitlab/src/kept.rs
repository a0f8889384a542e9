//! A connection to the lease API kept alive between a driver's requests: its lease lookup,
//! its Docker requests and its other API calls ([`crate::ApiClient`] and the Docker clients
//! made from it share one). A stage process makes several in a row (`prepare` about twenty),
//! and each new connection costs a
//! TCP (or TLS) handshake here and a connection on the host. One connection is kept, only
//! for a moment after its last request (well within the host's idle keep-alive), and none
//! while an upgraded one (exec, attach) streams: an upgrade goes on the kept connection when
//! it is ready (a stage's exec follows the request that made it), which then becomes its
//! stream and is never kept again.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::transport::ApiStream;

/// How long a connection is kept for the next request after it was last given one: well
/// within the host's idle keep-alive (its `header_read_timeout`, 10 s by default), so a kept
/// connection is not one the host is closing.
const KEEP_FOR: Duration = Duration::from_secs(2);

/// At most this many connections are kept. `prepare` makes two requests at once at times (one
/// more for each service), but every kept connection is one the host holds open too: with a
/// thousand stage processes alive, four each held 4,000 of the host's connections and
/// doubled its memory, and three each raised its peak from 156 to 170–186 MiB in the
/// 1,000-job burst for no gain in time.
const KEEP_AT_MOST: usize = 1;

/// A kept connection and when it was last given a request.
type Idle<B> = (SendRequest<B>, Instant);

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// No connection to the API.
    #[error("{0}")]
    Connect(#[from] std::io::Error),
    /// The exchange failed.
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// The connections kept for requests with bodies of type `B`; clones share them.
pub(crate) struct Kept<B>(Arc<Mutex<Vec<Idle<B>>>>);

impl<B> Clone for Kept<B> {
    fn clone(&self) -> Self {
        Kept(self.0.clone())
    }
}

impl<B> Default for Kept<B> {
    fn default() -> Self {
        Kept(Arc::default())
    }
}

impl<B> Kept<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Sends `request` on a kept connection that is ready for one, or on a new one from
    /// `connect`; keeps the connection afterwards unless the request asks for an upgrade.
    pub(crate) async fn send(
        &self,
        mut request: http::Request<B>,
        connect: impl Future<Output = std::io::Result<ApiStream>>,
    ) -> Result<http::Response<Incoming>, SendError> {
        let upgrade = request.headers().contains_key(http::header::UPGRADE);
        let ready = self.take();
        if upgrade {
            // The stream that follows may last the stage: it takes the kept connection (the
            // request that made the exec left it ready), and nothing else kept idles on the
            // host meanwhile.
            self.clear();
        }
        if let Some(mut sender) = ready {
            match sender.try_send_request(request).await {
                Ok(response) => {
                    if !upgrade {
                        self.put(sender);
                    }
                    return Ok(response);
                }
                // Closed under it before the request went out: on a new connection.
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(e.into_error().into()),
                },
            }
        }
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(connect.await?)).await?;
        tokio::spawn(async move {
            // Ends with the connection or the upgraded stream; errors reach the caller.
            let _ = connection.with_upgrades().await;
        });
        let response = sender.send_request(request).await?;
        if !upgrade {
            self.put(sender);
        }
        Ok(response)
    }

    /// A kept connection ready for a request, if one is; the closed and the stale are dropped.
    fn take(&self) -> Option<SendRequest<B>> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.retain(|(sender, since)| !sender.is_closed() && since.elapsed() < KEEP_FOR);
        let ready = kept.iter().position(|(sender, _)| sender.is_ready())?;
        Some(kept.swap_remove(ready).0)
    }

    /// Closes the kept connections.
    fn clear(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Keeps `sender` for a later request (it is ready again once its response is read).
    fn put(&self, sender: SendRequest<B>) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() >= KEEP_AT_MOST {
            kept.remove(0);
        }
        kept.push((sender, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A minimal HTTP/1.1 server: keeps connections alive, switches protocols when asked,
    /// closes a connection after answering `/close` (as a host ends an idle one), and sends
    /// the last byte of `/slow`'s body a moment after the rest.
    struct Server {
        addr: std::net::SocketAddr,
        accepted: Arc<AtomicUsize>,
        ended: Arc<AtomicUsize>,
    }

    impl Server {
        async fn start() -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let (accepted, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let (a, e) = (accepted.clone(), ended.clone());
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    a.fetch_add(1, Ordering::SeqCst);
                    let e = e.clone();
                    tokio::spawn(async move {
                        serve(stream).await;
                        e.fetch_add(1, Ordering::SeqCst);
                    });
                }
            });
            Server {
                addr,
                accepted,
                ended,
            }
        }

        fn counts(&self) -> (usize, usize) {
            (
                self.accepted.load(Ordering::SeqCst),
                self.ended.load(Ordering::SeqCst),
            )
        }
    }

    /// Answers requests on one connection until the client closes it, or an upgrade or
    /// `/close` ends it.
    async fn serve(mut stream: TcpStream) {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
            if !head.ends_with(b"\r\n\r\n") {
                continue;
            }
            let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
            head.clear();
            if text.contains("\r\nupgrade:") {
                let _ = stream
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
                    .await;
                // The stream stays open until the client ends it.
                let _ = stream.read(&mut byte).await;
                return;
            }
            if text.starts_with("get /slow ") {
                // Its body's last byte a moment later: the connection is busy until then.
                let head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no";
                if stream.write_all(head).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                if stream.write_all(b"k").await.is_err() {
                    return;
                }
                continue;
            }
            let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            if stream.write_all(answer).await.is_err() || text.starts_with("get /close ") {
                return;
            }
        }
    }

    fn request(path: &str, upgrade: bool) -> http::Request<Empty<Bytes>> {
        let mut r = http::Request::get(path).header(http::header::HOST, "test");
        if upgrade {
            r = r
                .header(http::header::CONNECTION, "Upgrade")
                .header(http::header::UPGRADE, "tcp");
        }
        r.body(Empty::new()).expect("request")
    }

    async fn until(what: &str, server: &Server, want: (usize, usize)) {
        for _ in 0..200 {
            if server.counts() == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "{what}: accepted and ended {:?}, not {want:?}",
            server.counts()
        );
    }

    /// `path` through `kept` to `server`, on a new connection when none kept is ready.
    async fn send(
        kept: &Kept<Empty<Bytes>>,
        server: &Server,
        path: &str,
        upgrade: bool,
    ) -> http::Response<Incoming> {
        let connect = async { TcpStream::connect(server.addr).await.map(ApiStream::Plain) };
        kept.send(request(path, upgrade), connect)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A plain request's status, its body read to the end.
    async fn answered(kept: &Kept<Empty<Bytes>>, server: &Server, path: &str) -> u16 {
        let answer = send(kept, server, path, false).await;
        let status = answer.status().as_u16();
        answer.into_body().collect().await.expect("body");
        status
    }

    /// An upgrade's stream.
    async fn upgraded(kept: &Kept<Empty<Bytes>>, server: &Server) -> hyper::upgrade::Upgraded {
        let answer = send(kept, server, "/exec", true).await;
        assert_eq!(answer.status(), 101);
        hyper::upgrade::on(answer).await.expect("upgraded")
    }

    #[tokio::test]
    async fn requests_share_a_kept_connection_and_an_upgrade_takes_it_over() {
        let server = Server::start().await;
        let kept = Kept::default();
        for _ in 0..3 {
            assert_eq!(answered(&kept, &server, "/a").await, 200);
        }
        until("three requests on one connection", &server, (1, 0)).await;

        let stream = upgraded(&kept, &server).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            server.counts(),
            (1, 0),
            "the upgrade goes on the kept connection, with no handshake of its own"
        );

        answered(&kept, &server, "/b").await;
        until(
            "the stream is never kept: a new connection beside it",
            &server,
            (2, 0),
        )
        .await;
        drop(stream);
        until("the stream ends with its connection", &server, (2, 1)).await;
    }

    /// An upgrade while the kept connection is busy with another request connects anew, and
    /// the busy one is not kept once the stream opens.
    #[tokio::test]
    async fn an_upgrade_beside_a_busy_connection_connects_anew_and_keeps_nothing() {
        let server = Server::start().await;
        let kept = Kept::default();
        // Its body not all there yet: the connection is not ready for another request.
        let busy = send(&kept, &server, "/slow", false).await;
        let stream = upgraded(&kept, &server).await;
        until("a second connection for the upgrade", &server, (2, 0)).await;
        busy.into_body().collect().await.expect("body");
        answered(&kept, &server, "/b").await;
        until("nothing was kept beside the stream", &server, (3, 1)).await;
        drop(stream);
    }

    #[tokio::test]
    async fn a_connection_the_host_closed_is_not_used_again() {
        let server = Server::start().await;
        let kept = Kept::default();
        answered(&kept, &server, "/close").await;
        until("the host closed it", &server, (1, 1)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(answered(&kept, &server, "/a").await, 200);
        until("a second connection", &server, (2, 1)).await;
    }
}
