//! How the driver reaches the lease API: plain HTTP, or HTTPS checked against the operator's
//! CA file (or the public web roots). The API's token means exec and the Docker handle on
//! every machine, and in instance mode every job's script crosses this connection, so the
//! driver refuses to send the token over plain HTTP to anything but loopback unless the
//! operator says `--insecure-http`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::setting::SettingError;

/// The operator's word on the API's transport.
#[derive(Debug, Clone, Default)]
pub struct TransportOptions {
    /// PEM CA certificates that sign the API's certificate (`--ca-file`); none: the public web
    /// roots.
    pub ca_file: Option<PathBuf>,
    /// Send the token over plain HTTP to a non-loopback address (`--insecure-http`).
    pub insecure_http: bool,
}

/// TLS to the API: the client configuration and the name the certificate must carry.
#[derive(Clone)]
pub(crate) struct Tls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Whether `host` (a URI's host, IPv6 in brackets) is this machine's loopback.
pub(crate) fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// Checks the URL's scheme against the options and the token: `Ok(None)` for plain HTTP,
/// `Ok(Some(tls))` for HTTPS.
pub(crate) fn for_url(
    url: &str,
    uri: &http::Uri,
    has_token: bool,
    options: &TransportOptions,
) -> Result<Option<Tls>, SettingError> {
    let host = uri.host().unwrap_or_default();
    match uri.scheme_str() {
        Some("http") => {
            if has_token && !is_loopback(host) && !options.insecure_http {
                return Err(SettingError::new(
                    "--url",
                    url,
                    "refusing to send the API token over plain HTTP to a non-loopback address: anyone on the path could read it and every job's script; serve the API over TLS ([server] tls) and use https://, or pass --insecure-http if this network is yours alone",
                ));
            }
            Ok(None)
        }
        Some("https") => {
            let roots = roots(options.ca_file.as_deref()).map_err(|why| {
                SettingError::new(
                    "--ca-file",
                    &options
                        .ca_file
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    why,
                )
            })?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| SettingError::new("--url", url, format!("TLS setup: {e}")))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(bare.to_string()).map_err(|_| {
                SettingError::new("--url", url, "the host is not a valid TLS server name")
            })?;
            Ok(Some(Tls {
                connector: TlsConnector::from(Arc::new(config)),
                name,
            }))
        }
        _ => Err(SettingError::new(
            "--url",
            url,
            "expected http:// (loopback) or https://",
        )),
    }
}

/// The CA file's certificates, or the public web roots.
fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    let Some(file) = ca_file else {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok(roots);
    };
    let shown = file.display();
    let cas = CertificateDer::pem_file_iter(file)
        .map_err(|e| format!("{shown}: not a PEM certificate file: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{shown}: not a PEM certificate file: {e}"))?;
    if cas.is_empty() {
        return Err(format!("{shown}: holds no certificate"));
    }
    for ca in cas {
        roots
            .add(ca)
            .map_err(|e| format!("{shown}: an unusable CA certificate: {e}"))?;
    }
    Ok(roots)
}

/// A connection to the API, plain or TLS.
pub(crate) enum ApiStream {
    /// Plain HTTP.
    Plain(TcpStream),
    /// HTTPS.
    Tls(Box<TlsStream<TcpStream>>),
}

/// Opens a connection to `authority`, with TLS when `tls` is set.
pub(crate) async fn connect(authority: &str, tls: Option<&Tls>) -> std::io::Result<ApiStream> {
    let tcp = TcpStream::connect(authority).await?;
    // Latency only: a socket that refuses TCP_NODELAY still works.
    let _ = tcp.set_nodelay(true);
    match tls {
        None => Ok(ApiStream::Plain(tcp)),
        Some(tls) => {
            let stream = tls.connector.connect(tls.name.clone(), tcp).await?;
            Ok(ApiStream::Tls(Box::new(stream)))
        }
    }
}

impl AsyncRead for ApiStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ApiStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, token: bool, insecure: bool) -> Result<bool, String> {
        let uri: http::Uri = url.parse().expect("uri");
        let options = TransportOptions {
            ca_file: None,
            insecure_http: insecure,
        };
        for_url(url, &uri, token, &options)
            .map(|tls| tls.is_some())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_token_goes_over_plain_http_to_loopback_only_unless_the_operator_says_so() {
        for local in [
            "http://127.0.0.1:8080",
            "http://127.1.2.3:80",
            "http://localhost:8080",
            "http://[::1]:8080",
        ] {
            assert_eq!(check(local, true, false), Ok(false), "{local}");
        }
        let refused = check("http://flotilla.ci.svc:8080", true, false).expect_err("refused");
        assert!(refused.contains("--insecure-http"), "{refused}");
        assert!(check("http://10.0.0.5:8080", true, false).is_err());
        assert!(check("http://[::ffff:10.0.0.5]:8080", true, false).is_err());
        assert_eq!(check("http://10.0.0.5:8080", true, true), Ok(false));
        assert_eq!(check("http://10.0.0.5:8080", false, false), Ok(false));
        assert_eq!(check("https://flotilla.ci.svc:8443", true, false), Ok(true));
        assert!(check("ftp://flotilla:21", true, false).is_err());
    }
}
