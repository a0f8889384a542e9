//! TLS client settings for the helper's HTTPS requests, with rustls (ring) in place of Go's
//! `crypto/tls`. Roots as Go's `x509.SystemCertPool` finds them on Linux: the PEM bundle
//! named by `SSL_CERT_FILE`, else the first of Go's bundle paths that exists
//! (`/etc/ssl/certs/ca-certificates.crt` on Debian and Alpine), plus every file in the
//! `SSL_CERT_DIR` directories; and, for GitLab requests, the CA file the runner gives
//! (`--tls-ca-file` / `CI_SERVER_TLS_CA_FILE`, or `<config dir>/certs/<host>.crt`:
//! `network/client.go` `addTLSCA`, `findCertificate`), and an optional client key pair
//! (`addTLSAuth`). TLS 1.2 is the minimum, as in `createTransport`.
//!
//! Owns: building a `rustls::ClientConfig`. Must not know: HTTP.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::ctx::Env;

/// Where trust and identity come from.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// The system roots: bundle files (PEM).
    pub roots: Vec<PathBuf>,
    /// An extra CA file for this host (GitLab's).
    pub extra_ca: Option<PathBuf>,
    /// A client certificate and key (PEM).
    pub client: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// The system roots only.
    pub fn system(env: &Env) -> TlsFiles {
        const GO_BUNDLES: [&str; 6] = [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
            "/etc/ssl/ca-bundle.pem",
            "/etc/pki/tls/cacert.pem",
            "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
            "/etc/ssl/cert.pem",
        ];
        let mut roots: Vec<PathBuf> = match env.get("SSL_CERT_FILE").filter(|p| !p.is_empty()) {
            Some(file) => vec![PathBuf::from(file)],
            None => GO_BUNDLES
                .iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
                .into_iter()
                .collect(),
        };
        for dir in env
            .get("SSL_CERT_DIR")
            .unwrap_or("")
            .split(':')
            .filter(|d| !d.is_empty())
        {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            roots.extend(entries.filter_map(Result::ok).map(|e| e.path()));
        }
        TlsFiles {
            roots,
            extra_ca: None,
            client: None,
        }
    }

    /// A client configuration trusting these roots.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let mut roots = rustls::RootCertStore::empty();
        for file in self.roots.iter().chain(self.extra_ca.iter()) {
            let Ok(certs) = CertificateDer::pem_file_iter(file) else {
                continue;
            };
            let certs: Vec<CertificateDer<'static>> = certs.filter_map(Result::ok).collect();
            roots.add_parsable_certificates(certs);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("tls: {e}"))?
            .with_root_certificates(roots);
        let config = match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| format!("tls: {}: {e}", cert.display()))?
                    .filter_map(Result::ok)
                    .collect();
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("tls: {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("tls: {e}"))?
            }
        };
        Ok(Arc::new(config))
    }
}
