//! The pure scaling state machine of one pool: instances, slots and leases on an injected
//! clock. It decides (`plan`) and learns (`on_*`); the async driver and the simulator carry
//! out its actions against a provider. It never calls a provider itself.
//!
//! This module owns the [`PoolCore`] struct, its lifecycle phases and the bookkeeping every
//! change to an instance goes through (`with_inst`, `add_inst`, `forget_inst`, which keep the
//! indexes in step). The concerns live in submodules: `change` (every lease change, checked
//! and planned, then committed), `leases` (questions about leases, and the one-step changes
//! the simulator makes), `plan` (what to do now and when to look again), `observe` (learning
//! provider results), `snapshot` (counts, health and invariants), `index` (instance records
//! and their indexes) and `types` (the public vocabulary). It must not know about async,
//! tokio, HTTP or metrics.

mod backoff;
mod change;
mod fallback;
mod index;
mod lease_table;
mod leases;
mod observe;
mod plan;
mod restore;
mod snapshot;
mod types;

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};

use self::backoff::Backoff;
pub use self::backoff::Pause;
pub use self::change::{Change, Committed, Write};
use self::index::{Index, Indexed, Inst, PolicyCache};
use self::lease_table::LeaseTable;
pub use self::types::{
    Action, Binding, Counters, InstState, InstanceView, JournalError, Lease, LeaseError,
    LeaseState, PoolHealth, PoolSnapshot, RestartView, SlotCounts,
};
use super::policy::{self, Policy};
use super::{Millis, ScalerConfig};
use flotilla_provider::ProviderInfo;

/// The maps every event looks up (instances by key and by id): foldhash, seeded per process,
/// is several times faster than SipHash on short ids and still resists chosen collisions.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Where the pool is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first successful `update()`, which says what already exists.
    Adopting,
    /// Deciding and acting.
    Running,
    /// No new leases; only observing while the driver drains (`adopted`: the first update
    /// came back, so the pool may report itself ready).
    ShuttingDown {
        /// Whether the first update succeeded.
        adopted: bool,
    },
}

impl Phase {
    /// Whether the first update came back.
    fn adopted(self) -> bool {
        match self {
            Phase::Adopting => false,
            Phase::Running => true,
            Phase::ShuttingDown { adopted } => adopted,
        }
    }

    /// The phase once an update came back.
    fn after_update(self) -> Phase {
        match self {
            Phase::Adopting | Phase::Running => Phase::Running,
            Phase::ShuttingDown { .. } => Phase::ShuttingDown { adopted: true },
        }
    }

    fn shutting_down(self) -> bool {
        matches!(self, Phase::ShuttingDown { .. })
    }
}

/// Where the `update()` call stands: one at a time, and a request made while one is in flight
/// is served by another one after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpdateCall {
    /// None in flight; the next is sent when the interval is over.
    Idle,
    /// None in flight; send one as soon as allowed.
    Wanted,
    /// One in flight.
    InFlight,
    /// One in flight, and another is wanted after it.
    InFlightThenAgain,
}

impl UpdateCall {
    fn in_flight(self) -> bool {
        matches!(self, UpdateCall::InFlight | UpdateCall::InFlightThenAgain)
    }

    fn wanted(self) -> bool {
        matches!(self, UpdateCall::Wanted)
    }

    /// Something changed that the cloud should confirm soon.
    fn want(self) -> UpdateCall {
        match self {
            UpdateCall::Idle | UpdateCall::Wanted => UpdateCall::Wanted,
            UpdateCall::InFlight | UpdateCall::InFlightThenAgain => UpdateCall::InFlightThenAgain,
        }
    }

    /// The call came back (or failed).
    fn finished(self) -> UpdateCall {
        match self {
            UpdateCall::InFlight | UpdateCall::Idle => UpdateCall::Idle,
            UpdateCall::InFlightThenAgain | UpdateCall::Wanted => UpdateCall::Wanted,
        }
    }
}

/// The state machine of one pool.
#[derive(Debug)]
pub struct PoolCore {
    cfg: ScalerConfig,
    policies: Vec<Policy>,
    fallback: Policy,
    /// The group's own maximum (from `init`, then from what `update` reports); `None`: no
    /// limit of its own.
    provider_max: Option<u32>,
    heartbeats: bool,
    /// How often idle ready instances are pinged; `None` when the readiness layer has no ping.
    ping_every: Option<Millis>,
    insts: FastMap<u64, Inst>,
    by_id: FastMap<String, u64>,
    next_key: u64,
    /// Kept in step with `insts` by `with_inst`, `add_inst` and `forget_inst`.
    index: Index,
    /// The active policy and the span it holds for.
    active_policy: Cell<PolicyCache>,
    leases: LeaseTable,
    /// Acquired leases restored from the journal, bound again at the first update.
    restoring: LeaseTable,
    /// Use counts restored from the journal, applied when their instance is adopted.
    restored_uses: HashMap<String, u32>,
    /// Tenant bindings restored from the journal, applied when their instance is adopted.
    restored_tenants: HashMap<String, String>,
    /// Whether any lease ever named a tenant: until then, planning skips tenants entirely.
    tenants_seen: bool,
    next_lease: LeaseIds,
    reserved: u32,
    acquired: u32,
    /// Instances requested and not yet seen: when, and how many successful updates since.
    pending: VecDeque<(Millis, u32)>,
    increase_in_flight: bool,
    /// `update()` calls planned so far.
    updates_planned: u64,
    /// An `increase()` failed in a way that does not say whether the cloud applied it (a
    /// lost answer, a timeout): no increase until an update planned after that failure has
    /// listed the group, so a retry never adds on top of a write that took effect. Holds the
    /// count of updates planned at the failure.
    increase_unsure: Option<u64>,
    /// When the pool last could not grow, and why (see [`PoolCore::cannot_grow`]).
    growth_refused: Option<(Millis, String)>,
    /// Where the `update()` call stands.
    update: UpdateCall,
    last_update: Option<Millis>,
    tokens: f64,
    tokens_at: Millis,
    /// Backoff of `update()` calls.
    update_backoff: Backoff,
    /// Backoff of `increase()` calls (failures and grants of nothing).
    increase_backoff: Backoff,
    /// Backoff of `decrease()` calls after a refusal an operator must fix.
    decrease_backoff: Backoff,
    health: PoolHealth,
    last_error: Option<String>,
    /// Adopting, running or shutting down.
    phase: Phase,
    /// When the pool was created.
    started_at: Millis,
    /// Instances found at the first update, and when it came back.
    adopted: Option<(u32, Millis)>,
    /// Metrics counters.
    pub counters: Counters,
    /// Successful `update` listings so far (marks which instances each one listed).
    updates_seen: u64,
}

/// How long a requested instance may stay unseen before it is no longer expected.
pub(super) const PENDING_EXPIRY_MS: Millis = 15 * 60 * 1000;

impl PoolCore {
    /// A new pool at `now`.
    pub fn new(cfg: ScalerConfig, policies: Vec<Policy>, now: Millis) -> PoolCore {
        let tokens = f64::from(cfg.throttle_burst);
        let max_job_ms = cfg.max_job_duration_ms;
        PoolCore {
            cfg,
            policies,
            fallback: Policy::fallback(),
            provider_max: None,
            heartbeats: false,
            ping_every: None,
            insts: FastMap::default(),
            by_id: FastMap::default(),
            next_key: 1,
            index: Index::default(),
            active_policy: Cell::new(PolicyCache(None)),
            leases: LeaseTable::new(max_job_ms),
            restoring: LeaseTable::new(max_job_ms),
            restored_uses: HashMap::new(),
            restored_tenants: HashMap::new(),
            tenants_seen: false,
            next_lease: LeaseIds::default(),
            reserved: 0,
            acquired: 0,
            pending: VecDeque::new(),
            increase_in_flight: false,
            updates_planned: 0,
            increase_unsure: None,
            growth_refused: None,
            update: UpdateCall::Wanted,
            last_update: None,
            tokens,
            tokens_at: now,
            update_backoff: Backoff::default(),
            increase_backoff: Backoff::default(),
            decrease_backoff: Backoff::default(),
            health: PoolHealth::Starting,
            last_error: None,
            phase: Phase::Adopting,
            started_at: now,
            adopted: None,
            counters: Counters::default(),
            updates_seen: 0,
        }
    }

    /// Applies what `init` said about the group (its own size limit).
    pub fn set_provider_info(&mut self, info: &ProviderInfo) {
        self.provider_max = (info.max_size > 0).then_some(info.max_size);
        self.heartbeats = info.heartbeat;
    }

    /// Pings idle ready instances every `every` ms (`None` or 0: never).
    pub fn set_ping_interval(&mut self, every: Option<Millis>) {
        self.ping_every = every.filter(|&ms| ms > 0);
    }

    /// Replaces the policies (hot reload).
    pub fn set_policies(&mut self, policies: Vec<Policy>) {
        self.policies = policies;
        self.active_policy.set(PolicyCache(None));
    }

    /// The configuration in force.
    pub fn config(&self) -> &ScalerConfig {
        &self.cfg
    }

    fn policy(&self, now: Millis) -> &Policy {
        let window = match self.active_policy.get().0 {
            Some(w) if w.covers(now) => w,
            _ => {
                let w = policy::active_window(&self.policies, now);
                self.active_policy.set(PolicyCache(Some(w)));
                w
            }
        };
        window
            .index
            .and_then(|i| self.policies.get(i))
            .unwrap_or(&self.fallback)
    }

    /// The most instances the pool may have: its own `max_instances`, capped by the group's.
    pub fn max_instances(&self) -> u32 {
        match self.provider_max {
            None => self.cfg.max_instances,
            Some(p) => self.cfg.max_instances.min(p),
        }
    }

    /// Applies the group's maximum as the plugin reported it during `update` (`None`: no limit
    /// of its own). A raised limit lets a scale-up that backed off (the group granted nothing)
    /// try again at once; a lowered one is applied to the instances still awaited at the
    /// update that follows.
    pub fn set_group_max(&mut self, now: Millis, max: Option<u32>) {
        let before = self.max_instances();
        self.provider_max = max;
        if self.max_instances() > before && self.increase_backoff.paused.is_none() {
            self.increase_backoff.ok();
            self.increase_backoff.until = now;
        }
    }

    fn capacity(&self) -> u32 {
        self.cfg.capacity_per_instance
    }

    fn is_available(&self, inst: &Inst) -> bool {
        Indexed::of(inst, &self.cfg).available.is_some()
    }

    /// Runs `f` on an instance and keeps the indexes in step.
    fn with_inst<T>(&mut self, key: u64, f: impl FnOnce(&mut Inst) -> T) -> Option<T> {
        let inst = self.insts.get_mut(&key)?;
        let before = Indexed::of(inst, &self.cfg);
        let out = f(inst);
        let after = Indexed::of(inst, &self.cfg);
        let capacity = self.cfg.capacity_per_instance;
        self.index.update(key, Some(before), Some(after), capacity);
        Some(out)
    }

    fn add_inst(&mut self, key: u64, inst: Inst) {
        let new = Indexed::of(&inst, &self.cfg);
        self.by_id.insert(inst.id.clone(), key);
        self.insts.insert(key, inst);
        let capacity = self.cfg.capacity_per_instance;
        self.index.update(key, None, Some(new), capacity);
    }

    fn forget_inst(&mut self, key: u64) -> Option<Inst> {
        let inst = self.insts.remove(&key)?;
        self.by_id.remove(&inst.id);
        self.counters.forgotten.push(inst.id.clone());
        let old = Indexed::of(&inst, &self.cfg);
        let capacity = self.cfg.capacity_per_instance;
        self.index.update(key, Some(old), None, capacity);
        Some(inst)
    }

    /// Stops the pool with a reason (e.g. init failed for good).
    pub fn stop(&mut self, reason: String) {
        self.last_error = Some(reason.clone());
        self.health = PoolHealth::Stopped(reason);
    }

    /// Whether the pool is healthy enough to count as ready.
    pub fn health(&self) -> &PoolHealth {
        &self.health
    }
}

/// Where lease ids come from: a counter that may be shared by every pool of a process, so
/// that an id names one lease of one pool only (a client holding an id of one pool can never
/// reach a lease of another by mistake).
#[derive(Debug, Clone)]
pub struct LeaseIds(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Default for LeaseIds {
    fn default() -> Self {
        LeaseIds(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1)))
    }
}

impl LeaseIds {
    /// The next id.
    pub fn take(&self) -> u64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes every later id at least `first`.
    pub fn at_least(&self, first: u64) {
        self.0
            .fetch_max(first, std::sync::atomic::Ordering::Relaxed);
    }
}
