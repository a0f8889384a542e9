//! Plugin distribution over OCI registries: CNCF Wasm artifacts pushed, pulled, pinned by
//! digest, cached for offline starts and checked against cosign signatures.
//!
//! Owns: references, the registry client and its auth store, the content-addressed cache, and
//! cosign signatures.
//! Must not know: wasmtime or how a component runs (a push reads only the names of its imports
//! and exports, for the config). A pulled artifact is handed on as bytes
//! only after every registry-side check (media types, layer count, digests, signature)
//! passed; the component check itself is injected ([`Validate`]).

mod artifact;
mod auth;
mod http;
mod keys;
mod reference;
mod registry;
mod signature;
mod store;
mod surface;

pub mod config;

pub use artifact::{ArtifactInfo, ManifestCheck, PushAnnotations};
pub use auth::{AuthStore, login_probe, read_password};
pub use keys::{KeyPair, PublicKey, generate_key_pair};
pub use reference::OciRef;
pub use registry::{PullPolicy, Pulled, Registry, RegistryOptions, Validate};
pub use signature::SignatureCheck;
pub use store::{CachedRef, Store};

/// One-line failures of OCI operations, each naming what failed and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference text cannot be parsed.
    #[error("invalid plugin reference {reference:?}: {why}")]
    BadReference {
        /// The text given.
        reference: String,
        /// What is wrong with it.
        why: String,
    },
    /// Plain HTTP was requested for a registry that is not allowed to use it.
    #[error(
        "refusing plain HTTP to {registry}: list it as an insecure registry, or use --plain-http for a loopback registry"
    )]
    PlainHttpRefused {
        /// The registry.
        registry: String,
    },
    /// The registry cannot be reached (DNS, connect, TLS or timeout).
    #[error(
        "cannot reach registry {registry}: {why}; check the name, the network and TLS settings"
    )]
    Unreachable {
        /// The registry.
        registry: String,
        /// What failed.
        why: String,
    },
    /// 401: no or wrong credentials.
    #[error(
        "registry {registry} refused the credentials (401 unauthorized) for {reference}; run `flotilla plugin login {registry}`"
    )]
    Unauthorized {
        /// The registry.
        registry: String,
        /// What was being accessed.
        reference: String,
    },
    /// 403: the credentials do not grant this operation.
    #[error(
        "registry {registry} denied {operation} on {reference} (403 forbidden); the account lacks that permission"
    )]
    Forbidden {
        /// The registry.
        registry: String,
        /// The operation (pull, push).
        operation: &'static str,
        /// What was being accessed.
        reference: String,
    },
    /// 404 for a tag, digest or repository.
    #[error("{reference} not found in the registry; check the repository name and tag")]
    NotFound {
        /// What was looked up.
        reference: String,
    },
    /// The artifact is not a Flotilla plugin artifact (media types, layers).
    #[error("{reference} is not a Wasm plugin artifact: {why}")]
    NotWasm {
        /// The reference.
        reference: String,
        /// What is wrong with it.
        why: String,
    },
    /// Bytes do not match their digest.
    #[error(
        "{what} of {reference} failed digest verification: expected {expected}, got {actual}; the registry copy is corrupt or tampered, nothing was cached"
    )]
    DigestMismatch {
        /// Manifest, config or layer.
        what: &'static str,
        /// The reference.
        reference: String,
        /// The expected digest.
        expected: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// Something exceeded a size cap.
    #[error("{what} of {reference} is too large ({size} bytes, limit {limit})")]
    TooLarge {
        /// What.
        what: &'static str,
        /// The reference.
        reference: String,
        /// Its size.
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// The layer is not a valid Flotilla provider component.
    #[error("{source_name} is not a usable Flotilla plugin: {why}")]
    InvalidComponent {
        /// The file or reference.
        source_name: String,
        /// The load-check failure.
        why: String,
    },
    /// Signature verification failed or no signature exists.
    #[error("signature check of {reference} failed: {why}")]
    Signature {
        /// The reference.
        reference: String,
        /// Why.
        why: String,
    },
    /// A key file could not be used.
    #[error("{path}: {why}")]
    Key {
        /// The key file.
        path: String,
        /// Why.
        why: String,
    },
    /// The registry is needed (policy `always`) but cannot be asked.
    #[error("{reference} was not loaded: {why}")]
    NeedsRegistry {
        /// The reference.
        reference: String,
        /// Why the registry was not asked or did not answer.
        why: String,
    },
    /// Login failed.
    #[error("login to {registry} failed: {why}")]
    Login {
        /// The registry.
        registry: String,
        /// Why.
        why: String,
    },
    /// Local cache or credential-store I/O failed.
    #[error("{path}: {why}")]
    Local {
        /// The file or directory.
        path: String,
        /// What failed.
        why: String,
    },
    /// Any other registry answer.
    #[error("registry {registry} failed on {reference}: {why}")]
    Registry {
        /// The registry.
        registry: String,
        /// The reference.
        reference: String,
        /// What it said.
        why: String,
    },
}

impl OciError {
    /// A local file or directory problem, named by its path.
    pub fn local(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        OciError::Local {
            path: path.display().to_string(),
            why: e.to_string(),
        }
    }
}
