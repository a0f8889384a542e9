//! Scaling policy and lease state machines, their async driver, and the simulator.
//!
//! Owns: when to grow and shrink, which instance serves which lease, backoff and throttles.
//! Must not know: wasmtime, HTTP, Prometheus or config files. It talks to the
//! [`flotilla_provider::Provider`] trait, takes time from an injected [`Clock`], and reports
//! through a [`PoolObserver`].

// The serde defaults that `with_pool_knobs!` writes name `flotilla_scaler::...` as text, which
// must resolve here too, where the macro declares `KnobsConfig`.
extern crate self as flotilla_scaler;

pub mod core;
pub mod driver;
mod observer;
pub mod policy;
pub mod sim;
mod waiters;

pub use self::core::{
    Action, Binding, InstState, JournalError, Lease, LeaseError, LeaseIds, LeaseState, PoolCore,
    PoolHealth, PoolSnapshot,
};
pub use driver::{AlwaysReady, Clock, LeaseJournal, NotReady, PoolHandle, Readiness, SystemClock};
pub use observer::{PoolObserver, Probe};
pub use policy::Policy;

/// Milliseconds since the Unix epoch (real or virtual).
pub type Millis = u64;

/// The numeric knobs of a pool, with GitLab Runner's autoscaler names.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalerConfig {
    /// Job slots per instance.
    pub capacity_per_instance: u32,
    /// Jobs an instance may run before it is replaced (0 = unlimited).
    pub max_use_count: u32,
    /// Upper bound on instances.
    pub max_instances: u32,
    /// Token bucket refill, instances per second (0 = unthrottled).
    pub throttle_limit: f64,
    /// Token bucket size.
    pub throttle_burst: u32,
    /// Consecutive readiness failures before an instance is replaced.
    pub failure_threshold: u32,
    /// Wait before asking again to delete an instance.
    pub deletion_retry_interval_ms: Millis,
    /// How long `acquire` waits for a ready instance.
    pub instance_acquire_timeout_ms: Millis,
    /// Safety-net polling of `update()`.
    pub update_interval_ms: Millis,
    /// Polling of `update()` while instances are expected: requested and not yet seen, or
    /// seen and not yet running (taskscaler's `update_interval_when_expecting`), so a machine
    /// that boots in 40 s is used at 40 s, not at the next `update_interval`.
    pub update_interval_when_expecting_ms: Millis,
    /// How long after it is first seen an instance may take to become ready: failed readiness
    /// checks within it are retried with backoff but not counted toward `failure_threshold`
    /// (a booting machine refuses SSH for a while).
    pub instance_ready_grace_ms: Millis,
    /// Leases must be renewed within this (`None`: no TTL).
    pub lease_ttl_ms: Option<Millis>,
    /// An acquired lease older than this is failed and reported (`None`: no limit).
    pub max_job_duration_ms: Option<Millis>,
    /// How often a call refused as unauthorized or misconfigured is tried again.
    pub paused_retry_interval_ms: Millis,
    /// After the pool last could not grow (a quota or capacity refusal, or an instance the
    /// cloud failed or took back soon after it came), how long it counts as unable to grow:
    /// its waiting reservations go to its fallback pool, if it has one, until then.
    pub fallback_hold_ms: Millis,
    /// An instance the cloud fails or takes back within this long of being first seen (a
    /// reclaimed spot VM, a stockout) means the pool cannot grow.
    pub fallback_failing_within_ms: Millis,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        ScalerConfig {
            capacity_per_instance: 1,
            max_use_count: 0,
            max_instances: 10,
            throttle_limit: 0.0,
            throttle_burst: 1,
            failure_threshold: 3,
            deletion_retry_interval_ms: 60_000,
            instance_acquire_timeout_ms: 120_000,
            update_interval_ms: 60_000,
            update_interval_when_expecting_ms: 2_000,
            instance_ready_grace_ms: 300_000,
            lease_ttl_ms: None,
            max_job_duration_ms: None,
            paused_retry_interval_ms: 60_000,
            fallback_hold_ms: 300_000,
            fallback_failing_within_ms: 600_000,
        }
    }
}

/// The scaler's part of the configuration file.
pub mod config;
