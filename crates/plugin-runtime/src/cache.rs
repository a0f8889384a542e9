//! On-disk cache of compiled plugins, keyed by the wasm's sha256 and the engine's
//! precompile compatibility hash, so a restart does not recompile.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
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

/// The default cache directory: `$XDG_CACHE_HOME/flotilla/compiled` or the platform's.
pub fn default_cache_dir() -> Option<PathBuf> {
    directories::ProjectDirs::from("dev", "flotilla", "flotilla")
        .map(|d| d.cache_dir().join("compiled"))
}
