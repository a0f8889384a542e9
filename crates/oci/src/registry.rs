//! Talking to a registry: push, pull (into the cache, verified), inspect, sign and verify.
//! Every registry failure is mapped to a one-line [`OciError`] that says what to do.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use sha2::{Digest, Sha256};

use super::artifact::{self, ArtifactInfo, ManifestCheck, PushAnnotations, digest_of};
use super::auth::AuthStore;
use super::signature::{self, KeyPair, PublicKey, SignatureCheck, SignatureLayer};
use super::store::{CachedRef, Store};
use super::{OciError, OciRef};

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
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            insecure: Vec::new(),
            plain_http_loopback: false,
            timeout: Duration::from_secs(30),
            progress: false,
            ca_files: Vec::new(),
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

/// Describes a reqwest failure with its cause chain (DNS, refused, timeout) in one line.
pub(crate) fn describe_reqwest(e: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    if e.is_timeout() {
        parts.push("timed out".to_string());
    } else if e.is_connect() {
        parts.push("connection failed".to_string());
    }
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut last = String::new();
    while let Some(s) = source {
        last = s.to_string();
        source = s.source();
    }
    if last.contains("InvalidContentType") || last.contains("corrupt message") {
        last = "the registry does not answer TLS (a plain-HTTP registry? then list it as insecure)"
            .to_string();
    }
    if last.contains("certificate") {
        last.push_str(" (trust a private CA with --ca-file or [oci] tls_ca_files)");
    }
    if !last.is_empty() {
        parts.push(last);
    }
    if parts.is_empty() {
        parts.push(e.to_string());
    }
    parts.join(": ")
}

fn install_crypto() {
    // reqwest is built without a default TLS provider; ring is the one the host uses.
    // Err means a provider is already installed (by this call earlier, or by the host), which
    // is what is wanted.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn op_name(push: bool) -> &'static str {
    if push { "push" } else { "pull" }
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
            connect_timeout: Some(self.opts.timeout.min(super::auth::CONNECT_TIMEOUT)),
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
            .connect_timeout(self.opts.timeout.min(super::auth::CONNECT_TIMEOUT))
            .read_timeout(self.opts.timeout)
            .user_agent(concat!("flotilla/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OciError::Local {
                path: "(http client)".to_string(),
                why: e.to_string(),
            })
    }

    fn map_err(&self, r: &OciRef, push: bool, e: OciDistributionError) -> OciError {
        let registry = r.registry.clone();
        let reference = r.to_string();
        let by_status = |code: u16, why: String| match code {
            401 => OciError::Unauthorized {
                registry: registry.clone(),
                reference: reference.clone(),
            },
            403 => OciError::Forbidden {
                registry: registry.clone(),
                operation: op_name(push),
                reference: reference.clone(),
            },
            404 => OciError::NotFound {
                reference: reference.clone(),
            },
            _ => OciError::Registry {
                registry: registry.clone(),
                reference: reference.clone(),
                why,
            },
        };
        match e {
            OciDistributionError::RequestError(e) => {
                if let Some(status) = e.status() {
                    by_status(status.as_u16(), describe_reqwest(&e))
                } else if e.is_connect() || e.is_timeout() || e.is_request() {
                    OciError::Unreachable {
                        registry,
                        why: describe_reqwest(&e),
                    }
                } else {
                    OciError::Registry {
                        registry,
                        reference,
                        why: describe_reqwest(&e),
                    }
                }
            }
            OciDistributionError::UnauthorizedError { .. } => by_status(401, String::new()),
            OciDistributionError::AuthenticationFailure(msg) => {
                if msg.contains("403") {
                    by_status(403, msg)
                } else {
                    by_status(401, msg)
                }
            }
            OciDistributionError::ImageManifestNotFoundError(_) => by_status(404, String::new()),
            OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError { expected, actual },
            ) => OciError::DigestMismatch {
                what: "manifest",
                reference,
                expected,
                actual,
            },
            OciDistributionError::ServerError { code, message, .. } => {
                by_status(code, format!("HTTP {code}: {}", one_line(&message)))
            }
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<String> = envelope
                    .errors
                    .iter()
                    .map(|e| format!("{:?}", e.code).to_ascii_uppercase())
                    .collect();
                let why = envelope
                    .errors
                    .iter()
                    .map(|e| e.message.clone())
                    .collect::<Vec<_>>()
                    .join("; ");
                if codes.iter().any(|c| c == "UNAUTHORIZED") {
                    by_status(401, why)
                } else if codes.iter().any(|c| c == "DENIED") {
                    by_status(403, why)
                } else if codes
                    .iter()
                    .any(|c| c.ends_with("UNKNOWN") && c != "UNKNOWN")
                {
                    by_status(404, why)
                } else {
                    by_status(0, why)
                }
            }
            other => OciError::Registry {
                registry,
                reference,
                why: one_line(&other.to_string()),
            },
        }
    }

    async fn fetch_manifest(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        r: &OciRef,
    ) -> Result<(Vec<u8>, ManifestCheck), OciError> {
        let bytes = self
            .manifest_bytes(
                client,
                auth,
                r,
                &[
                    artifact::MANIFEST_MEDIA_TYPE,
                    "application/vnd.oci.image.index.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json",
                ],
            )
            .await?;
        let digest = digest_of(&bytes);
        if let Some(pinned) = &r.digest
            && pinned != &digest
        {
            return Err(OciError::DigestMismatch {
                what: "manifest",
                reference: r.to_string(),
                expected: pinned.clone(),
                actual: digest,
            });
        }
        let check = ManifestCheck::parse(&r.to_string(), &digest, &bytes)?;
        Ok((bytes, check))
    }

    /// GETs a manifest with oci-client's authentication but our own bounded read: oci-client
    /// would buffer any body a registry sends, and a manifest is never larger than a few KiB.
    async fn manifest_bytes(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        r: &OciRef,
        accept: &[&str],
    ) -> Result<Vec<u8>, OciError> {
        let reference = r.client_ref();
        let token = client
            .auth(&reference, auth, oci_client::RegistryOperation::Pull)
            .await
            .map_err(|e| self.map_err(r, false, e))?;
        let target = r.digest.as_deref().or(r.tag.as_deref()).unwrap_or("latest");
        let url = format!(
            "{}/v2/{}/manifests/{target}",
            self.base_url(r)?,
            r.repository
        );
        let mut request = self
            .http()?
            .get(&url)
            .header(reqwest::header::ACCEPT, accept.join(", "));
        request = match (token, auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            _ => request,
        };
        let unreachable = |e: reqwest::Error| OciError::Unreachable {
            registry: r.registry.clone(),
            why: describe_reqwest(&e),
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let limit = if status.is_success() {
            artifact::MAX_MANIFEST
        } else {
            64 * 1024
        };
        if let Some(len) = response.content_length()
            && len > limit
        {
            return Err(OciError::TooLarge {
                what: "manifest",
                reference: r.to_string(),
                size: len,
                limit,
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(OciError::TooLarge {
                    what: "manifest",
                    reference: r.to_string(),
                    size: (body.len() + chunk.len()) as u64,
                    limit,
                });
            }
            body.extend_from_slice(&chunk);
        }
        if status.is_success() {
            return Ok(body);
        }
        let error = match serde_json::from_slice::<oci_client::errors::OciEnvelope>(&body) {
            Ok(envelope) => OciDistributionError::RegistryError { envelope, url },
            Err(_) => OciDistributionError::ServerError {
                code: status.as_u16(),
                url,
                message: String::from_utf8_lossy(&body).into_owned(),
            },
        };
        Err(self.map_err(r, false, error))
    }

    /// Downloads a blob into the cache, verifying size and digest before it becomes visible.
    async fn fetch_blob(
        &self,
        client: &oci_client::Client,
        r: &OciRef,
        blob: Blob<'_>,
        validate: Option<Validate<'_>>,
    ) -> Result<Fetched, OciError> {
        let Blob {
            what,
            media_type,
            digest,
            size,
        } = blob;
        if let Some(path) = self.store.blob_path(digest)
            && self.store.get("blobs", digest).is_some()
        {
            return Ok(Fetched::Cached(path));
        }
        let desc = OciDescriptor {
            media_type: media_type.to_string(),
            digest: digest.to_string(),
            size: size as i64,
            ..Default::default()
        };
        let mut stream = client
            .pull_blob_stream(&r.client_ref(), &desc)
            .await
            .map_err(|e| self.map_err(r, false, e))?;
        let mut tmp = self.store.temp()?;
        let tmp_path = tmp.path().to_path_buf();
        let bar = self.progress_bar(size, what);
        let mut hasher = Sha256::new();
        let mut got: u64 = 0;
        let mut stream_error = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    got += bytes.len() as u64;
                    if got > size {
                        return Err(OciError::DigestMismatch {
                            what,
                            reference: r.to_string(),
                            expected: format!("{digest} ({size} bytes)"),
                            actual: format!("more than {size} bytes"),
                        });
                    }
                    hasher.update(&bytes);
                    tmp.write_all(&bytes)
                        .map_err(|e| OciError::local(&tmp_path, e))?;
                    if let Some(b) = &bar {
                        b.set_position(got);
                    }
                }
                Err(e) => {
                    stream_error = Some(e);
                    break;
                }
            }
        }
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if got == size && actual != digest {
            return Err(OciError::DigestMismatch {
                what,
                reference: r.to_string(),
                expected: digest.to_string(),
                actual,
            });
        }
        if let Some(e) = stream_error {
            let why = match e.get_ref().and_then(|i| i.downcast_ref::<reqwest::Error>()) {
                Some(inner) => describe_reqwest(inner),
                None => e.to_string(),
            };
            return Err(OciError::Unreachable {
                registry: r.registry.clone(),
                why: format!("download of the {what} was interrupted after {got} bytes: {why}"),
            });
        }
        if got != size || actual != digest {
            return Err(OciError::DigestMismatch {
                what,
                reference: r.to_string(),
                expected: format!("{digest} ({size} bytes)"),
                actual: format!("{actual} ({got} bytes)"),
            });
        }
        tmp.as_file()
            .sync_all()
            .map_err(|e| OciError::local(&tmp_path, e))?;
        if let Some(validate) = validate {
            let bytes = std::fs::read(&tmp_path).map_err(|e| OciError::local(&tmp_path, e))?;
            validate(&bytes).map_err(|why| OciError::InvalidComponent {
                source_name: r.to_string(),
                why,
            })?;
        }
        Ok(Fetched::Fresh(tmp, digest.to_string()))
    }

    fn progress_bar(&self, size: u64, what: &str) -> Option<indicatif::ProgressBar> {
        if !self.opts.progress || size < 256 * 1024 {
            return None;
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(size),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(format!("pulling {what}"));
        Some(bar)
    }

    fn cache_key(r: &OciRef) -> String {
        match (&r.tag, &r.digest) {
            (_, Some(d)) => format!("{}@{d}", r.repo_name()),
            (Some(t), None) => format!("{}:{t}", r.repo_name()),
            (None, None) => r.repo_name(),
        }
    }

    /// A cached artifact for `r`, if its manifest, layer and (when asked) signature are cached.
    fn cached(&self, r: &OciRef, key: Option<&PublicKey>) -> Result<Option<Pulled>, OciError> {
        let digest = match &r.digest {
            Some(d) => d.clone(),
            None => match self.store.lookup(&Self::cache_key(r)) {
                Some(entry) => entry.digest,
                None => return Ok(None),
            },
        };
        let Some(manifest) = self.store.get("manifests", &digest) else {
            return Ok(None);
        };
        let check = ManifestCheck::parse(&r.to_string(), &digest, &manifest)?;
        // The loader hashes the bytes anyway and compares them with `layer_digest`.
        let Some(wasm) = self.store.blob_path(&check.layer_digest) else {
            return Ok(None);
        };
        let verified = match key {
            Some(key) => {
                let layers = self.cached_signatures(&digest);
                match signature::check(key, &digest, &layers) {
                    SignatureCheck::Verified => true,
                    SignatureCheck::Failed(_) => return Ok(None),
                }
            }
            None => false,
        };
        Ok(Some(Pulled {
            reference: r.pinned(&digest),
            digest,
            wasm,
            layer_digest: check.layer_digest.clone(),
            size: check.layer_size,
            from_cache: true,
            verified,
        }))
    }

    fn cached_signatures(&self, digest: &str) -> Vec<SignatureLayer> {
        self.store
            .get("signatures", digest)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Pulls `r` into the cache (or finds it there), checking the signature when `key` is set.
    pub async fn pull(
        &self,
        r: &OciRef,
        policy: PullPolicy,
        key: Option<&PublicKey>,
        validate: Option<Validate<'_>>,
    ) -> Result<Pulled, OciError> {
        if policy == PullPolicy::IfNotPresent
            && let Some(hit) = self.cached(r, key)?
        {
            return Ok(hit);
        }
        match self.pull_remote(r, key, validate).await {
            Ok(p) => Ok(p),
            Err(OciError::Unreachable { registry, why }) => {
                // A pinned digest names exact content: the cached copy is that content.
                if r.digest.is_some()
                    && let Some(hit) = self.cached(r, key)?
                {
                    tracing::warn!(reference = %r, "registry unreachable ({why}); using the cached copy of the pinned digest");
                    return Ok(hit);
                }
                if policy == PullPolicy::Always && self.cached(r, key)?.is_some() {
                    return Err(OciError::NeedsRegistry {
                        reference: r.to_string(),
                        why: format!(
                            "pull_policy = always needs registry {registry} to resolve it, but it cannot be reached ({why}); set pull_policy = \"if-not-present\" to start from the cached copy"
                        ),
                    });
                }
                Err(OciError::Unreachable { registry, why })
            }
            Err(e) => Err(e),
        }
    }

    async fn pull_remote(
        &self,
        r: &OciRef,
        key: Option<&PublicKey>,
        validate: Option<Validate<'_>>,
    ) -> Result<Pulled, OciError> {
        let (client, auth) = self.client(r)?;
        let (manifest, check) = self.fetch_manifest(&client, &auth, r).await?;
        let digest = check.digest.clone();
        let pinned = r.pinned(&digest);
        let verified = match key {
            Some(key) => {
                self.verify_remote(&client, &auth, &pinned, key).await?;
                true
            }
            None => false,
        };
        let (config, _) = self.fetch_config(&client, r, &check).await?;
        let wasm = self
            .fetch_blob(
                &client,
                r,
                Blob {
                    what: "wasm layer",
                    media_type: artifact::LAYER_MEDIA_TYPE,
                    digest: &check.layer_digest,
                    size: check.layer_size,
                },
                validate,
            )
            .await?;
        // Nothing becomes visible in the cache until every part verified.
        config.commit(&self.store)?;
        let wasm = wasm.commit(&self.store)?;
        // Unchanged entries are not rewritten (each write is fsynced).
        if self.store.get("manifests", &digest).is_none() {
            self.store.put("manifests", &digest, &manifest)?;
        }
        let now = chrono::Utc::now().to_rfc3339();
        for key in [Self::cache_key(r), Self::cache_key(&pinned)] {
            if self
                .store
                .lookup(&key)
                .is_some_and(|e| e.digest == digest && (e.signature_verified || !verified))
            {
                continue;
            }
            self.store.record(CachedRef {
                reference: key,
                digest: digest.clone(),
                layer_digest: check.layer_digest.clone(),
                size: check.layer_size,
                resolved_at: now.clone(),
                signature_verified: verified,
            })?;
        }
        Ok(Pulled {
            reference: pinned,
            digest,
            wasm,
            layer_digest: check.layer_digest.clone(),
            size: check.layer_size,
            from_cache: false,
            verified,
        })
    }

    /// Fetches the `.sig` manifest for a pinned reference and checks it; caches what verified.
    async fn verify_remote(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        pinned: &OciRef,
        key: &PublicKey,
    ) -> Result<(), OciError> {
        let digest = pinned.digest.clone().unwrap_or_default();
        let layers = self.signature_layers(client, auth, pinned).await?;
        match signature::check(key, &digest, &layers) {
            SignatureCheck::Verified => {
                let bytes = serde_json::to_vec(&layers)
                    .map_err(|e| OciError::local(self.store.root(), e))?;
                if self.store.get("signatures", &digest).as_deref() != Some(bytes.as_slice()) {
                    self.store.put("signatures", &digest, &bytes)?;
                }
                Ok(())
            }
            SignatureCheck::Failed(why) => Err(OciError::Signature {
                reference: pinned.to_string(),
                why,
            }),
        }
    }

    async fn signature_layers(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        pinned: &OciRef,
    ) -> Result<Vec<SignatureLayer>, OciError> {
        let digest = pinned.digest.clone().unwrap_or_default();
        let sig_ref = pinned.at_tag(&signature::signature_tag(&digest));
        let bytes = match self
            .manifest_bytes(client, auth, &sig_ref, &[artifact::MANIFEST_MEDIA_TYPE])
            .await
        {
            Ok(b) => b,
            Err(OciError::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| OciError::Signature {
                reference: pinned.to_string(),
                why: format!("the signature manifest is not JSON: {e}"),
            })?;
        let mut out = Vec::new();
        for layer in v
            .get("layers")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            let media = layer.get("mediaType").and_then(|m| m.as_str());
            let sig = layer
                .pointer(&format!(
                    "/annotations/{}",
                    signature::SIGNATURE_ANNOTATION.replace('/', "~1")
                ))
                .and_then(|s| s.as_str());
            let (Some(signature::SIMPLESIGNING_MEDIA_TYPE), Some(sig)) = (media, sig) else {
                continue;
            };
            let Some(d) = layer.get("digest").and_then(|d| d.as_str()) else {
                continue;
            };
            let size = layer.get("size").and_then(|s| s.as_u64()).unwrap_or(0);
            if size > 64 * 1024 {
                continue;
            }
            let mut buf = Vec::new();
            client
                .pull_blob(&sig_ref.client_ref(), d, &mut buf)
                .await
                .map_err(|e| self.map_err(&sig_ref, false, e))?;
            if digest_of(&buf) != d {
                continue;
            }
            use base64::Engine as _;
            out.push(SignatureLayer {
                payload_b64: base64::engine::general_purpose::STANDARD.encode(&buf),
                signature: sig.to_string(),
            });
        }
        Ok(out)
    }

    /// Pushes a validated component under `r` (which needs a tag); returns the manifest digest.
    pub async fn push(
        &self,
        wasm: &[u8],
        file_name: &str,
        world: &str,
        r: &OciRef,
        annotations: PushAnnotations,
    ) -> Result<String, OciError> {
        let Some(tag) = r.tag.clone() else {
            return Err(OciError::BadReference {
                reference: r.to_string(),
                why: "push needs a :tag to publish under".to_string(),
            });
        };
        let created = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let annotations = annotations.with_defaults(file_name, Some(&tag), &created);
        let built = artifact::build(wasm, file_name, world, &annotations)?;
        if let Some(d) = &r.digest
            && d != &built.manifest_digest
        {
            return Err(OciError::BadReference {
                reference: r.to_string(),
                why: format!(
                    "the pushed manifest would be {}, not {d}",
                    built.manifest_digest
                ),
            });
        }
        let (client, auth) = self.client(r)?;
        let target = r.at_tag(&tag);
        client
            .auth(
                &target.client_ref(),
                &auth,
                oci_client::RegistryOperation::Push,
            )
            .await
            .map_err(|e| self.map_err(&target, true, e))?;
        for (bytes, digest) in [
            (built.config.clone(), built.config_digest.clone()),
            (wasm.to_vec(), built.layer_digest.clone()),
        ] {
            self.upload_blob(&client, &target, bytes, &digest).await?;
        }
        self.put_manifest(&client, &target, built.manifest).await?;
        Ok(built.manifest_digest)
    }

    async fn upload_blob(
        &self,
        client: &oci_client::Client,
        target: &OciRef,
        bytes: Vec<u8>,
        digest: &str,
    ) -> Result<(), OciError> {
        let exists = client
            .blob_exists(&target.client_ref(), digest)
            .await
            .map_err(|e| self.map_err(target, true, e))?;
        if !exists {
            client
                .push_blob(&target.client_ref(), bytes, digest)
                .await
                .map_err(|e| self.map_err(target, true, e))?;
        }
        Ok(())
    }

    async fn put_manifest(
        &self,
        client: &oci_client::Client,
        target: &OciRef,
        manifest: Vec<u8>,
    ) -> Result<(), OciError> {
        client
            .push_manifest_raw(
                &target.client_ref(),
                manifest,
                http::HeaderValue::from_static(artifact::MANIFEST_MEDIA_TYPE),
            )
            .await
            .map_err(|e| self.map_err(target, true, e))?;
        Ok(())
    }

    /// Downloads (or finds) the config blob and reads the component's shape from it.
    async fn fetch_config(
        &self,
        client: &oci_client::Client,
        r: &OciRef,
        check: &ManifestCheck,
    ) -> Result<(Fetched, ArtifactInfo), OciError> {
        let blob = Blob {
            what: "config",
            media_type: artifact::CONFIG_MEDIA_TYPE,
            digest: &check.config_digest,
            size: check.config_size,
        };
        let config = self.fetch_blob(client, r, blob, None).await?;
        let info = ArtifactInfo::new(&r.to_string(), check, &config.read()?)?;
        Ok((config, info))
    }

    /// Manifest, annotations and the component's WIT shape, without downloading the layer.
    pub async fn inspect(&self, r: &OciRef) -> Result<ArtifactInfo, OciError> {
        let (client, auth) = self.client(r)?;
        let (_, check) = self.fetch_manifest(&client, &auth, r).await?;
        let (config, info) = self.fetch_config(&client, r, &check).await?;
        config.commit(&self.store)?;
        Ok(info)
    }

    /// Signs the manifest `r` resolves to and stores the signature under `sha256-<hex>.sig`.
    pub async fn sign(&self, r: &OciRef, key: &KeyPair) -> Result<(String, String), OciError> {
        let (client, auth) = self.client(r)?;
        let (_, check) = self.fetch_manifest(&client, &auth, r).await?;
        let digest = check.digest;
        let payload = signature::payload(&r.repo_name(), &digest);
        let sig = key.sign(&payload).map_err(|why| OciError::Signature {
            reference: r.to_string(),
            why,
        })?;
        let pinned = r.pinned(&digest);
        let tag = signature::signature_tag(&digest);
        let sig_ref = pinned.at_tag(&tag);
        client
            .auth(
                &sig_ref.client_ref(),
                &auth,
                oci_client::RegistryOperation::Push,
            )
            .await
            .map_err(|e| self.map_err(&sig_ref, true, e))?;
        // Keep signatures already there (other keys), replacing an identical payload's entry.
        let mut layers: Vec<serde_json::Value> = match self
            .manifest_bytes(&client, &auth, &sig_ref, &[artifact::MANIFEST_MEDIA_TYPE])
            .await
        {
            Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("layers").and_then(|l| l.as_array()).cloned())
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let payload_digest = digest_of(&payload);
        layers.retain(|l| {
            l.pointer(&format!(
                "/annotations/{}",
                signature::SIGNATURE_ANNOTATION.replace('/', "~1")
            ))
            .and_then(|s| s.as_str())
                != Some(sig.as_str())
        });
        layers.push(serde_json::json!({
            "mediaType": signature::SIMPLESIGNING_MEDIA_TYPE,
            "digest": payload_digest,
            "size": payload.len(),
            "annotations": { signature::SIGNATURE_ANNOTATION: sig },
        }));
        let diff_ids: Vec<String> = layers
            .iter()
            .filter_map(|l| l.get("digest").and_then(|d| d.as_str()).map(str::to_string))
            .collect();
        let config = signature::signature_config(&diff_ids);
        let config_digest = digest_of(&config);
        self.upload_blob(&client, &sig_ref, payload, &payload_digest)
            .await?;
        self.upload_blob(&client, &sig_ref, config.clone(), &config_digest)
            .await?;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": artifact::MANIFEST_MEDIA_TYPE,
            "config": {
                "mediaType": signature::SIGNATURE_CONFIG_MEDIA_TYPE,
                "digest": config_digest,
                "size": config.len(),
            },
            "layers": layers,
        });
        let bytes =
            serde_json::to_vec(&manifest).map_err(|e| OciError::local(self.store.root(), e))?;
        self.put_manifest(&client, &sig_ref, bytes).await?;
        Ok((digest, tag))
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

fn one_line(s: &str) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > 300 {
        s.chars().take(300).collect::<String>() + "…"
    } else {
        s
    }
}
