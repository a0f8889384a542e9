//! Content digests: the sha256 that names a plugin everywhere (logs, caches, OCI digests).

use sha2::{Digest, Sha256};

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `sha256:<hex>`, the OCI form of a digest.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}
