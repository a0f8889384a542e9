//! One loopback HTTP/1 server loop for every stand-in peer: bind a free port, accept forever,
//! and serve each connection with a fresh service from `make`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// A request body read whole as JSON; `null` when it is empty or not JSON (a stand-in then
/// answers as its real service does to a body without the fields it needs).
pub async fn json_body(body: Incoming) -> serde_json::Value {
    use http_body_util::BodyExt as _;
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
}

/// Starts the server on `127.0.0.1:0` and returns its address; it runs until the runtime ends.
pub async fn serve_http<S, F, B>(handler: S) -> SocketAddr
where
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_http_on(std::net::Ipv4Addr::LOCALHOST.into(), handler).await
}

/// Like [`serve_http`], on a free port of `ip` (e.g. [`crate::netaddr::PEER_IP`], which
/// containers reach).
pub async fn serve_http_on<S, F, B>(ip: std::net::IpAddr, handler: S) -> SocketAddr
where
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .expect("bind a port");
    let addr = listener.local_addr().expect("the listener's address");
    tokio::spawn(async move {
        loop {
            let stream = crate::serve::next_connection(&listener).await;
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
        loop {
            let stream = crate::serve::next_unix_connection(&listener).await;
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
            .with_upgrades()
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

/// Serves `handler` over HTTPS on port 443 (the scheme's default, so URLs may leave it out or
/// spell it) of a loopback address of its own, `127.0.0.N`, with a certificate for that
/// address from a fresh CA. Returns the address and the CA certificate to trust.
pub async fn serve_https_443<S, F, B>(
    handler: S,
) -> (
    std::net::Ipv4Addr,
    rustls::pki_types::CertificateDer<'static>,
)
where
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut bound = None;
    for n in 20..=250u8 {
        let ip = std::net::Ipv4Addr::new(127, 0, 0, n);
        if let Ok(listener) = tokio::net::TcpListener::bind((ip, 443)).await {
            bound = Some((ip, listener));
            break;
        }
    }
    let (ip, listener) = bound.expect("a loopback address with port 443 free (tests run as root)");
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("a CA");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec![ip.to_string()])
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("a certificate");
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("a TLS config");
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    tokio::spawn(async move {
        loop {
            let stream = crate::serve::next_connection(&listener).await;
            let acceptor = acceptor.clone();
            let handler = handler.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    serve_connection(tls, handler);
                }
            });
        }
    });
    (ip, ca_cert.der().clone())
}

/// The next connection on `listener`. An accept error belongs to one connection (a client
/// that reset before it was accepted, or descriptors short for a moment): it is skipped after
/// a short pause and the stand-in keeps serving. Ending the accept loop on it instead closed
/// the listener, and every later request of the test failed to connect.
pub async fn next_connection(listener: &tokio::net::TcpListener) -> tokio::net::TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}

/// [`next_connection`] on a unix socket.
pub async fn next_unix_connection(listener: &tokio::net::UnixListener) -> tokio::net::UnixStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}
