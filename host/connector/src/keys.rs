//! A pool's SSH key pair. The host generates an ed25519 key at first start (mode 0600 in a
//! 0700 directory) and reuses it across restarts, or reads one the operator names. Only the
//! public half is ever shown; `Debug` redacts the private half.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use russh::keys::ssh_key::LineEnding;
use russh::keys::{Algorithm, HashAlg, PrivateKey};

/// Why a key could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file cannot be read or written.
    #[error("{path}: {why}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        why: String,
    },
    /// Group or others may read the private key; OpenSSH refuses such keys, and so do we.
    #[error(
        "{path}: permissions {mode:o} are too open; the private key must be readable by its owner only (chmod 600)"
    )]
    TooOpen {
        /// The file.
        path: String,
        /// Its mode bits.
        mode: u32,
    },
    /// Not an OpenSSH private key, or one with a passphrase.
    #[error("{path}: not an unencrypted OpenSSH private key ({why})")]
    Invalid {
        /// The file.
        path: String,
        /// What the parser said.
        why: String,
    },
}

/// A pool's key pair.
#[derive(Clone)]
pub struct PoolKey {
    private: Arc<PrivateKey>,
    public: String,
    fingerprint: String,
}

impl std::fmt::Debug for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolKey")
            .field("public", &self.public)
            .field("private", &"<redacted>")
            .finish()
    }
}

fn io(path: &Path, e: impl std::fmt::Display) -> KeyError {
    KeyError::Io {
        path: path.display().to_string(),
        why: e.to_string(),
    }
}

impl PoolKey {
    fn from_private(private: PrivateKey, path: &Path) -> Result<PoolKey, KeyError> {
        let public = private.public_key().to_openssh().map_err(|e| io(path, e))?;
        let fingerprint = private
            .public_key()
            .fingerprint(HashAlg::Sha256)
            .to_string();
        Ok(PoolKey {
            private: Arc::new(private),
            public,
            fingerprint,
        })
    }

    /// Reads an unencrypted OpenSSH private key that only its owner may read.
    pub fn load(path: &Path) -> Result<PoolKey, KeyError> {
        check_mode(path)?;
        let text = std::fs::read_to_string(path).map_err(|e| io(path, e))?;
        let private = PrivateKey::from_openssh(&text).map_err(|e| KeyError::Invalid {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
        if private.is_encrypted() {
            return Err(KeyError::Invalid {
                path: path.display().to_string(),
                why: "it has a passphrase".to_string(),
            });
        }
        PoolKey::from_private(private, path)
    }

    /// The pool's key under `dir` (`<dir>/<pool>/id_ed25519`), generated on first use.
    pub fn load_or_generate(dir: &Path, pool: &str) -> Result<PoolKey, KeyError> {
        let pool_dir = dir.join(pool);
        let path = pool_dir.join("id_ed25519");
        if path.exists() {
            return PoolKey::load(&path);
        }
        flotilla_net::fs::create_private_dir(&pool_dir).map_err(|e| io(&pool_dir, e))?;
        let mut private = PrivateKey::random(&mut russh::keys::key::safe_rng(), Algorithm::Ed25519)
            .map_err(|e| io(&path, e))?;
        private.set_comment(format!("flotilla-pool-{pool}"));
        let pem = private
            .to_openssh(LineEnding::LF)
            .map_err(|e| io(&path, e))?;
        // The temporary file is created 0600, so the key is never readable by others.
        flotilla_net::fs::write_atomic(&path, pem.as_bytes()).map_err(|e| io(&path, e))?;
        let key = PoolKey::from_private(private, &path)?;
        let public_path: PathBuf = pool_dir.join("id_ed25519.pub");
        flotilla_net::fs::write_atomic(&public_path, format!("{}\n", key.public).as_bytes())
            .map_err(|e| io(&public_path, e))?;
        tracing::info!(pool, fingerprint = %key.fingerprint, file = %path.display(), "generated the pool's SSH key");
        Ok(key)
    }

    /// The public half, `ssh-ed25519 AAAA... flotilla-pool-<name>`, for authorized_keys.
    pub fn public_openssh(&self) -> &str {
        &self.public
    }

    /// `SHA256:...`, as `ssh-keygen -l` prints it.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    pub(crate) fn private(&self) -> Arc<PrivateKey> {
        self.private.clone()
    }
}

#[cfg(unix)]
pub(crate) fn check_mode(path: &Path) -> Result<(), KeyError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| io(path, e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(KeyError::TooOpen {
            path: path.display().to_string(),
            mode: mode & 0o777,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn check_mode(_: &Path) -> Result<(), KeyError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_is_reused_on_the_next_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let first = PoolKey::load_or_generate(dir.path(), "p").expect("generate");
        let second = PoolKey::load_or_generate(dir.path(), "p").expect("reload");
        assert_eq!(first.public_openssh(), second.public_openssh());
        assert!(first.public_openssh().starts_with("ssh-ed25519 "));
    }

    #[cfg(unix)]
    #[test]
    fn the_private_key_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        PoolKey::load_or_generate(dir.path(), "p").expect("generate");
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("p/id_ed25519"), 0o600);
        assert_eq!(mode("p"), 0o700);
    }

    #[cfg(unix)]
    #[test]
    fn a_key_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        PoolKey::load_or_generate(dir.path(), "p").expect("generate");
        let path = dir.path().join("p/id_ed25519");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(
            PoolKey::load(&path),
            Err(KeyError::TooOpen { .. })
        ));
    }

    #[test]
    fn debug_output_never_holds_the_private_key() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = PoolKey::load_or_generate(dir.path(), "p").expect("generate");
        let pem = std::fs::read_to_string(dir.path().join("p/id_ed25519")).expect("read");
        let body: String = pem.lines().nth(1).unwrap_or_default().to_string();
        assert!(!format!("{key:?}").contains(&body));
    }
}
