//! Talking to a registry: push, pull (into the cache, verified), inspect, sign and verify.
//! Every registry failure is mapped to a one-line [`OciError`] that says what to do.
//!
//! This module holds the client and its connections; `errors` classifies failures, `pull`
//! fetches and verifies into the cache, `push` uploads artifacts and signatures.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;

use crate::auth::AuthStore;
use crate::store::Store;
use crate::{OciError, OciRef};

mod errors;
mod pull;
mod push;
mod token;

/// When to contact the registry for a reference that is already cached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullPolicy {
    /// Use the cached artifact when there is one (a pinned digest is always cached by digest).
    #[default]
    IfNotPresent,
    /// Resolve the tag and check the registry on every start.
    Always,
}

/// How to reach registries.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Registries (`host:port`) that may be used over plain HTTP.
    pub insecure: Vec<String>,
    /// Allow plain HTTP to loopback registries.
    pub plain_http_loopback: bool,
    /// Connect and read timeout.
    pub timeout: Duration,
    /// Show a progress bar for layer downloads.
    pub progress: bool,
    /// Extra PEM root certificates trusted for registries (private CAs).
    pub ca_files: Vec<PathBuf>,
    /// The longest a whole pull may take (manifest, signature, config and layer), so a
    /// registry that answers a byte at a time cannot hold a pool's start for good.
    pub pull_timeout: Duration,
}

/// The default [`RegistryOptions::pull_timeout`]: ten minutes, room for a large plugin over a
/// slow link.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            insecure: Vec::new(),
            plain_http_loopback: false,
            timeout: Duration::from_secs(30),
            progress: false,
            ca_files: Vec::new(),
            pull_timeout: DEFAULT_PULL_TIMEOUT,
        }
    }
}

/// An artifact in the cache, ready to load.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The reference, pinned to the digest it resolved to.
    pub reference: OciRef,
    /// The manifest digest.
    pub digest: String,
    /// The cached wasm file.
    pub wasm: PathBuf,
    /// Its digest (`sha256:...`); whoever reads the file must check it.
    pub layer_digest: String,
    /// The wasm size.
    pub size: u64,
    /// Whether the registry was not contacted.
    pub from_cache: bool,
    /// Whether a signature was verified.
    pub verified: bool,
}

/// What to download: a descriptor plus a name for messages.
#[derive(Clone, Copy)]
struct Blob<'a> {
    what: &'static str,
    media_type: &'a str,
    digest: &'a str,
    size: u64,
}

/// A verified blob: already in the cache, or downloaded and waiting to be committed.
enum Fetched {
    Cached(PathBuf),
    Fresh(tempfile::NamedTempFile, String),
}

impl Fetched {
    fn read(&self) -> Result<Vec<u8>, OciError> {
        let path = match self {
            Fetched::Cached(p) => p.as_path(),
            Fetched::Fresh(t, _) => t.path(),
        };
        std::fs::read(path).map_err(|e| OciError::local(path, e))
    }

    fn commit(self, store: &Store) -> Result<PathBuf, OciError> {
        match self {
            Fetched::Cached(p) => Ok(p),
            Fetched::Fresh(tmp, digest) => store.commit_blob(tmp, &digest),
        }
    }
}

/// Checks a downloaded component before it enters the cache (header, imports, exports).
pub type Validate<'a> = &'a (dyn Fn(&[u8]) -> Result<(), String> + Sync);

/// A registry client bound to a credential store and a cache.
#[derive(Clone)]
pub struct Registry {
    opts: RegistryOptions,
    auth: AuthStore,
    store: Store,
    /// One HTTP client (connections, bearer tokens) per registry and account.
    clients: Arc<Mutex<HashMap<String, oci_client::Client>>>,
    /// The plain client for manifests and login, built once.
    http: Arc<Mutex<Option<reqwest::Client>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("opts", &self.opts)
            .field("auth", &self.auth)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

fn install_crypto() {
    // reqwest is built without a default TLS provider; ring is the one the host uses.
    // Err means a provider is already installed (by this call earlier, or by the host), which
    // is what is wanted.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Registry {
    /// A client with the given options, credentials and cache.
    pub fn new(opts: RegistryOptions, auth: AuthStore, store: Store) -> Self {
        install_crypto();
        Registry {
            opts,
            auth,
            store,
            clients: Arc::default(),
            http: Arc::default(),
        }
    }

    /// The cache this registry pulls into.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Whether plain HTTP may be used for `r`; an error when it was asked for but not allowed.
    fn plain_http(&self, registry: &str, loopback: bool) -> Result<bool, OciError> {
        if self.opts.insecure.iter().any(|i| i == registry) {
            return Ok(true);
        }
        if self.opts.plain_http_loopback {
            if loopback {
                return Ok(true);
            }
            return Err(OciError::PlainHttpRefused {
                registry: registry.to_string(),
            });
        }
        Ok(false)
    }

    /// The base URL of the registry's API.
    pub fn base_url(&self, r: &OciRef) -> Result<String, OciError> {
        let scheme = if self.plain_http(&r.registry, r.is_loopback())? {
            "http"
        } else {
            "https"
        };
        Ok(format!("{scheme}://{}", r.registry))
    }

    fn client(&self, r: &OciRef) -> Result<(oci_client::Client, RegistryAuth), OciError> {
        let auth = match self.auth.lookup(&r.registry)? {
            Some(b) => RegistryAuth::Basic(b.user, b.password.to_string()),
            None => RegistryAuth::Anonymous,
        };
        let key = match &auth {
            RegistryAuth::Basic(user, _) => format!("{}|{user}", r.registry),
            _ => r.registry.clone(),
        };
        if let Some(client) = self.clients.lock().get(&key).cloned() {
            return Ok((client, auth));
        }
        let protocol = if self.plain_http(&r.registry, r.is_loopback())? {
            ClientProtocol::HttpsExcept(vec![r.registry.clone()])
        } else {
            ClientProtocol::Https
        };
        let extra_root_certificates = self
            .read_ca_files()?
            .into_iter()
            .map(|data| oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Pem,
                data,
            })
            .collect();
        let config = ClientConfig {
            protocol,
            extra_root_certificates,
            connect_timeout: Some(self.opts.timeout.min(crate::http::CONNECT_TIMEOUT)),
            read_timeout: Some(self.opts.timeout),
            user_agent: concat!("flotilla/", env!("CARGO_PKG_VERSION")),
            platform_resolver: None,
            ..Default::default()
        };
        let client = oci_client::Client::try_from(config).map_err(|e| OciError::Registry {
            registry: r.registry.clone(),
            reference: r.to_string(),
            why: format!("cannot build an HTTP client: {e}"),
        })?;
        self.clients.lock().insert(key, client.clone());
        Ok((client, auth))
    }

    fn read_ca_files(&self) -> Result<Vec<Vec<u8>>, OciError> {
        self.opts
            .ca_files
            .iter()
            .map(|p| {
                let pem = std::fs::read(p).map_err(|e| OciError::local(p, e))?;
                reqwest::Certificate::from_pem(&pem)
                    .map_err(|e| OciError::local(p, format!("not a PEM certificate: {e}")))?;
                Ok(pem)
            })
            .collect()
    }

    /// A plain HTTP client with the same TLS and timeouts (manifests, login).
    pub fn http(&self) -> Result<reqwest::Client, OciError> {
        if let Some(c) = self.http.lock().clone() {
            return Ok(c);
        }
        let client = self.build_http()?;
        *self.http.lock() = Some(client.clone());
        Ok(client)
    }

    fn build_http(&self) -> Result<reqwest::Client, OciError> {
        let mut roots = Vec::new();
        for pem in self.read_ca_files()? {
            if let Ok(c) = reqwest::Certificate::from_pem(&pem) {
                roots.push(c);
            }
        }
        reqwest::Client::builder()
            .tls_certs_merge(roots)
            .connect_timeout(self.opts.timeout.min(crate::http::CONNECT_TIMEOUT))
            .read_timeout(self.opts.timeout)
            .user_agent(concat!("flotilla/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OciError::Local {
                path: "(http client)".to_string(),
                why: e.to_string(),
            })
    }

    /// Drops a cached blob that failed its digest check when read, so the next pull fetches it.
    pub fn evict(&self, pulled: &Pulled) {
        tracing::warn!(file = %pulled.wasm.display(), "cached plugin does not match its digest; removing it");
        if let Err(e) = std::fs::remove_file(&pulled.wasm) {
            tracing::warn!(file = %pulled.wasm.display(), "cannot remove it: {e}; the next pull overwrites it");
        }
    }

    /// Copies a cached wasm blob to `out` atomically.
    pub fn export(&self, pulled: &Pulled, out: &Path) -> Result<(), OciError> {
        let dir = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| OciError::local(dir, e))?;
        let mut src =
            std::fs::File::open(&pulled.wasm).map_err(|e| OciError::local(&pulled.wasm, e))?;
        std::io::copy(&mut src, &mut tmp).map_err(|e| OciError::local(out, e))?;
        tmp.persist(out)
            .map_err(|e| OciError::local(out, e.error))?;
        Ok(())
    }
}
