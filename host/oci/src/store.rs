//! The local artifact cache: content-addressed blobs and manifests plus a tag index, written
//! atomically (temporary file, verify, rename) so an interrupted or failed pull leaves nothing.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::OciError;
use super::reference::valid_digest;

/// What the cache knows about one pulled reference.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CachedRef {
    /// `registry/repository[:tag]` as pulled.
    pub reference: String,
    /// The manifest digest it resolved to.
    pub digest: String,
    /// The wasm layer digest.
    pub layer_digest: String,
    /// The wasm layer size in bytes.
    pub size: u64,
    /// When it was resolved (RFC 3339).
    pub resolved_at: String,
    /// Whether a signature was verified for it (and is cached).
    #[serde(default)]
    pub signature_verified: bool,
}

/// The on-disk cache rooted at `<cache>/oci`.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

fn hex_of(digest: &str) -> Option<&str> {
    valid_digest(digest)
        .then(|| digest.strip_prefix("sha256:"))
        .flatten()
}

impl Store {
    /// Opens (creating, mode 0700) the cache at `root`.
    pub fn open(root: &Path) -> Result<Self, OciError> {
        for sub in [
            "blobs/sha256",
            "manifests/sha256",
            "signatures/sha256",
            "tmp",
        ] {
            let dir = root.join(sub);
            let mut builder = std::fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::DirBuilderExt;
                builder.mode(0o700);
            }
            builder.create(&dir).map_err(|e| {
                OciError::local(&dir, format!("cannot create cache directory: {e}"))
            })?;
        }
        Ok(Store {
            root: root.to_path_buf(),
        })
    }

    /// Opens `<cache_dir>/oci`, or the user's cache (`~/.cache/flotilla/oci`) without one.
    pub fn for_cache_dir(cache_dir: Option<&Path>) -> Result<Self, OciError> {
        let root = match cache_dir {
            Some(dir) => dir.join("oci"),
            None => directories::ProjectDirs::from("dev", "flotilla", "flotilla")
                .map(|d| d.cache_dir().join("oci"))
                .ok_or_else(|| OciError::Local {
                    path: "(cache)".to_string(),
                    why: "no user cache directory; set cache_dir (or --cache-dir)".to_string(),
                })?,
        };
        Self::open(&root)
    }

    /// Where the cache lives.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_for(&self, kind: &str, digest: &str) -> Result<PathBuf, OciError> {
        let hex = hex_of(digest).ok_or_else(|| OciError::Local {
            path: self.root.display().to_string(),
            why: format!("{digest:?} is not a sha256 digest"),
        })?;
        Ok(self.root.join(kind).join("sha256").join(hex))
    }

    /// A temporary file inside the cache (same filesystem, so the final rename is atomic);
    /// it is deleted when dropped unless persisted.
    pub(crate) fn temp(&self) -> Result<tempfile::NamedTempFile, OciError> {
        let dir = self.root.join("tmp");
        tempfile::NamedTempFile::new_in(&dir).map_err(|e| OciError::local(&dir, e))
    }

    /// Moves a verified temporary file to its content address.
    pub(crate) fn commit_blob(
        &self,
        tmp: tempfile::NamedTempFile,
        digest: &str,
    ) -> Result<PathBuf, OciError> {
        let path = self.path_for("blobs", digest)?;
        tmp.persist(&path)
            .map_err(|e| OciError::local(&path, e.error))?;
        Ok(path)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), OciError> {
        let mut tmp = self.temp()?;
        tmp.write_all(bytes)
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| OciError::local(path, e))?;
        tmp.persist(path)
            .map_err(|e| OciError::local(path, e.error))?;
        Ok(())
    }

    /// Stores verified bytes under their digest (manifests, configs, signatures).
    pub(crate) fn put(&self, kind: &str, digest: &str, bytes: &[u8]) -> Result<PathBuf, OciError> {
        let path = self.path_for(kind, digest)?;
        self.write_atomic(&path, bytes)?;
        Ok(path)
    }

    /// Reads bytes stored under a digest, re-verifying them; a corrupt entry counts as absent.
    pub(crate) fn get(&self, kind: &str, digest: &str) -> Option<Vec<u8>> {
        let path = self.path_for(kind, digest).ok()?;
        let bytes = std::fs::read(&path).ok()?;
        let actual = flotilla_net::sha256_digest(&bytes);
        if kind != "signatures" && actual != digest {
            tracing::warn!(path = %path.display(), "cached entry does not match its digest; ignoring it");
            // Not removable means it stays ignored: every read re-checks the digest.
            let _ = std::fs::remove_file(&path);
            return None;
        }
        Some(bytes)
    }

    fn index_path(&self) -> PathBuf {
        self.root.join("refs.json")
    }

    /// The tag index: reference text to what it resolved to.
    pub fn index(&self) -> BTreeMap<String, CachedRef> {
        std::fs::read(self.index_path())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Records a resolution (tag or digest) in the index.
    pub(crate) fn record(&self, entry: CachedRef) -> Result<(), OciError> {
        let mut index = self.index();
        index.insert(entry.reference.clone(), entry);
        let bytes = serde_json::to_vec_pretty(&index)
            .map_err(|e| OciError::local(&self.index_path(), e))?;
        self.write_atomic(&self.index_path(), &bytes)
    }

    /// The cached resolution of a reference text, if any.
    pub fn lookup(&self, key: &str) -> Option<CachedRef> {
        self.index().remove(key)
    }

    /// The path of a cached blob.
    pub fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        self.path_for("blobs", digest).ok().filter(|p| p.is_file())
    }
}
