//! A discrete-event simulation of one pool on virtual time: the real [`PoolCore`] against a
//! simulated cloud (provisioning delay, failure rate, stockout windows) fed by a job trace,
//! optionally with a fallback pool that takes the waiting jobs while the first cannot grow.
//! Used by `flotilla simulate` and by the property tests.
//!
//! This module owns the simulation's inputs and outputs (trace, cloud model, options, report,
//! samples); the event loop lives in `engine`. It must not know about config files, CSV or
//! plotting (the binary's `simulate` command does that).
//!
//! [`PoolCore`]: crate::PoolCore

mod engine;
mod rng;
mod side;

pub use rng::Rng;

use serde::Serialize;

use super::{Millis, Policy, ScalerConfig};

/// One job of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// When it arrives (ms from the trace start).
    pub submit_at: Millis,
    /// How long it runs once it has a slot (ms).
    pub duration: Millis,
    /// Optional tag from the trace.
    pub tag: Option<String>,
}

/// The simulated cloud.
#[derive(Debug, Clone, PartialEq)]
pub struct SimCloud {
    /// Provisioning delay range (ms), uniformly drawn per instance.
    pub provisioning_delay_ms: (Millis, Millis),
    /// Probability that an `increase`, `decrease` or `update` call fails (transient or throttled).
    pub failure_rate: f64,
    /// Probability that a failure is a throttle (with retry-after) rather than transient.
    pub throttle_share: f64,
    /// Probability that a running instance fails during its life (checked once per instance).
    pub instance_failure_rate: f64,
    /// Largest group size the cloud grants; 0 means no limit.
    pub max_size: u32,
    /// Provider call latency (ms).
    pub api_latency_ms: Millis,
    /// Seed of the deterministic random stream.
    pub seed: u64,
    /// Spans `[from, to)` (ms from the trace start) in which the cloud is out of capacity:
    /// every `increase` is refused with `quota-exceeded` (a spot stockout).
    pub stockouts: Vec<(Millis, Millis)>,
}

impl Default for SimCloud {
    fn default() -> Self {
        SimCloud {
            provisioning_delay_ms: (30_000, 90_000),
            failure_rate: 0.0,
            throttle_share: 0.5,
            instance_failure_rate: 0.0,
            max_size: 0,
            api_latency_ms: 200,
            seed: 1,
            stockouts: Vec::new(),
        }
    }
}

/// What a simulation found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SimReport {
    /// Jobs in the trace.
    pub jobs: u64,
    /// Jobs that ran.
    pub completed: u64,
    /// Jobs that gave up waiting (instance_acquire_timeout) or whose instance failed.
    pub timed_out: u64,
    /// Jobs whose instance failed under them.
    pub failed: u64,
    /// Cost: instance-seconds billed (from request to deletion).
    pub instance_seconds: f64,
    /// Most instances alive at once.
    pub peak_instances: u32,
    /// Wait from submit to slot: median (s).
    pub wait_p50_s: f64,
    /// 95th percentile (s).
    pub wait_p95_s: f64,
    /// Maximum (s).
    pub wait_max_s: f64,
    /// Busy slot-seconds over available slot-seconds on ready instances.
    pub slot_utilisation: f64,
    /// Increase and decrease calls made.
    pub scale_operations: u64,
    /// The most provider calls (update, increase, decrease) in any one minute of the run.
    pub max_calls_per_minute: u64,
    /// Simulated time span (s).
    pub span_s: f64,
    /// Jobs that ran on the fallback pool.
    pub served_by_fallback: u64,
    /// Reservations the pool handed to its fallback while it could not grow.
    pub handed_over: u64,
    /// Invariant violations found (only with `check_invariants`).
    pub invariant_violations: Vec<String>,
}

/// One sample of the timeline, for plots.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds from the start.
    pub t_s: f64,
    /// Instances alive.
    pub instances: u32,
    /// Slots in use.
    pub busy_slots: u32,
    /// Jobs waiting for a slot.
    pub queued: u32,
}

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// Check the state machine's invariants after every event (slow; for tests).
    pub check_invariants: bool,
    /// Timeline samples wanted (0 = none).
    pub samples: usize,
    /// Virtual start time (ms since the epoch), so cron policies see real dates.
    pub start_at: Millis,
}

/// One pool of a simulation: its knobs, its policies and its cloud.
#[derive(Debug, Clone, Copy)]
pub struct SimPool<'a> {
    /// The pool's knobs.
    pub cfg: &'a ScalerConfig,
    /// Its idle policies.
    pub policies: &'a [Policy],
    /// Its cloud.
    pub cloud: &'a SimCloud,
}

/// Runs a trace through the real scaler against the simulated cloud.
pub fn simulate(
    cfg: &ScalerConfig,
    policies: &[Policy],
    cloud: &SimCloud,
    jobs: &[Job],
    options: &SimOptions,
) -> (SimReport, Vec<Sample>) {
    let pool = SimPool {
        cfg,
        policies,
        cloud,
    };
    engine::Sim::new(pool, None, jobs, options).run()
}

/// Runs a trace through `pool`, which hands the reservations it will not serve to
/// `fallback` while it cannot grow (a refused increase, a stockout), as `flotilla run` does
/// with `fallback = "..."`. The report covers both pools: `served_by_fallback` says how many
/// jobs the fallback ran, and cost and peak count both clouds.
pub fn simulate_with_fallback(
    pool: SimPool<'_>,
    fallback: SimPool<'_>,
    jobs: &[Job],
    options: &SimOptions,
) -> (SimReport, Vec<Sample>) {
    engine::Sim::new(pool, Some(fallback), jobs, options).run()
}
