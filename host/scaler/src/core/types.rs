//! The public vocabulary of the pool state machine: instance and lease states, lease errors,
//! actions, health, counters and snapshots. Plain data with no behaviour beyond naming; it must
//! not know how the pool decides anything.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Millis;

/// Lifecycle of an instance as the scaler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstState {
    /// Requested from the cloud, not running yet.
    Creating,
    /// Running, readiness not yet confirmed.
    Running,
    /// Ready for jobs.
    Ready,
    /// Takes no new jobs (max use count, scale-down, shutdown); deleted once empty.
    Draining,
    /// Removal requested.
    Deleting,
    /// Broken; its leases failed and it will be removed.
    Failed,
}

impl InstState {
    /// Every state, for metrics.
    pub const ALL: [InstState; 6] = [
        InstState::Creating,
        InstState::Running,
        InstState::Ready,
        InstState::Draining,
        InstState::Deleting,
        InstState::Failed,
    ];

    /// Metric label.
    pub fn name(self) -> &'static str {
        match self {
            InstState::Creating => "creating",
            InstState::Running => "running",
            InstState::Ready => "ready",
            InstState::Draining => "draining",
            InstState::Deleting => "deleting",
            InstState::Failed => "failed",
        }
    }
}

/// A lease's current state, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum LeaseState {
    /// A slot is promised; no instance bound yet.
    Reserved,
    /// Bound to a slot of a ready instance.
    Acquired {
        /// The instance.
        instance: String,
        /// The slot index on it.
        slot: u32,
    },
    /// Its instance failed or vanished; the cause says why.
    Failed {
        /// What happened.
        cause: String,
    },
}

/// One lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Lease {
    /// Its id.
    pub id: u64,
    /// Where it stands.
    pub state: LeaseState,
    /// When it was reserved.
    pub reserved_at: Millis,
    /// When it was acquired.
    pub acquired_at: Option<Millis>,
    /// The client's labels (e.g. the CI job it serves); each pair is held by one lease at most.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// With a lease TTL: when the lease fails unless renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Millis>,
    /// The holder's own deadline, asked for at the reservation: the lease fails past it
    /// whatever its state, so a holder that vanishes (a CI job past its own timeout whose
    /// cleanup never came) cannot keep its slot for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<Millis>,
    /// Whom the lease's work belongs to (e.g. a CI project and its protection). An instance
    /// that served a tenant serves no other for the rest of its life; a lease without one
    /// binds nothing and may use any instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The pool it was reserved in, when that pool handed it to this one, its fallback
    /// (the holder still names that pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_from: Option<String>,
}

/// Why the lease journal could not be written: the store's own error, kept whole (with its
/// `source()` chain) across the crate boundary, and shared so a [`LeaseError`] stays cheap to
/// clone. Two are equal when they are the same failure.
#[derive(Debug, Clone)]
pub struct JournalError(std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>);

impl JournalError {
    /// Wraps the journal's own error.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> JournalError {
        JournalError(std::sync::Arc::new(error))
    }
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for JournalError {
    fn eq(&self, other: &JournalError) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for JournalError {}

/// Why a lease operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// No such lease (never existed, or already released).
    #[error("lease {0} does not exist")]
    UnknownLease(u64),
    /// The lease is already acquired.
    #[error("lease {0} is already acquired")]
    AlreadyAcquired(u64),
    /// The lease must be acquired first (release of a reserved lease).
    #[error("lease {0} is reserved, not acquired; unreserve it instead")]
    NotAcquired(u64),
    /// The lease was acquired; release it instead.
    #[error("lease {0} is acquired; release it instead")]
    Acquired(u64),
    /// Its instance failed.
    #[error("lease {id} failed: {cause}")]
    Failed {
        /// The lease.
        id: u64,
        /// Why.
        cause: String,
    },
    /// Every slot the pool may ever have is promised.
    #[error("pool is at capacity ({0} slots)")]
    AtCapacity(u32),
    /// Preemptive mode: no idle ready slot right now.
    #[error("no idle slot (preemptive mode)")]
    NoIdleSlot,
    /// The pool is draining for shutdown.
    #[error("pool is shutting down")]
    ShuttingDown,
    /// The pool stopped (bad config or credentials).
    #[error("pool is stopped: {0}")]
    Stopped(String),
    /// The lease could not be written to the journal; nothing changed.
    #[error("the lease journal failed, nothing was changed: {0}")]
    NotDurable(JournalError),
    /// Another live lease already carries this label.
    #[error("label {key}={value} is already on lease {lease}")]
    LabelInUse {
        /// The label's key.
        key: String,
        /// Its value.
        value: String,
        /// The lease that has it.
        lease: u64,
    },
}

/// What the scaler wants done now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Call `update()`.
    Update,
    /// Call `increase(n)`.
    Increase(u32),
    /// Call `decrease(ids)`.
    Decrease(Vec<String>),
    /// Run the readiness check on this instance.
    CheckReady(String),
    /// Call `heartbeat(id)` (only for plugins that implement it).
    Heartbeat(String),
    /// Check that an idle ready instance still answers (the readiness layer's cheap probe).
    Ping(String),
}

/// Where a lease was bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binding {
    /// The instance.
    pub instance: String,
    /// The slot index.
    pub slot: u32,
}

/// Health of the pool as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason", rename_all = "kebab-case")]
pub enum PoolHealth {
    /// Waiting for the first successful update.
    Starting,
    /// Working.
    Ready,
    /// Provider errors; retrying with backoff.
    Degraded(String),
    /// Stopped by an error retrying cannot fix.
    Stopped(String),
}

/// Counters for metrics, incremented by the state machine.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    /// Instances requested.
    pub scale_up: u64,
    /// Instances removed.
    pub scale_down: u64,
    /// Leases that failed with a cause.
    pub leases_failed: u64,
    /// Creation-to-ready durations (ms) since the last drain.
    #[serde(skip)]
    pub ready_latencies: Vec<Millis>,
    /// Instance lifetimes (ms) since the last drain.
    #[serde(skip)]
    pub lifetimes: Vec<Millis>,
    /// Ids of instances forgotten since the last drain, so the readiness layer can drop what
    /// it keeps for them (sessions, pinned host keys).
    #[serde(skip)]
    pub forgotten: Vec<String>,
    /// Leases restored from the journal at start and bound again (or still reserved).
    pub leases_restored: u64,
    /// Restored leases whose instance was gone after the restart (failed with that cause).
    pub leases_lost: u64,
    /// Leases failed because they were not renewed within the TTL or ran past the maximum
    /// job duration.
    pub leases_expired: u64,
}

/// Slot counts by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SlotCounts {
    /// Free on ready instances and not promised.
    pub idle: u32,
    /// Promised to reservations.
    pub reserved: u32,
    /// Bound to leases.
    pub acquired: u32,
    /// On instances that cannot take jobs (not ready, draining, failed).
    pub unavailable: u32,
}

/// A snapshot for `/v1/pools` and metrics.
#[derive(Debug, Clone, Serialize)]
pub struct PoolSnapshot {
    /// Health.
    pub health: PoolHealth,
    /// Instances by state.
    pub instances: BTreeMap<&'static str, u32>,
    /// Slots by state.
    pub slots: SlotCounts,
    /// Instances the policy wants.
    pub desired: u32,
    /// Instances requested but not yet seen.
    pub pending: u32,
    /// Upper bound in force.
    pub max_instances: u32,
    /// Job slots per instance.
    pub capacity_per_instance: u32,
    /// The last provider error.
    pub last_error: Option<String>,
    /// What the last start restored and how long the pool took to adopt its instances.
    pub restart: RestartView,
    /// Calls refused as unauthorized or misconfigured, waiting for an operator's fix, with
    /// the reason and the next try.
    pub paused: BTreeMap<&'static str, super::Pause>,
    /// Acquires waiting for a slot (the driver's queue; the core alone reports 0).
    pub acquires_waiting: u32,
}

/// A pool's start as `/v1/pools` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RestartView {
    /// Leases read back from the journal.
    pub leases_restored: u64,
    /// Restored leases whose instance was gone.
    pub leases_lost: u64,
    /// Leases failed by TTL or maximum job duration since the start.
    pub leases_expired: u64,
    /// Instances found at the first update.
    pub instances_adopted: u32,
    /// From the pool's start to its first update (ms); `None` until then.
    pub adopted_after_ms: Option<Millis>,
}

/// One instance as `GET /v1/pools/{pool}/instances` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceView {
    /// The cloud's id.
    pub id: String,
    /// Where it stands.
    pub state: InstState,
    /// When it was first seen (ms since the Unix epoch).
    pub seen_at: Millis,
    /// When it last became ready.
    pub ready_since: Option<Millis>,
    /// Slots bound to leases now.
    pub slots_used: u32,
    /// Leases it has taken in its life (counted against `max_use_count`).
    pub use_count: u32,
    /// The tenant it is bound to, once a tenant's lease took it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Consecutive readiness, ping or heartbeat failures.
    pub failures: u32,
    /// The last readiness or ping error, or why it failed.
    pub last_error: Option<String>,
}
