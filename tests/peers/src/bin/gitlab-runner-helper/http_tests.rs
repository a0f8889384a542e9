//! Tests of the HTTP client against raw loopback servers: chunked bodies, HTTPS trusting the
//! bundle named by `SSL_CERT_FILE`, the response-header timeout, connection errors that
//! hide the query string, and a 307 answer to a POST being followed with the body.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use url::Url;

use crate::http::{Body, Client, Request};
use crate::testkit::{Reply, Server};
use crate::tls::TlsFiles;

fn client(tls: TlsFiles) -> Client {
    Client {
        timeout: Some(Duration::from_secs(10)),
        header_timeout: Duration::from_secs(10),
        dial_timeout: Duration::from_secs(5),
        tls,
        user_agent: "test".into(),
    }
}

/// Reads a request head (no body) from `stream`.
fn read_head(stream: &mut impl Read) -> String {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).expect("request line") == 0 || line == "\r\n" {
            return head;
        }
        head.push_str(&line);
    }
}

const CHUNKED: &[u8] =
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n";

#[test]
fn a_chunked_body_reads_back_whole() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = Url::parse(&format!(
        "http://{}/x",
        listener.local_addr().expect("addr")
    ))
    .expect("url");
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        read_head(&mut stream);
        stream.write_all(CHUNKED).expect("reply");
    });
    let mut response = client(TlsFiles::default())
        .send(Request::new("GET", url))
        .expect("response");
    assert_eq!(response.status_text(), "200 OK");
    assert_eq!(response.read_body(1024), b"hello, world");
}

fn tls_server() -> (Url, String) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let pem = certified.cert.pem();
    let chain: Vec<CertificateDer<'static>> = vec![certified.cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("server config");
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let session = rustls::ServerConnection::new(Arc::clone(&config)).expect("session");
            let mut tls = rustls::StreamOwned::new(session, stream);
            if tls.conn.complete_io(&mut tls.sock).is_err() {
                continue;
            }
            read_head(&mut tls);
            let _ = tls.write_all(CHUNKED);
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    (
        Url::parse(&format!("https://localhost:{port}/secure")).expect("url"),
        pem,
    )
}

#[test]
fn https_trusts_the_bundle_named_by_ssl_cert_file_and_nothing_else() {
    let (url, pem) = tls_server();
    let dir = tempfile::tempdir().expect("temp dir");
    let bundle = dir.path().join("ca.pem");
    std::fs::write(&bundle, pem).expect("bundle");
    let env = crate::ctx::Env::from_pairs(&[("SSL_CERT_FILE", &bundle.to_string_lossy())]);
    let mut response = client(TlsFiles::system(&env))
        .send(Request::new("GET", url.clone()))
        .expect("trusted");
    assert_eq!(response.read_body(1024), b"hello, world");

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").expect("empty bundle");
    let env = crate::ctx::Env::from_pairs(&[("SSL_CERT_FILE", &empty.to_string_lossy())]);
    let err = client(TlsFiles::system(&env))
        .send(Request::new("GET", url))
        .err()
        .expect("untrusted");
    assert!(err.0.contains("certificate"), "{err}");
}

#[test]
fn a_server_that_never_answers_times_out_awaiting_headers() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://{}/slow?sig=secret",
        listener.local_addr().expect("addr")
    );
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        std::thread::sleep(Duration::from_secs(3));
        drop(stream);
    });
    let mut slow = client(TlsFiles::default());
    slow.header_timeout = Duration::from_millis(200);
    let err = slow
        .send(Request::new("GET", Url::parse(&url).expect("url")))
        .err()
        .expect("timeout");
    assert!(err.0.contains("timeout awaiting response headers"), "{err}");
    assert!(
        err.0.starts_with("Get \"http://127.0.0.1:") && !err.0.contains("secret"),
        "{err}"
    );
}

#[test]
fn a_refused_connection_names_the_url_without_its_query() {
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = Url::parse(&format!(
        "http://127.0.0.1:{port}/bucket/key?X-Amz-Signature=secret"
    ))
    .expect("url");
    let err = client(TlsFiles::default())
        .send(Request::new("PUT", url))
        .err()
        .expect("refused");
    assert_eq!(
        err.0,
        format!(
            "Put \"http://127.0.0.1:{port}/bucket/key\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        )
    );
}

#[test]
fn a_307_answer_to_a_post_is_followed_with_the_same_body() {
    let target = Server::start(|request| Reply::new(201).body(request.body.clone()));
    let location = format!("{}/moved", target.base);
    let first = Server::start(move |_| Reply::new(307).header("Location", &location));
    let url = Url::parse(&format!("{}/api", first.base)).expect("url");
    let request = Request::new("POST", url)
        .header("X-Kept", "yes")
        .body(Body::Bytes(b"payload"));
    let mut response = client(TlsFiles::default()).send(request).expect("followed");
    assert_eq!(response.status, 201);
    assert_eq!(response.read_body(64), b"payload");
    let moved = target.requests();
    assert_eq!(moved.first().map(|r| r.header("X-Kept")), Some(Some("yes")));
}
