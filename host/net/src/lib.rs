//! Leaf utilities shared by the host's rooms: the allow-list grammar ([`AllowList`]), address
//! classes ([`blocked_reason`]), content digests, and private atomic files.
//!
//! Owns: pure parsing and classification, and the one way the host writes private files.
//! Must not know: pools, plugins, wasmtime, HTTP clients or config files.

mod digest;
pub mod fs;
mod hosts;
mod ip;

pub use digest::{sha256_digest, sha256_hex};
pub use hosts::{AllowList, AllowListError, AllowedHost, NotAllowed};
pub use ip::blocked_reason;
