//! One loopback HTTP/1 server loop for every stand-in peer: bind a free port, accept forever,
//! and serve each connection with a fresh service from `make`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// Starts the server on `127.0.0.1:0` and returns its address; it runs until the runtime ends.
pub async fn serve_http<S, F, B>(handler: S) -> SocketAddr
where
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("the listener's address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            serve_connection(stream, handler.clone());
        }
    });
    addr
}

/// Like [`serve_http`], on a unix socket at `path` (a stand-in for an engine's socket).
pub fn serve_http_unix<S, F, B>(path: &std::path::Path, handler: S)
where
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::UnixListener::bind(path).expect("bind a unix socket");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            serve_connection(stream, handler.clone());
        }
    });
}

fn serve_connection<IO, S, F, B>(stream: IO, handler: S)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        let service = hyper::service::service_fn(handler);
        // A client that hangs up mid-request ends only its own connection.
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
}

/// A request's headers as text pairs, in order, for stand-in peers to record.
pub fn headers<B>(req: &Request<B>) -> Vec<(String, String)> {
    req.headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// The fields of an `application/x-www-form-urlencoded` body, percent-decoded, in order (for
/// stand-in token endpoints).
pub fn form(body: &[u8]) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let mut out = Vec::with_capacity(s.len());
        let mut bytes = s.bytes();
        while let Some(b) = bytes.next() {
            match b {
                b'%' => {
                    let hex: String = bytes.by_ref().take(2).map(char::from).collect();
                    out.push(u8::from_str_radix(&hex, 16).expect("a %XX escape"));
                }
                b'+' => out.push(b' '),
                other => out.push(other),
            }
        }
        String::from_utf8(out).expect("UTF-8 after decoding")
    }
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}
