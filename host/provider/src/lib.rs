//! The `Provider` trait: the only face of a plugin the scaler ever sees.
//!
//! Owns: the trait, the instance and connection types, and the error taxonomy that keeps a
//! plugin's deliberate errors apart from host-contained faults.
//! Must not know: WebAssembly, tokio, HTTP or config. A leaf crate.
//!
//! Nothing here knows about WebAssembly. The wasm adapter in `flotilla-plugin-runtime` is one
//! implementation; tests and the simulator use in-process ones.

#[cfg(feature = "fixed")]
pub mod fixed;
mod state;
pub use state::{Budgeted, MemoryState, PluginState, StateError, StateLimits};

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

/// What a provider reports about itself after `init`, so the scaler can respect its limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderInfo {
    /// Stable identity of the managed group, to detect two pools managing one group.
    pub id: String,
    /// The plugin's own version, for logs and metrics.
    pub version: String,
    /// The group's own size limit; 0 means none.
    pub max_size: u32,
    /// `heartbeat` really checks instances.
    pub heartbeat: bool,
    /// Connection details can expire and must be re-fetched.
    pub expiring_connect_info: bool,
}

/// Cloud-side state of an instance, mirrored from the contract so the scaler stays wasm-free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason", rename_all = "kebab-case")]
pub enum InstanceState {
    /// Requested, not yet running.
    Creating,
    /// Running; readiness is decided by the host.
    Running,
    /// Removal in progress.
    Deleting,
    /// Gone.
    Deleted,
    /// Broken; the reason says why.
    Failed(String),
}

/// One instance as reported by `update`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instance {
    /// The cloud's identifier, unique within the group.
    pub id: String,
    /// Its cloud-side state.
    pub state: InstanceState,
}

/// The group's maximum as a plugin reports it during `update` (contract 0.1.2, `group-limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "value")]
pub enum GroupMax {
    /// The group has no limit of its own.
    Unlimited,
    /// The group holds at most this many instances.
    AtMost(u32),
}

impl GroupMax {
    /// The limit, `None` for no limit of its own.
    pub fn limit(self) -> Option<u32> {
        match self {
            GroupMax::Unlimited => None,
            GroupMax::AtMost(n) => Some(n),
        }
    }
}

impl From<Option<u32>> for GroupMax {
    fn from(max: Option<u32>) -> Self {
        max.map_or(GroupMax::Unlimited, GroupMax::AtMost)
    }
}

/// What one `update` saw: every instance, and the group's maximum when the plugin reported it
/// during that call. The two travel together, so the scaler applies them under one lock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// Every instance of the group; absent ones are gone.
    pub instances: Vec<Instance>,
    /// The group's maximum, when the plugin reported one during the call (`None`: nothing
    /// reported, the last report stands).
    pub group_max: Option<GroupMax>,
}

impl From<Vec<Instance>> for Listing {
    fn from(instances: Vec<Instance>) -> Self {
        Listing {
            instances,
            group_max: None,
        }
    }
}

/// Operating system of an instance, so jobs land on a matching machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Os {
    /// Linux.
    Linux,
    /// Windows.
    Windows,
    /// macOS.
    Darwin,
    /// FreeBSD.
    Freebsd,
}

/// CPU architecture with Go's names, so GitLab Runner configs carry over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// x86-64.
    Amd64,
    /// AArch64.
    Arm64,
    /// 32-bit x86.
    X86,
    /// 32-bit ARM.
    Arm,
}

/// How the host talks to an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// SSH.
    Ssh,
    /// WinRM.
    Winrm,
    /// Docker Engine over mutual TLS.
    DockerTls,
}

/// How to reach an instance; key material deliberately absent (the host owns keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    /// The instance described.
    pub id: String,
    /// Its operating system.
    pub os: Os,
    /// Its CPU architecture.
    pub arch: Arch,
    /// The protocol to use.
    pub protocol: Protocol,
    /// Address inside the cloud network.
    pub internal_address: Option<String>,
    /// Public address.
    pub external_address: Option<String>,
    /// Port of the protocol.
    pub port: u16,
    /// Login user for ssh/winrm.
    pub username: String,
    /// Unix seconds after which the details are stale.
    pub expires: Option<u64>,
    /// The cloud's failure domain the instance runs in (`eu-west-1a`), if it reports one.
    pub zone: Option<String>,
}

/// The error a plugin chose to return: the scaler picks its reaction from the case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Wrong settings; retrying cannot help.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// Credentials or permissions refused.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// Out of quota.
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
    /// Slow down for at least `retry_after`.
    #[error("throttled (retry after {}s): {message}", retry_after.as_secs())]
    Throttled {
        /// Minimum wait before the next call.
        retry_after: Duration,
        /// What the cloud said.
        message: String,
    },
    /// The instance or group does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The plugin does not implement the function.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Temporary; retry with backoff.
    #[error("transient: {0}")]
    Transient(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// The exported functions, named as in the WIT, for deadlines, metrics and messages.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Function {
    /// `init`
    Init,
    /// `update`
    Update,
    /// `increase`
    Increase,
    /// `decrease`
    Decrease,
    /// `connect-info`
    ConnectInfo,
    /// `heartbeat`
    Heartbeat,
    /// `shutdown`
    Shutdown,
}

impl Function {
    /// Every function, in contract order.
    pub const ALL: [Function; 7] = [
        Function::Init,
        Function::Update,
        Function::Increase,
        Function::Decrease,
        Function::ConnectInfo,
        Function::Heartbeat,
        Function::Shutdown,
    ];

    /// The WIT name, as plugin authors know it.
    pub fn name(self) -> &'static str {
        match self {
            Function::Init => "init",
            Function::Update => "update",
            Function::Increase => "increase",
            Function::Decrease => "decrease",
            Function::ConnectInfo => "connect-info",
            Function::Heartbeat => "heartbeat",
            Function::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a provider call failed: the plugin's own answer, or a fault the host contained.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The plugin returned an error (guest-visible, deliberate).
    #[error("{function}: {error}")]
    Provider {
        /// The function called.
        function: Function,
        /// The plugin's error.
        error: ProviderError,
    },
    /// The plugin crashed (trap, panic, memory cap); its instance was discarded.
    #[error("{function}: plugin trapped: {message}")]
    Trap {
        /// The function called.
        function: Function,
        /// What the trap said.
        message: String,
    },
    /// The call ran past its deadline; its instance was discarded.
    #[error("{function}: plugin did not return within {}ms; its instance was discarded", after.as_millis())]
    Timeout {
        /// The function called.
        function: Function,
        /// The deadline that passed.
        after: Duration,
    },
    /// The plugin's answer broke the contract, so it was not forwarded.
    #[error("{function}: contract violation: {detail}")]
    ContractViolation {
        /// The function called.
        function: Function,
        /// What was wrong.
        detail: String,
    },
    /// Too many consecutive faults: calls fail fast until the cool-down ends.
    #[error("{function}: plugin is degraded after {faults} consecutive faults (last: {last}); retrying in {}s", retry_in.as_secs())]
    CircuitOpen {
        /// The function called.
        function: Function,
        /// Consecutive faults seen.
        faults: u32,
        /// The last fault.
        last: String,
        /// Time until the next attempt is allowed.
        retry_in: Duration,
    },
    /// A call came before a successful `init`.
    #[error("{function}: provider is not initialised")]
    NotInitialized {
        /// The function called.
        function: Function,
    },
    /// The host itself failed to run the plugin (not the plugin's fault).
    #[error("{function}: host error: {message}")]
    Host {
        /// The function called.
        function: Function,
        /// What failed.
        message: String,
    },
}

impl CallError {
    /// The function that was called.
    pub fn function(&self) -> Function {
        match self {
            CallError::Provider { function, .. }
            | CallError::Trap { function, .. }
            | CallError::Timeout { function, .. }
            | CallError::ContractViolation { function, .. }
            | CallError::CircuitOpen { function, .. }
            | CallError::NotInitialized { function }
            | CallError::Host { function, .. } => *function,
        }
    }

    /// The plugin's deliberate error, if that is what this is.
    pub fn provider_error(&self) -> Option<&ProviderError> {
        match self {
            CallError::Provider { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether the plugin misbehaved (trap, timeout, lie), as opposed to a cloud answer.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            CallError::Trap { .. }
                | CallError::Timeout { .. }
                | CallError::ContractViolation { .. }
        )
    }
}

/// Health of a provider, so a pool can report "degraded" instead of hiding faults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProviderHealth {
    /// Faults (traps, timeouts, violations) since the last success.
    pub consecutive_faults: u32,
    /// Traps since start.
    pub traps: u64,
    /// Timeouts since start.
    pub timeouts: u64,
    /// Contract violations since start.
    pub contract_violations: u64,
    /// Fresh instances created after a fault.
    pub restarts: u64,
    /// Whether calls currently fail fast.
    pub circuit_open: bool,
    /// The last fault, for operators.
    pub last_fault: Option<String>,
    /// Outbound requests the host refused (off the allow-list, forbidden address, unknown
    /// or unbound credential, over a cap) since start.
    pub egress_denied: u64,
    /// Requests sent once more after the cloud refused the cached token they carried (a new
    /// one was minted) since start.
    pub egress_remints: u64,
    /// Microseconds calls have waited for the plugin (one call runs at a time per pool)
    /// since start.
    pub call_wait_micros: u64,
}

/// A cloud group the scaler can grow and shrink, with fleeting's partial-success semantics.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Validates `settings` (JSON) and connects; later re-inits reuse the same settings.
    async fn init(&self, settings: &str) -> Result<ProviderInfo, CallError>;
    /// Lists every instance (absent ones are gone), with the group's maximum when the plugin
    /// reports it.
    async fn update(&self) -> Result<Listing, CallError>;
    /// Requests `delta` more instances; returns how many were really requested.
    async fn increase(&self, delta: u32) -> Result<u32, CallError>;
    /// Requests removal; returns the ids accepted.
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, CallError>;
    /// Describes how to reach one instance.
    async fn connect_info(&self, id: &str) -> Result<Connection, CallError>;
    /// Checks one instance is alive.
    async fn heartbeat(&self, id: &str) -> Result<(), CallError>;
    /// Lets the plugin release what it holds; never deletes instances.
    async fn shutdown(&self) -> Result<(), CallError>;
    /// Fault counters, so pools can report degraded plugins.
    fn health(&self) -> ProviderHealth;
    /// The host is closing the pool (its shutdown grace is over): calls running now end at
    /// once, and only `decrease` and `shutdown` are taken from now on, so the plugin's
    /// shutdown never waits behind a call that may run to its deadline.
    fn close(&self) {}
}
