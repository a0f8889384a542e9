//! The peers the host's tests run against, each started on loopback and stopped when dropped:
//! real ones (Debian `sshd` machines, `dockerd` engines, the CNCF distribution registry,
//! moto's server with SigV4 checking on) and stand-ins where no emulator exists (the Compute
//! Engine and the scale-set APIs with their token endpoints, each behaviour citing its
//! source; the example cloud; slow and recording proxies). Also the one process runner
//! (`process`) and the one poll (`poll`) every test waits with.
//!
//! Owns: starting, stopping and inspecting peers.
//! Must not know: any Flotilla crate. A room's tests use these beside the room itself; binding
//! a plugin to a peer is the harness's (`flotilla-harness`, `clouds`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test
#![allow(missing_docs)] // helpers named for what they start or return; read with the tests
#![allow(dead_code)]

pub mod azure_cloud;
pub mod cache_stores;
pub mod dockerd;
pub mod fake_engine;
pub mod gcp_cloud;
pub mod gitlab;
pub mod helper_image;
pub mod moto;
pub mod netaddr;
pub mod peer;
pub mod poll;
pub mod process;
pub mod proxy;
pub mod registry;
pub mod runner_scripts;
pub mod serve;
pub mod sshd;
