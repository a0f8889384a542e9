//! On-disk cache of compiled plugins, keyed by the wasm's sha256 and the engine's
//! precompile compatibility hash, so a restart does not recompile.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use wasmtime::Engine;
use wasmtime::component::Component;

use super::inspect::LoadError;

/// Whether a load compiled or reused compiled code, so tests and `plugin check` can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "outcome")]
pub enum CacheOutcome {
    /// Loaded from the cache (memory-mapped), no compilation.
    Hit,
    /// Compiled now and stored.
    Compiled {
        /// How long compilation took, in milliseconds.
        millis: u128,
    },
    /// Compiled now; caching is disabled.
    Uncached {
        /// How long compilation took, in milliseconds.
        millis: u128,
    },
}

/// Where compiled plugins live; `None` disables caching.
#[derive(Debug, Clone)]
pub(crate) struct CompileCache {
    dir: Option<PathBuf>,
}

fn engine_key(engine: &Engine) -> String {
    let mut h = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

fn elapsed_ms(start: Instant) -> u128 {
    Duration::as_millis(&start.elapsed())
}

impl CompileCache {
    pub(crate) fn new(dir: Option<PathBuf>) -> Result<Self, LoadError> {
        if let Some(dir) = &dir {
            flotilla_net::fs::create_private_dir(dir)
                .map_err(|e| LoadError::Cache(format!("cannot create {}: {e}", dir.display())))?;
        }
        Ok(CompileCache { dir })
    }

    fn entry(&self, engine: &Engine, sha: &str) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{sha}-{}.cwasm", engine_key(engine))))
    }

    /// The compiled entry for a plugin file whose content is known without reading it: the
    /// file's identity (see [`FileIdentity`]) is the one recorded when its sha256 was last
    /// computed, and the entry for that sha256 exists. `None` means "read and hash the file".
    pub(crate) fn known(&self, engine: &Engine, path: &Path) -> Option<(String, PathBuf, u64)> {
        let dir = self.dir.as_ref()?;
        let identity = FileIdentity::of(path)?;
        let recorded = std::fs::read_to_string(index_file(dir, path)?).ok()?;
        let (seen, sha) = recorded.split_once('\n')?;
        if seen != identity.text || sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let entry = self.entry(engine, sha).filter(|e| e.is_file())?;
        Some((sha.to_string(), entry, identity.size))
    }

    /// Records that the file at `path`, with the identity it had before it was read, hashes
    /// to `sha`. Best effort: without the record the next load just hashes again.
    pub(crate) fn remember(&self, path: &Path, before: Option<FileIdentity>, sha: &str) {
        let (Some(dir), Some(identity)) = (&self.dir, before) else {
            return;
        };
        let Some(index) = index_file(dir, path) else {
            return;
        };
        let write = index
            .parent()
            .map_or(Ok(()), flotilla_net::fs::create_private_dir)
            .and_then(|()| {
                flotilla_net::fs::write_atomic(
                    &index,
                    format!("{}\n{sha}", identity.text).as_bytes(),
                )
            });
        if let Err(e) = write {
            tracing::debug!(index = %index.display(), "cannot record the plugin's identity: {e}");
        }
    }

    /// Deserializes a cache entry found by [`CompileCache::known`].
    pub(crate) fn load_entry(&self, engine: &Engine, entry: &Path) -> Option<Component> {
        // SAFETY: as in `load`: the entry was written by this host into its 0700 directory,
        // atomically, and is named by content and engine hash; wasmtime checks the header.
        #[allow(unsafe_code)]
        let deserialized = unsafe { Component::deserialize_file(engine, entry) };
        deserialized
            .inspect_err(|e| tracing::warn!(cache_entry = %entry.display(), "unusable compiled plugin: {e:#}"))
            .ok()
    }

    /// Loads compiled code for `bytes`, compiling (and storing) it on a miss.
    pub(crate) fn load(
        &self,
        engine: &Engine,
        path: &str,
        sha: &str,
        bytes: &[u8],
    ) -> Result<(Component, CacheOutcome), LoadError> {
        let entry = self.entry(engine, sha);
        if let Some(entry) = entry.as_deref().filter(|e| e.is_file()) {
            // SAFETY: the cache directory is created by the host with mode 0700 and only the
            // host writes to it, atomically (write to a temp file, then rename). Files are named
            // by content hash and engine compatibility hash, and wasmtime checks the header.
            #[allow(unsafe_code)]
            let deserialized = unsafe { Component::deserialize_file(engine, entry) };
            match deserialized {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(e) => tracing::warn!(
                    cache_entry = %entry.display(),
                    "discarding unusable compiled plugin: {e:#}"
                ),
            }
        }
        let start = Instant::now();
        let component = Component::new(engine, bytes).map_err(|e| LoadError::Invalid {
            path: path.to_string(),
            message: format!("{e:#}"),
        })?;
        let millis = elapsed_ms(start);
        let Some(entry) = entry else {
            return Ok((component, CacheOutcome::Uncached { millis }));
        };
        match component
            .serialize()
            .map_err(|e| format!("{e:#}"))
            .and_then(|code| {
                flotilla_net::fs::write_atomic(&entry, &code).map_err(|e| e.to_string())
            }) {
            Ok(()) => Ok((component, CacheOutcome::Compiled { millis })),
            Err(e) => {
                tracing::warn!(cache_entry = %entry.display(), "cannot store compiled plugin: {e}");
                Ok((component, CacheOutcome::Uncached { millis }))
            }
        }
    }
}

/// What identifies a file's content without reading it: device, inode, size, and the
/// modification and change times in nanoseconds. Any write, truncation, rename over it or
/// permission change moves the change time, which users cannot set, so an unchanged identity
/// means unchanged bytes. Unix only; elsewhere every load hashes the file.
pub(crate) struct FileIdentity {
    text: String,
    size: u64,
}

impl FileIdentity {
    #[cfg(unix)]
    pub(crate) fn of(path: &Path) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileIdentity {
            text: format!(
                "{} {} {} {}.{:09} {}.{:09}",
                m.dev(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec()
            ),
            size: m.size(),
        })
    }

    #[cfg(not(unix))]
    pub(crate) fn of(_path: &Path) -> Option<FileIdentity> {
        None
    }
}

/// Where the identity record of the plugin file at `path` lives: named by the sha256 of its
/// absolute path.
fn index_file(dir: &Path, path: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(path).ok()?;
    let name = flotilla_net::sha256_hex(absolute.as_os_str().as_encoded_bytes());
    Some(dir.join("by-path").join(name))
}

/// The default cache directory: `$XDG_CACHE_HOME/flotilla/compiled` or the platform's.
pub fn default_cache_dir() -> Option<PathBuf> {
    directories::ProjectDirs::from("dev", "flotilla", "flotilla")
        .map(|d| d.cache_dir().join("compiled"))
}
