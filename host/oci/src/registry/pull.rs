//! Pulling: manifests read with a size cap, blobs streamed into the cache and checked, the
//! cache consulted by pull policy, and signatures verified before anything is handed on.

use std::io::Write;

use futures_util::StreamExt;
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use sha2::{Digest, Sha256};

use crate::artifact::{self, ArtifactInfo, ManifestCheck, digest_of};
use crate::http::describe_reqwest;
use crate::keys::PublicKey;
use crate::signature::{self, SignatureCheck, SignatureLayer, SignatureManifest};
use crate::store::CachedRef;
use crate::{OciError, OciRef};

use super::{Blob, Fetched, PullPolicy, Pulled, Registry, Validate};

/// The most of a registry's error answer that is read (its JSON errors are a few hundred
/// bytes).
pub(super) const MAX_ERROR_BODY: u64 = 64 * 1024;

/// The largest signature payload read (a simple-signing payload is well under 1 KiB).
const MAX_SIGNATURE_PAYLOAD: u64 = 64 * 1024;

/// What a bounded GET reads: its name in errors, the `Accept` header, and the most bytes of a
/// successful answer.
struct Bounded<'a> {
    what: &'static str,
    accept: &'a str,
    limit: u64,
}

impl Registry {
    pub(super) async fn fetch_manifest(
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
    pub(super) async fn manifest_bytes(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        r: &OciRef,
        accept: &[&str],
    ) -> Result<Vec<u8>, OciError> {
        let target = r.digest.as_deref().or(r.tag.as_deref()).unwrap_or("latest");
        let url = format!(
            "{}/v2/{}/manifests/{target}",
            self.base_url(r)?,
            r.repository
        );
        let read = Bounded {
            what: "manifest",
            accept: &accept.join(", "),
            limit: artifact::MAX_MANIFEST,
        };
        self.bounded_get(client, auth, r, url, read).await
    }

    /// GETs `url` of `r`'s repository with oci-client's authentication, reading at most
    /// `read.limit` bytes of an answer (64 KiB of an error's), so a registry that sends an
    /// endless body costs a bounded buffer and gets an error that names the size.
    async fn bounded_get(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        r: &OciRef,
        url: String,
        read: Bounded<'_>,
    ) -> Result<Vec<u8>, OciError> {
        let token = self.pull_token(client, auth, r).await?;
        let mut request = self
            .http()?
            .get(&url)
            .header(reqwest::header::ACCEPT, read.accept);
        request = match (token, auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            _ => request,
        };
        let unreachable = |e: reqwest::Error| OciError::Unreachable {
            registry: r.registry.clone(),
            why: describe_reqwest(&e),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let (limit, what) = if status.is_success() {
            (read.limit, read.what)
        } else {
            (MAX_ERROR_BODY, "error answer")
        };
        let body = read_limited(response, limit, what, r).await?;
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
    pub(super) async fn fetch_blob(
        &self,
        client: &oci_client::Client,
        r: &OciRef,
        blob: Blob<'_>,
        validate: Option<Validate<'_>>,
    ) -> Result<Fetched, OciError> {
        let Blob {
            what: _,
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
        let download = self.download(&mut stream, &mut tmp, r, &blob).await?;
        download.verify(r, &blob)?;
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

    /// Streams a blob into `tmp`, hashing it, never past its size; what came (an interrupted
    /// stream is not an error yet: [`Download::verify`] says what it means).
    async fn download<S, B>(
        &self,
        stream: &mut S,
        tmp: &mut tempfile::NamedTempFile,
        r: &OciRef,
        blob: &Blob<'_>,
    ) -> Result<Download, OciError>
    where
        S: futures_util::Stream<Item = Result<B, std::io::Error>> + Unpin,
        B: AsRef<[u8]>,
    {
        let (what, digest, size) = (blob.what, blob.digest, blob.size);
        let tmp_path = tmp.path().to_path_buf();
        let bar = self.progress_bar(size, what);
        let mut hasher = Sha256::new();
        let mut got: u64 = 0;
        let mut stream_error = None;
        while let Some(chunk) = stream.next().await {
            let bytes = match chunk {
                Ok(bytes) => bytes,
                Err(e) => {
                    stream_error = Some(e);
                    break;
                }
            };
            let bytes = bytes.as_ref();
            got += bytes.len() as u64;
            if got > size {
                return Err(OciError::DigestMismatch {
                    what,
                    reference: r.to_string(),
                    expected: format!("{digest} ({size} bytes)"),
                    actual: format!("more than {size} bytes"),
                });
            }
            hasher.update(bytes);
            tmp.write_all(bytes)
                .map_err(|e| OciError::local(&tmp_path, e))?;
            if let Some(b) = &bar {
                b.set_position(got);
            }
        }
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        Ok(Download {
            got,
            actual: format!("sha256:{}", hex::encode(hasher.finalize())),
            interrupted: stream_error.map(|e| {
                match e.get_ref().and_then(|i| i.downcast_ref::<reqwest::Error>()) {
                    Some(inner) => describe_reqwest(inner),
                    None => e.to_string(),
                }
            }),
        })
    }

    pub(super) fn progress_bar(&self, size: u64, what: &str) -> Option<indicatif::ProgressBar> {
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

    pub(super) fn cache_key(r: &OciRef) -> String {
        match (&r.tag, &r.digest) {
            (_, Some(d)) => format!("{}@{d}", r.repo_name()),
            (Some(t), None) => format!("{}:{t}", r.repo_name()),
            (None, None) => r.repo_name(),
        }
    }

    /// A cached artifact for `r`, if its manifest, layer and (when asked) signature are cached.
    pub(super) fn cached(
        &self,
        r: &OciRef,
        key: Option<&PublicKey>,
    ) -> Result<Option<Pulled>, OciError> {
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
                match signature::check(key, &digest, &r.repo_name(), &layers) {
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

    pub(super) fn cached_signatures(&self, digest: &str) -> Vec<SignatureLayer> {
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
        let limit = self.opts.pull_timeout;
        let pulled = tokio::time::timeout(limit, self.pull_remote(r, key, validate))
            .await
            .unwrap_or_else(|_| {
                Err(OciError::Unreachable {
                    registry: r.registry.clone(),
                    why: format!(
                        "the pull did not finish within {} ([oci] pull_timeout)",
                        humantime::format_duration(limit)
                    ),
                })
            });
        match pulled {
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

    pub(super) async fn pull_remote(
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
    pub(super) async fn verify_remote(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        pinned: &OciRef,
        key: &PublicKey,
    ) -> Result<(), OciError> {
        let digest = pinned.digest.clone().unwrap_or_default();
        let layers = self.signature_layers(client, auth, pinned).await?;
        match signature::check(key, &digest, &pinned.repo_name(), &layers) {
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

    pub(super) async fn signature_layers(
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
        let manifest: SignatureManifest =
            serde_json::from_slice(&bytes).map_err(|e| OciError::Signature {
                reference: pinned.to_string(),
                why: format!("the signature manifest is not one: {e}"),
            })?;
        let mut out = Vec::new();
        for layer in &manifest.layers {
            let Some(sig) = layer.signature() else {
                continue;
            };
            let d = layer.digest.as_str();
            let declared = layer.size;
            if declared > MAX_SIGNATURE_PAYLOAD {
                continue;
            }
            // Read no more than the layer declares: oci-client's pull_blob would take all a
            // registry sends and check the digest only at the end.
            let url = format!(
                "{}/v2/{}/blobs/{d}",
                self.base_url(&sig_ref)?,
                sig_ref.repository
            );
            let read = Bounded {
                what: "signature payload",
                accept: "*/*",
                limit: declared,
            };
            let buf = self.bounded_get(client, auth, &sig_ref, url, read).await?;
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

    /// Downloads (or finds) the config blob and reads the component's shape from it.
    pub(super) async fn fetch_config(
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
}

/// What a blob download produced, before it is trusted.
struct Download {
    got: u64,
    actual: String,
    /// Why the stream ended early, if it did.
    interrupted: Option<String>,
}

impl Download {
    /// A complete download whose digest matches; a wrong digest is reported before an
    /// interruption, since a registry that sent the wrong bytes is the finding.
    fn verify(&self, r: &OciRef, blob: &Blob<'_>) -> Result<(), OciError> {
        let (what, digest, size) = (blob.what, blob.digest, blob.size);
        if self.got == size && self.actual != digest {
            return Err(OciError::DigestMismatch {
                what,
                reference: r.to_string(),
                expected: digest.to_string(),
                actual: self.actual.clone(),
            });
        }
        if let Some(why) = &self.interrupted {
            return Err(OciError::Unreachable {
                registry: r.registry.clone(),
                why: format!(
                    "download of the {what} was interrupted after {} bytes: {why}",
                    self.got
                ),
            });
        }
        if self.got != size || self.actual != digest {
            return Err(OciError::DigestMismatch {
                what,
                reference: r.to_string(),
                expected: format!("{digest} ({size} bytes)"),
                actual: format!("{} ({} bytes)", self.actual, self.got),
            });
        }
        Ok(())
    }
}

/// Reads at most `limit` bytes of an answer, or says how large it was (declared or seen), so
/// an endless body costs a bounded buffer.
pub(super) async fn read_limited(
    mut response: reqwest::Response,
    limit: u64,
    what: &'static str,
    r: &OciRef,
) -> Result<Vec<u8>, OciError> {
    let too_large = |size: u64| OciError::TooLarge {
        what,
        reference: r.to_string(),
        size,
        limit,
    };
    if let Some(len) = response.content_length()
        && len > limit
    {
        return Err(too_large(len));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| OciError::Unreachable {
        registry: r.registry.clone(),
        why: describe_reqwest(&e),
    })? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(too_large((body.len() + chunk.len()) as u64));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
