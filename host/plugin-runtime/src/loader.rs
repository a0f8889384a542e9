//! Where a plugin's bytes come from: a file, the binary (`builtin:NAME`), or an OCI artifact pulled (or found in the cache)
//! by `flotilla-oci`. The registry is handed a validation closure, so it never learns what a
//! component is; this module is the only place the two meet.

use std::path::PathBuf;

use flotilla_oci::{OciError, OciRef, PublicKey, PullPolicy, Registry};

use crate::{LoadError, LoadedPlugin, PluginRuntime};

/// The prefix of an embedded plugin's reference in a config: `builtin:NAME`.
pub const BUILTIN_PREFIX: &str = "builtin:";

/// A plugin the binary embeds. The runtime does not know which plugins those are: the binary
/// hands their names and bytes to the config ([`crate::config::SourceConfig::embedded`]), so
/// building the runtime builds no plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Embedded {
    /// The name after `builtin:`.
    pub name: &'static str,
    /// The component.
    pub bytes: &'static [u8],
}

/// A pool's `plugin = ...`.
#[derive(Debug, Clone)]
pub enum PluginSource {
    /// A local `.wasm` file.
    File(PathBuf),
    /// An official plugin embedded in the binary (`builtin:NAME`).
    Builtin(Embedded),
    /// A registry artifact.
    Oci {
        /// The reference.
        reference: OciRef,
        /// When to ask the registry.
        pull_policy: PullPolicy,
        /// Public key that must have signed it.
        verify_key: Option<PathBuf>,
    },
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginSource::File(p) => write!(f, "{}", p.display()),
            PluginSource::Builtin(b) => write!(f, "{BUILTIN_PREFIX}{}", b.name),
            PluginSource::Oci { reference, .. } => write!(f, "{reference}"),
        }
    }
}

/// Why a plugin could not be loaded from its source.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// The component failed the load checks.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The registry, the cache or the signature check failed.
    #[error(transparent)]
    Oci(#[from] OciError),
    /// An `oci://` plugin was asked for without a registry client.
    #[error("{0}: an oci:// plugin needs a registry client")]
    NoRegistry(String),
    /// The pulled file cannot be read back.
    #[error("{path}: {source}")]
    Read {
        /// The cached file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The bytes in the cache do not hash to the layer digest, even after a fresh pull.
    #[error("{0}: the wasm does not match its digest, even after a fresh pull")]
    DigestMismatch(String),
}

/// The check a downloaded component passes before it enters the cache: the full plugin load
/// checks (compiling into the compile cache, so the load that follows is a cache hit).
pub fn component_check<'a>(
    runtime: &'a PluginRuntime,
    source: &'a str,
) -> impl Fn(&[u8]) -> Result<(), String> + Sync + 'a {
    move |bytes: &[u8]| {
        runtime
            .load_bytes(source, bytes)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Loads a pool's plugin from its file, or pulls (or finds in the cache) its OCI artifact.
pub async fn load_plugin(
    runtime: &PluginRuntime,
    registry: Option<&Registry>,
    pool: &str,
    source: &PluginSource,
) -> Result<LoadedPlugin, LoaderError> {
    match source {
        PluginSource::File(path) => Ok(runtime.load_file(path)?),
        PluginSource::Builtin(builtin) => {
            Ok(runtime.load_bytes(&source.to_string(), builtin.bytes)?)
        }
        PluginSource::Oci {
            reference,
            pull_policy,
            verify_key,
        } => {
            let registry =
                registry.ok_or_else(|| LoaderError::NoRegistry(reference.to_string()))?;
            let key = verify_key.as_deref().map(PublicKey::load).transpose()?;
            let source = reference.to_string();
            let validate = component_check(runtime, &source);
            // A cached blob corrupted on disk is evicted and fetched once more.
            for attempt in 0..2 {
                let pulled = registry
                    .pull(reference, *pull_policy, key.as_ref(), Some(&validate))
                    .await?;
                tracing::info!(pool = %pool, reference = %reference, digest = %pulled.digest, from_cache = pulled.from_cache, signature_verified = pulled.verified, "plugin artifact resolved");
                let bytes = std::fs::read(&pulled.wasm).map_err(|e| LoaderError::Read {
                    path: pulled.wasm.display().to_string(),
                    source: e,
                })?;
                let loaded = runtime.load_bytes(&pulled.reference.to_string(), &bytes);
                let sha256 = match &loaded {
                    Ok(plugin) => plugin.sha256.clone(),
                    Err(_) => flotilla_net::sha256_hex(&bytes),
                };
                if format!("sha256:{sha256}") == pulled.layer_digest {
                    return Ok(loaded?);
                }
                registry.evict(&pulled);
                if attempt == 1 || !pulled.from_cache {
                    break;
                }
            }
            Err(LoaderError::DigestMismatch(reference.to_string()))
        }
    }
}
