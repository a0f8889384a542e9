//! The connector: how the host reaches an instance before it gives it a job.
//!
//! Owns: each pool's SSH key pair (generated under the state directory, or read from a file;
//! the private half never leaves the host), host-key trust (pinned per instance for its life,
//! or a known_hosts file), SSH sessions with timeouts, the user's ready command, and the
//! [`flotilla_scaler::Readiness`] that says an instance can take jobs, and Docker Engine on a
//! leased instance forwarded to the lease holder through the host (`proxy`), and commands run
//! on a leased machine for the lease holder over the host's session (`exec`).
//! Must not know: wasmtime, scaling policy, the API or config files (it receives its
//! settings already validated).

pub mod channels;
pub mod config;
mod docker;
mod exec;
mod hostkeys;
mod idle;
mod keys;
mod proxy;
mod readiness;
mod ssh;
mod targets;
mod tls;

pub use channels::{LeaseBody, LeaseChannels, LeaseEnded};
pub use config::{ConnectorConfig, ConnectorSettings, HostKeyConfig};
pub use exec::{ExecEvent, ExecInput, Pty};
pub use hostkeys::HostKeyPolicy;
pub use keys::{KeyError, PoolKey};
pub use proxy::{ForwardError, StreamGuard};
pub use readiness::Connector;
pub use ssh::{ConnectError, ExecOutput, Session, SshOptions, Target};
pub use targets::AllowedTargets;
pub use tls::{DockerTls, DockerTlsFiles, TlsFilesError};
