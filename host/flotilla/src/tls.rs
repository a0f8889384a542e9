//! TLS on the API listener (`[server] tls`): a certificate chain and its key, both PEM files,
//! read at start and read again whenever either file changes (cert-manager and Kubernetes
//! Secret mounts replace them in place), so a renewed certificate is served without a restart.
//! A change that does not load (a half-written pair, a key that does not fit) keeps the
//! certificate that was serving and is logged; the next change is tried again.
//!
//! Owns: loading and reloading the server's certificate. Must not know: routes, tokens or the
//! accept loop (`serve` asks it for the current acceptor per connection).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// How often the files are looked at for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(2);

/// What identifies a version of the two files: modification time and length of each.
type Stamp = [(Option<SystemTime>, u64); 2];

/// The listener's certificate, reloaded on change.
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Stamp, TlsAcceptor)>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| std::fs::metadata(p).map_or((None, 0), |m| (m.modified().ok(), m.len()));
    [one(cert), one(key)]
}

/// Reads the pair into a server configuration (HTTP/1.1 only); every problem names its file.
fn load(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: holds no certificate", cert.display()));
    }
    flotilla_net::fs::check_secret_file_mode(key).map_err(|e| e.to_string())?;
    // The parser's error never quotes key material.
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("{}: not a PEM private key: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            format!(
                "{} and {}: the key does not fit the certificate: {e}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl ServerTls {
    /// Loads the pair; an error names the file at fault.
    pub fn load(cert: &Path, key: &Path) -> Result<ServerTls, String> {
        let stamped = stamp(cert, key);
        let acceptor = load(cert, key)?;
        Ok(ServerTls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new((stamped, acceptor)),
        })
    }

    /// The acceptor for a new connection: the pair last loaded.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current.read().1.clone()
    }

    /// Loads the pair again if either file changed since the last look. `None`: unchanged;
    /// `Some(Err)`: changed but not loadable, and the old pair still serves.
    pub fn reload_if_changed(&self) -> Option<Result<(), String>> {
        let now = stamp(&self.cert, &self.key);
        if self.current.read().0 == now {
            return None;
        }
        let loaded = load(&self.cert, &self.key);
        let mut current = self.current.write();
        // Looked at again only after the next change, loadable or not.
        current.0 = now;
        Some(loaded.map(|acceptor| current.1 = acceptor))
    }

    /// Looks for a change every [`RELOAD_CHECK`] until the process ends.
    pub fn watch(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD_CHECK).await;
                let tls = self.clone();
                let outcome = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await;
                match outcome {
                    Ok(Some(Ok(()))) => {
                        tracing::info!(cert = %self.cert.display(), "the API listener's certificate was reloaded")
                    }
                    Ok(Some(Err(why))) => tracing::warn!(
                        "the API listener's certificate changed but cannot be loaded, so the old one keeps serving: {why}"
                    ),
                    Ok(None) | Err(_) => {}
                }
            }
        })
    }
}
