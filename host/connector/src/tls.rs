//! `docker-tls` instances: Docker Engine reached directly over TLS with the pool's client
//! certificate, the engine's certificate checked against the CA the pool trusts for them (as
//! `docker --tlsverify` does). The key file must be readable by its owner only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The pool's Docker TLS files, validated to exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerTlsFiles {
    /// CA certificates (PEM) that sign the instances' engine certificates.
    pub ca: PathBuf,
    /// The pool's client certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, 0600).
    pub key: PathBuf,
}

/// A loaded client TLS configuration for one pool's engines.
#[derive(Clone)]
pub struct DockerTls {
    connector: TlsConnector,
}

impl std::fmt::Debug for DockerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DockerTls { .. }")
    }
}

/// Why a pool's `docker_tls` files cannot be used; each names its file.
#[derive(Debug, thiserror::Error)]
pub enum TlsFilesError {
    /// A file is not the PEM it should be.
    #[error("{}: not a PEM {what}: {detail}", path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// The parser's words (never key material).
        detail: String,
    },
    /// A certificate file holds no certificate.
    #[error("{}: holds no certificate", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A CA certificate rustls refuses.
    #[error("{}: unusable CA certificate: {detail}", path.display())]
    UnusableCa {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The key file's mode or ownership.
    #[error(transparent)]
    Key(#[from] crate::keys::KeyError),
    /// The TLS library's own setup failed.
    #[error("TLS setup: {0}")]
    Setup(String),
    /// The key does not belong to the certificate.
    #[error("{} and {}: the key does not fit the certificate: {detail}", cert.display(), key.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        detail: String,
    },
}

fn pem_error(path: &Path, what: &'static str, e: impl std::fmt::Display) -> TlsFilesError {
    TlsFilesError::NotPem {
        path: path.to_path_buf(),
        what,
        detail: e.to_string(),
    }
}

impl DockerTls {
    /// Reads the CA, the client certificate and its key; every problem names its file.
    pub fn load(files: &DockerTlsFiles) -> Result<DockerTls, TlsFilesError> {
        let mut roots = rustls::RootCertStore::empty();
        let cas = CertificateDer::pem_file_iter(&files.ca)
            .map_err(|e| pem_error(&files.ca, "certificate file", e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(&files.ca, "certificate file", e))?;
        if cas.is_empty() {
            return Err(TlsFilesError::NoCertificate {
                path: files.ca.clone(),
            });
        }
        for ca in cas {
            roots.add(ca).map_err(|e| TlsFilesError::UnusableCa {
                path: files.ca.clone(),
                detail: e.to_string(),
            })?;
        }
        let chain = CertificateDer::pem_file_iter(&files.cert)
            .map_err(|e| pem_error(&files.cert, "certificate file", e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(&files.cert, "certificate file", e))?;
        if chain.is_empty() {
            return Err(TlsFilesError::NoCertificate {
                path: files.cert.clone(),
            });
        }
        crate::keys::check_mode(&files.key)?;
        // The parser's error never quotes key material.
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| pem_error(&files.key, "private key", e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsFilesError::Setup(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| TlsFilesError::KeyMismatch {
                cert: files.cert.clone(),
                key: files.key.clone(),
                detail: e.to_string(),
            })?;
        Ok(DockerTls {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// A TLS connection to the engine at `host:port`, verified, within `limit`.
    pub(crate) async fn connect(
        &self,
        host: &str,
        port: u16,
        limit: Duration,
    ) -> Result<TlsStream<TcpStream>, String> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| format!("{host:?} is not a valid TLS server name"))?;
        let attempt = async {
            let tcp = TcpStream::connect((host, port))
                .await
                .map_err(|e| format!("cannot reach {host}:{port}: {e}"))?;
            // Latency only: a socket that refuses TCP_NODELAY still works.
            let _ = tcp.set_nodelay(true);
            self.connector
                .connect(name, tcp)
                .await
                .map_err(|e| format!("{host}:{port}: TLS: {e}"))
        };
        tokio::time::timeout(limit, attempt)
            .await
            .unwrap_or_else(|_| Err(format!("{host}:{port}: no TLS session within {limit:?}")))
    }
}
