//! The process's and the pools' state as the API shows it: `GET /v1/pools`,
//! `GET /v1/pools/{pool}/instances`, `/readyz` and `/healthz`. The server builds these from
//! the scaler's snapshot and the sandbox's plugin health; clients read them (`flotilla gitlab
//! snippet` sizes the runner's `limit` from a pool's `ScalerStatus`). Fields are declared in
//! name order, the order they are sent in (a pool's `health` comes first).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Millis;

/// `GET /v1/pools`: every pool of the config, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolsAnswer {
    /// Each pool's state.
    pub pools: BTreeMap<String, PoolEntry>,
}

/// One pool in `GET /v1/pools`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolEntry {
    /// The sandbox's view of the pool's plugin, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginHealth>,
    /// The scaler's view.
    pub status: PoolStatus,
}

/// The sandbox's view of a running plugin: faults, the circuit breaker, egress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginHealth {
    /// Microseconds calls have waited for the plugin (one call runs at a time per pool).
    pub call_wait_micros: u64,
    /// Whether calls fail fast now.
    pub circuit_open: bool,
    /// Faults (traps, timeouts, violations) since the last success.
    pub consecutive_faults: u32,
    /// Contract violations since start.
    pub contract_violations: u64,
    /// Outbound requests the host refused since start.
    pub egress_denied: u64,
    /// Requests sent again with a freshly minted token since start.
    pub egress_remints: u64,
    /// The last fault, for operators.
    pub last_fault: Option<String>,
    /// Fresh plugin instances made after a fault.
    pub restarts: u64,
    /// Timeouts since start.
    pub timeouts: u64,
    /// Traps since start.
    pub traps: u64,
}

/// A pool's state. A pool whose plugin is not running yet has only `health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Where the pool stands.
    pub health: PoolHealth,
    /// The scaler's counts, once the pool runs.
    #[serde(flatten)]
    pub scaler: Option<ScalerStatus>,
}

/// Where a pool stands: `{"state": "degraded", "reason": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolHealth {
    /// The state.
    pub state: HealthState,
    /// Why, when it is not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The start's try (`starting`, `start-failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Since when it is starting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Millis>,
    /// When a failed start is tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Millis>,
}

impl PoolHealth {
    /// A state with nothing more to say.
    pub fn of(state: HealthState) -> PoolHealth {
        PoolHealth {
            state,
            reason: None,
            attempt: None,
            since: None,
            retry_at: None,
        }
    }
}

/// A pool's states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HealthState {
    /// Loading its plugin and running `init`, or waiting for its first update.
    Starting,
    /// Its plugin could not start; tried again at `retry_at`.
    StartFailed,
    /// Working.
    Ready,
    /// Provider errors; retrying with backoff.
    Degraded,
    /// Stopped by an error retrying cannot fix.
    Stopped,
}

/// The scaler's counts of a running pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScalerStatus {
    /// Acquires waiting for a slot.
    pub acquires_waiting: u32,
    /// Job slots per instance.
    pub capacity_per_instance: u32,
    /// Instances the policy wants.
    pub desired: u32,
    /// Instances by state.
    pub instances: BTreeMap<InstanceState, u32>,
    /// The last provider error.
    pub last_error: Option<String>,
    /// The upper bound in force (lowered when the cloud group's own maximum is lower).
    pub max_instances: u32,
    /// Calls refused as unauthorized or misconfigured, by call, waiting for an operator.
    pub paused: BTreeMap<String, Paused>,
    /// Instances requested and not yet seen.
    pub pending: u32,
    /// What the last start restored.
    pub restart: Restart,
    /// Slots by state.
    pub slots: Slots,
}

impl ScalerStatus {
    /// The pool's job slots at most: `max_instances × capacity_per_instance`.
    pub fn max_slots(&self) -> u32 {
        self.max_instances
            .saturating_mul(self.capacity_per_instance)
    }
}

/// A call waiting for an operator's fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paused {
    /// What the cloud or plugin said.
    pub reason: String,
    /// When it is tried again.
    pub retry_at: Millis,
}

/// What a pool's start restored from the lease journal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restart {
    /// From the start to the first update (ms); `None` until then.
    pub adopted_after_ms: Option<Millis>,
    /// Instances found at the first update.
    pub instances_adopted: u32,
    /// Leases failed by TTL or maximum job duration since the start.
    pub leases_expired: u64,
    /// Restored leases whose instance was gone.
    pub leases_lost: u64,
    /// Leases read back from the journal.
    pub leases_restored: u64,
}

/// Slots by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slots {
    /// Bound to leases.
    pub acquired: u32,
    /// Free on ready instances and not promised.
    pub idle: u32,
    /// Promised to reservations.
    pub reserved: u32,
    /// On instances that cannot take jobs (not ready, draining, failed).
    pub unavailable: u32,
}

/// An instance's states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Requested from the cloud, not running yet.
    Creating,
    /// Removal requested.
    Deleting,
    /// Takes no new jobs (max use count, scale-down, shutdown); deleted once empty.
    Draining,
    /// Broken; its leases failed and it will be removed.
    Failed,
    /// Ready for jobs.
    Ready,
    /// Running, readiness not yet confirmed.
    Running,
}

/// `GET /v1/pools/{pool}/instances`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstancesAnswer {
    /// Every instance of the pool.
    pub instances: Vec<InstanceView>,
    /// The pool.
    pub pool: String,
}

/// One instance of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceView {
    /// Where the host reaches it over SSH, while it has a session to it.
    pub address: Option<String>,
    /// Consecutive readiness, ping or heartbeat failures.
    pub failures: u32,
    /// The cloud's id.
    pub id: String,
    /// The last readiness or ping error, or why it failed.
    pub last_error: Option<String>,
    /// When it last became ready.
    pub ready_since: Option<Millis>,
    /// When it was first seen.
    pub seen_at: Millis,
    /// Slots bound to leases now.
    pub slots_used: u32,
    /// Where it stands.
    pub state: InstanceState,
    /// The tenant it is bound to, once a tenant's lease took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Leases it has taken in its life.
    pub use_count: u32,
}

/// `/readyz`: `200` when every pool is ready and the process is not draining, else `503`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyAnswer {
    /// Each pool that is not ready, with its state only (`/readyz` needs no token, so the
    /// why is left to `GET /v1/pools`), and `"(process)": "draining"` while draining.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pools: BTreeMap<String, NotReady>,
    /// `ready` or `not-ready`.
    pub status: Readiness,
}

/// Whether the process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Readiness {
    /// Every pool is ready.
    Ready,
    /// A pool is not, or the process drains.
    NotReady,
}

/// What is not ready in `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NotReady {
    /// A pool, with its state.
    Pool {
        /// The pool's state.
        state: HealthState,
    },
    /// The process itself: `"draining"`.
    Process(String),
}

/// `/healthz`: `{"status": "ok"}` while the process answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthAnswer {
    /// Always `ok`.
    pub status: String,
}
