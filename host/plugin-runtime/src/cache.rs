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
    /// The cache in `dir`, made 0700 when missing. Compiled code is mapped and run as it is
    /// (wasmtime's `deserialize_file` trusts it), so a directory someone else could write in
    /// (another user's, a symbolic link, group- or world-writable) is not used: plugins are
    /// compiled at every load instead, and a warning says why.
    pub(crate) fn new(dir: Option<PathBuf>) -> Result<Self, LoadError> {
        if let Some(dir) = &dir {
            flotilla_net::fs::create_private_dir(dir)
                .map_err(|e| LoadError::Cache(format!("cannot create {}: {e}", dir.display())))?;
            if let Some(why) = flotilla_net::fs::untrusted_dir(dir) {
                tracing::warn!(
                    cache_dir = %dir.display(),
                    "not using the compiled-plugin cache: {why}; plugins are compiled at every load (remove the directory, or make it yours and chmod 700)"
                );
                return Ok(CompileCache { dir: None });
            }
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
        let entry = self
            .entry(engine, sha)
            .filter(|e| flotilla_net::fs::trusted_file(e))?;
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
        if let Some(entry) = entry
            .as_deref()
            .filter(|e| flotilla_net::fs::trusted_file(e))
        {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache directory others could write in is not used: a planted entry is never mapped,
    /// and the plugin is compiled instead.
    #[cfg(unix)]
    #[test]
    fn a_cache_directory_others_could_write_in_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let engine = Engine::default();
        // The smallest component: the preamble of version 0x0d, layer 1.
        let wasm = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
        let sha = flotilla_net::sha256_hex(&wasm);
        let root = tempfile::tempdir().expect("dir");
        let shared = root.path().join("shared");
        let cache = CompileCache::new(Some(shared.clone())).expect("cache");
        let (_, first) = cache.load(&engine, "p.wasm", &sha, &wasm).expect("load");
        assert!(matches!(first, CacheOutcome::Compiled { .. }), "{first:?}");
        let (_, again) = cache.load(&engine, "p.wasm", &sha, &wasm).expect("load");
        assert_eq!(again, CacheOutcome::Hit);
        // Opened to everyone: an entry there may be anyone's.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let wide = CompileCache::new(Some(shared.clone())).expect("cache");
        let (_, wide_load) = wide.load(&engine, "p.wasm", &sha, &wasm).expect("load");
        assert!(
            matches!(wide_load, CacheOutcome::Uncached { .. }),
            "{wide_load:?}"
        );
        // A private directory, but an entry someone made writable by others is not mapped.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let private = CompileCache::new(Some(shared.clone())).expect("cache");
        let entry = private.entry(&engine, &sha).expect("entry");
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let (_, planted) = private.load(&engine, "p.wasm", &sha, &wasm).expect("load");
        assert!(
            matches!(planted, CacheOutcome::Compiled { .. }),
            "{planted:?}"
        );
        // A symbolic link to a directory is not a cache either.
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&shared, &link).expect("symlink");
        let linked = CompileCache::new(Some(link)).expect("cache");
        let (_, through) = linked.load(&engine, "p.wasm", &sha, &wasm).expect("load");
        assert!(
            matches!(through, CacheOutcome::Uncached { .. }),
            "{through:?}"
        );
    }
}
