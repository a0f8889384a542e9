//! The pure scaling state machine of one pool: instances, slots and leases on an injected
//! clock. It decides (`plan`) and learns (`on_*`); the async driver and the simulator carry
//! out its actions against a provider. It never calls a provider itself.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use serde::Serialize;

use super::policy::{self, Policy};
use super::{Millis, ScalerConfig};
use flotilla_provider::{CallError, Instance, InstanceState, ProviderError, ProviderInfo};

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

#[derive(Debug, Clone)]
struct Inst {
    id: String,
    state: InstState,
    seen_at: Millis,
    ready_at: Option<Millis>,
    /// When the last lease left (or it became ready); `None` while leased.
    idle_since: Option<Millis>,
    slots: Vec<Option<u64>>,
    used: u32,
    uses: u32,
    failures: u32,
    readiness_in_flight: bool,
    heartbeat_in_flight: bool,
    last_heartbeat: Millis,
    delete_requested_at: Option<Millis>,
    failure: Option<String>,
}

/// What the indexes of [`PoolCore`] record about one instance; recomputed around every change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Indexed {
    state: InstState,
    /// Slots in use, when the instance can take a lease.
    available: Option<u32>,
    idle_since: Option<Millis>,
    delete_requested_at: Option<Millis>,
}

impl Indexed {
    fn of(inst: &Inst, cfg: &ScalerConfig) -> Indexed {
        let available = (inst.state == InstState::Ready
            && inst.used < cfg.capacity_per_instance
            && (cfg.max_use_count == 0 || inst.uses < cfg.max_use_count))
            .then_some(inst.used);
        Indexed {
            state: inst.state,
            available,
            idle_since: inst.idle_since,
            delete_requested_at: inst.delete_requested_at,
        }
    }
}

/// Indexes over the instances, so no decision has to scan them all.
#[derive(Debug, Default)]
struct Index {
    /// Ready, non-draining instances with a free slot, ordered fullest first.
    available: BTreeSet<(Reverse<u32>, u64)>,
    /// Free slots on those instances.
    free_slots: u32,
    /// Instances by state (indexed by `InstState as usize`).
    by_state: [BTreeSet<u64>; 6],
    /// Instances with `idle_since`, oldest first.
    idle: BTreeSet<(Millis, u64)>,
    /// Instances with `delete_requested_at`, oldest first.
    delete_requested: BTreeSet<(Millis, u64)>,
}

impl Index {
    /// Moves `key` from what `old` recorded to what `new` records (`None`: not indexed).
    fn update(&mut self, key: u64, old: Option<Indexed>, new: Option<Indexed>, capacity: u32) {
        if old == new {
            return;
        }
        if old.map(|o| o.state) != new.map(|n| n.state) {
            if let Some(set) = old.and_then(|o| self.by_state.get_mut(o.state as usize)) {
                set.remove(&key);
            }
            if let Some(set) = new.and_then(|n| self.by_state.get_mut(n.state as usize)) {
                set.insert(key);
            }
        }
        let (was, is) = (old.and_then(|o| o.available), new.and_then(|n| n.available));
        if was != is {
            if let Some(used) = was {
                self.available.remove(&(Reverse(used), key));
                self.free_slots -= capacity.saturating_sub(used);
            }
            if let Some(used) = is {
                self.available.insert((Reverse(used), key));
                self.free_slots += capacity.saturating_sub(used);
            }
        }
        let (was, is) = (
            old.and_then(|o| o.idle_since),
            new.and_then(|n| n.idle_since),
        );
        if was != is {
            if let Some(t) = was {
                self.idle.remove(&(t, key));
            }
            if let Some(t) = is {
                self.idle.insert((t, key));
            }
        }
        let (was, is) = (
            old.and_then(|o| o.delete_requested_at),
            new.and_then(|n| n.delete_requested_at),
        );
        if was != is {
            if let Some(t) = was {
                self.delete_requested.remove(&(t, key));
            }
            if let Some(t) = is {
                self.delete_requested.insert((t, key));
            }
        }
    }

    fn in_state(&self, state: InstState) -> impl Iterator<Item = u64> + '_ {
        self.by_state
            .get(state as usize)
            .into_iter()
            .flat_map(|set| set.iter().copied())
    }

    fn count(&self, state: InstState) -> u32 {
        self.by_state
            .get(state as usize)
            .map_or(0, |set| set.len() as u32)
    }
}

/// The policy found for a span of time, so cron expressions are evaluated once per minute.
#[derive(Debug, Clone, Copy)]
struct PolicyCache(Option<policy::ActiveWindow>);

/// A lease's current state, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
pub struct Lease {
    /// Its id.
    pub id: u64,
    /// Where it stands.
    pub state: LeaseState,
    /// When it was reserved.
    pub reserved_at: Millis,
    /// When it was acquired.
    pub acquired_at: Option<Millis>,
}

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
    pub instances: std::collections::BTreeMap<&'static str, u32>,
    /// Slots by state.
    pub slots: SlotCounts,
    /// Instances the policy wants.
    pub desired: u32,
    /// Instances requested but not yet seen.
    pub pending: u32,
    /// Upper bound in force.
    pub max_instances: u32,
    /// The last provider error.
    pub last_error: Option<String>,
}

/// The state machine of one pool.
#[derive(Debug)]
pub struct PoolCore {
    cfg: ScalerConfig,
    policies: Vec<Policy>,
    fallback: Policy,
    provider_max: u32,
    heartbeats: bool,
    insts: HashMap<u64, Inst>,
    by_id: HashMap<String, u64>,
    next_key: u64,
    /// Kept in step with `insts` by `with_inst`, `add_inst` and `forget_inst`.
    index: Index,
    /// The active policy and the span it holds for.
    active_policy: Cell<PolicyCache>,
    leases: HashMap<u64, Lease>,
    next_lease: u64,
    reserved: u32,
    acquired: u32,
    /// Instances requested and not yet seen, with when they were requested.
    pending: VecDeque<Millis>,
    increase_in_flight: bool,
    update_in_flight: bool,
    last_update: Option<Millis>,
    update_wanted: bool,
    tokens: f64,
    tokens_at: Millis,
    backoff_until: Millis,
    backoff_attempt: u32,
    health: PoolHealth,
    last_error: Option<String>,
    shutting_down: bool,
    first_update_done: bool,
    /// Metrics counters.
    pub counters: Counters,
}

/// How long a requested instance may stay unseen before it is no longer expected.
const PENDING_EXPIRY_MS: Millis = 15 * 60 * 1000;
const MAX_BACKOFF_MS: Millis = 5 * 60 * 1000;

impl PoolCore {
    /// A new pool at `now`.
    pub fn new(cfg: ScalerConfig, policies: Vec<Policy>, now: Millis) -> PoolCore {
        let tokens = f64::from(cfg.throttle_burst);
        PoolCore {
            cfg,
            policies,
            fallback: Policy::fallback(),
            provider_max: 0,
            heartbeats: false,
            insts: HashMap::new(),
            by_id: HashMap::new(),
            next_key: 1,
            index: Index::default(),
            active_policy: Cell::new(PolicyCache(None)),
            leases: HashMap::new(),
            next_lease: 1,
            reserved: 0,
            acquired: 0,
            pending: VecDeque::new(),
            increase_in_flight: false,
            update_in_flight: false,
            last_update: None,
            update_wanted: true,
            tokens,
            tokens_at: now,
            backoff_until: 0,
            backoff_attempt: 0,
            health: PoolHealth::Starting,
            last_error: None,
            shutting_down: false,
            first_update_done: false,
            counters: Counters::default(),
        }
    }

    /// Applies what `init` said about the group (its own size limit).
    pub fn set_provider_info(&mut self, info: &ProviderInfo) {
        self.provider_max = info.max_size;
        self.heartbeats = info.heartbeat;
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

    fn max_instances(&self) -> u32 {
        match self.provider_max {
            0 => self.cfg.max_instances,
            p => self.cfg.max_instances.min(p),
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
        let old = Indexed::of(&inst, &self.cfg);
        let capacity = self.cfg.capacity_per_instance;
        self.index.update(key, Some(old), None, capacity);
        Some(inst)
    }

    // ---- leases -------------------------------------------------------------------------

    /// Slots that could ever exist at the current limits.
    fn max_slots(&self) -> u32 {
        self.max_instances().saturating_mul(self.capacity())
    }

    fn free_ready_slots(&self) -> u32 {
        self.index.free_slots
    }

    /// Promises a slot before a job is fetched.
    pub fn reserve(&mut self, now: Millis) -> Result<u64, LeaseError> {
        if self.shutting_down {
            return Err(LeaseError::ShuttingDown);
        }
        if let PoolHealth::Stopped(reason) = &self.health {
            return Err(LeaseError::Stopped(reason.clone()));
        }
        if self.reserved + self.acquired >= self.max_slots() {
            return Err(LeaseError::AtCapacity(self.max_slots()));
        }
        if self.policy(now).preemptive_mode && self.free_ready_slots() <= self.reserved {
            return Err(LeaseError::NoIdleSlot);
        }
        let id = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(
            id,
            Lease {
                id,
                state: LeaseState::Reserved,
                reserved_at: now,
                acquired_at: None,
            },
        );
        self.reserved += 1;
        Ok(id)
    }

    /// Binds a reserved lease to a ready slot; `Ok(None)` means "wait and try again".
    pub fn acquire(&mut self, now: Millis, id: u64) -> Result<Option<Binding>, LeaseError> {
        match self.leases.get(&id).map(|l| &l.state) {
            None => return Err(LeaseError::UnknownLease(id)),
            Some(LeaseState::Acquired { .. }) => return Err(LeaseError::AlreadyAcquired(id)),
            Some(LeaseState::Failed { cause }) => {
                return Err(LeaseError::Failed {
                    id,
                    cause: cause.clone(),
                });
            }
            Some(LeaseState::Reserved) => {}
        }
        let Some(&(_, key)) = self.index.available.iter().next() else {
            return Ok(None);
        };
        let max_use = self.cfg.max_use_count;
        let bound = self.with_inst(key, |inst| {
            let (slot, cell) = inst
                .slots
                .iter_mut()
                .enumerate()
                .find(|(_, cell)| cell.is_none())?;
            *cell = Some(id);
            inst.used += 1;
            inst.uses += 1;
            inst.idle_since = None;
            Some((
                inst.id.clone(),
                slot as u32,
                max_use > 0 && inst.uses >= max_use,
            ))
        });
        let Some(Some((instance, slot, exhausted))) = bound else {
            return Ok(None);
        };
        if exhausted {
            // Max use count reached: no new jobs; deleted once its leases are released.
            self.with_inst(key, |inst| inst.state = InstState::Draining);
        }
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.state = LeaseState::Acquired {
                instance: instance.clone(),
                slot,
            };
            lease.acquired_at = Some(now);
        }
        self.reserved -= 1;
        self.acquired += 1;
        Ok(Some(Binding { instance, slot }))
    }

    /// Drops a reservation that got no job.
    pub fn unreserve(&mut self, id: u64) -> Result<(), LeaseError> {
        match self.leases.get(&id).map(|l| l.state.clone()) {
            None => Err(LeaseError::UnknownLease(id)),
            Some(LeaseState::Acquired { .. }) => Err(LeaseError::Acquired(id)),
            Some(LeaseState::Failed { .. }) => {
                self.leases.remove(&id);
                Ok(())
            }
            Some(LeaseState::Reserved) => {
                self.leases.remove(&id);
                self.reserved -= 1;
                Ok(())
            }
        }
    }

    /// Frees an acquired slot (a failed lease is acknowledged and forgotten).
    pub fn release(&mut self, now: Millis, id: u64) -> Result<(), LeaseError> {
        let state = match self.leases.get(&id) {
            None => return Err(LeaseError::UnknownLease(id)),
            Some(l) => l.state.clone(),
        };
        match state {
            LeaseState::Reserved => Err(LeaseError::NotAcquired(id)),
            LeaseState::Failed { .. } => {
                self.leases.remove(&id);
                Ok(())
            }
            LeaseState::Acquired { instance, slot } => {
                self.leases.remove(&id);
                self.acquired -= 1;
                if let Some(&key) = self.by_id.get(&instance) {
                    self.with_inst(key, |inst| {
                        if let Some(s) = inst.slots.get_mut(slot as usize) {
                            *s = None;
                        }
                        inst.used = inst.used.saturating_sub(1);
                        if inst.used == 0 {
                            inst.idle_since = Some(now);
                        }
                    });
                }
                Ok(())
            }
        }
    }

    /// A lease by id.
    pub fn lease(&self, id: u64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    /// Every lease.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    /// Connection lookups need the instance id of an acquired lease.
    pub fn instance_of(&self, id: u64) -> Option<&str> {
        match &self.leases.get(&id)?.state {
            LeaseState::Acquired { instance, .. } => Some(instance),
            _ => None,
        }
    }

    fn fail_leases(&mut self, key: u64, cause: &str) {
        let Some(inst) = self.insts.get(&key) else {
            return;
        };
        let ids: Vec<u64> = inst.slots.iter().flatten().copied().collect();
        for id in ids {
            if let Some(lease) = self.leases.get_mut(&id)
                && matches!(lease.state, LeaseState::Acquired { .. })
            {
                lease.state = LeaseState::Failed {
                    cause: cause.to_string(),
                };
                self.acquired -= 1;
                self.counters.leases_failed += 1;
            }
        }
        self.with_inst(key, |inst| {
            inst.slots.iter_mut().for_each(|s| *s = None);
            inst.used = 0;
        });
    }

    // ---- planning -----------------------------------------------------------------------

    fn refill(&mut self, now: Millis) {
        if self.cfg.throttle_limit <= 0.0 {
            self.tokens = f64::INFINITY;
            return;
        }
        let dt = now.saturating_sub(self.tokens_at) as f64 / 1000.0;
        self.tokens = (self.tokens + dt * self.cfg.throttle_limit)
            .min(f64::from(self.cfg.throttle_burst.max(1)));
        self.tokens_at = now;
    }

    /// Instances the pool knows in `state`.
    pub fn count_in(&self, state: InstState) -> u32 {
        self.index.count(state)
    }

    /// Slots bound to leases.
    pub fn acquired_slots(&self) -> u32 {
        self.acquired
    }

    /// Instances that count toward capacity: requested, coming up, or ready.
    fn live(&self) -> u32 {
        let n = |s| self.index.count(s);
        n(InstState::Creating)
            + n(InstState::Running)
            + n(InstState::Ready)
            + self.pending.len() as u32
    }

    /// Instances the active policy wants at `now`.
    pub fn desired(&self, now: Millis) -> u32 {
        if self.shutting_down {
            return 0;
        }
        let in_use = self.reserved + self.acquired;
        let want_slots = in_use.saturating_add(self.policy(now).idle_target(in_use));
        // Slots on draining instances that are still busy do not help new jobs.
        want_slots
            .div_ceil(self.capacity())
            .min(self.max_instances())
    }

    /// The earliest time something time-based may change (idle expiry, backoff, update).
    pub fn next_wakeup(&self, now: Millis) -> Millis {
        let mut next = Millis::MAX;
        // The periodic update, once it may be sent: an update in flight wakes the pool by
        // finishing, a stopped pool sends none, and a backoff postpones it.
        if !self.update_in_flight && !matches!(self.health, PoolHealth::Stopped(_)) {
            let due = self
                .last_update
                .map_or(now, |t| t + self.cfg.update_interval_ms);
            next = due.max(self.backoff_until);
        }
        if self.backoff_until > now {
            next = next.min(self.backoff_until);
        }
        // Only future deadlines count: an idle instance kept for idle_count, or a deletion
        // already retried, or an update that cannot be sent yet, must not make the driver spin.
        let idle_time = self.policy(now).idle_time_ms;
        let retry = self.cfg.deletion_retry_interval_ms;
        // The earliest `idle_since + idle_time > now`, i.e. `idle_since >= now + 1 - idle_time`.
        let idle_from = (now + 1).saturating_sub(idle_time);
        if let Some(&(s, _)) = self.index.idle.range((idle_from, 0)..).next() {
            next = next.min(s + idle_time);
        }
        let retry_from = (now + 1).saturating_sub(retry);
        if let Some(&(t, _)) = self.index.delete_requested.range((retry_from, 0)..).next() {
            next = next.min(t + retry);
        }
        if self.cfg.throttle_limit > 0.0 && self.tokens < 1.0 {
            let wait = ((1.0 - self.tokens) / self.cfg.throttle_limit * 1000.0).ceil() as Millis;
            next = next.min(now + wait.max(1));
        }
        // Policies change on minute boundaries.
        next.min((now / 60_000 + 1) * 60_000).max(now + 1)
    }

    /// Decides what to do now. Marks the work in flight, so calling it again is safe.
    pub fn plan(&mut self, now: Millis) -> Vec<Action> {
        let mut actions = Vec::new();
        if matches!(self.health, PoolHealth::Stopped(_)) {
            return actions;
        }
        self.pending
            .retain(|t| now.saturating_sub(*t) < PENDING_EXPIRY_MS);
        let due = self
            .last_update
            .is_none_or(|t| now >= t + self.cfg.update_interval_ms);
        if !self.update_in_flight && now >= self.backoff_until && (due || self.update_wanted) {
            self.update_in_flight = true;
            self.update_wanted = false;
            actions.push(Action::Update);
        }
        if !self.first_update_done || self.shutting_down {
            // Adopt before deciding: the first update says what already exists. While shutting
            // down, only observe: the driver decides about deleting instances.
            return actions;
        }
        let heartbeat_every = self.cfg.update_interval_ms;
        for key in self.index.in_state(InstState::Running) {
            if let Some(inst) = self.insts.get_mut(&key)
                && !inst.readiness_in_flight
            {
                inst.readiness_in_flight = true;
                actions.push(Action::CheckReady(inst.id.clone()));
            }
        }
        if self.heartbeats {
            let beating = self.index.in_state(InstState::Ready);
            for key in beating.chain(self.index.in_state(InstState::Draining)) {
                if let Some(inst) = self.insts.get_mut(&key)
                    && !inst.heartbeat_in_flight
                    && now >= inst.last_heartbeat + heartbeat_every
                {
                    inst.heartbeat_in_flight = true;
                    actions.push(Action::Heartbeat(inst.id.clone()));
                }
            }
        }

        let desired = self.desired(now);
        let live = self.live();
        self.refill(now);
        // Every instance the cloud still has counts toward the maximum, including failed and
        // deleting ones, so a replacement never overshoots `max_instances`.
        let headroom = self
            .max_instances()
            .saturating_sub(self.insts.len() as u32 + self.pending.len() as u32);
        if desired > live && headroom > 0 && !self.increase_in_flight && now >= self.backoff_until {
            let want = (desired - live).min(headroom);
            let allowed = if self.tokens.is_infinite() {
                want
            } else {
                want.min(self.tokens.floor() as u32)
            };
            if allowed > 0 {
                self.increase_in_flight = true;
                if self.tokens.is_finite() {
                    self.tokens -= f64::from(allowed);
                }
                actions.push(Action::Increase(allowed));
            }
        }

        let mut remove: Vec<u64> = Vec::new();
        // Broken, and drained-and-empty instances go.
        let doomed = [InstState::Failed, InstState::Draining, InstState::Deleting]
            .into_iter()
            .flat_map(|s| self.index.in_state(s));
        for (key, inst) in doomed.filter_map(|k| Some((k, self.insts.get(&k)?))) {
            let empty = inst.used == 0;
            if inst
                .delete_requested_at
                .is_some_and(|t| now < t + self.cfg.deletion_retry_interval_ms)
            {
                continue;
            }
            match inst.state {
                InstState::Failed => remove.push(key),
                InstState::Draining if empty => remove.push(key),
                InstState::Deleting if inst.delete_requested_at.is_some() => remove.push(key),
                _ => {}
            }
        }
        // Scale down: unused ready instances idle past idle_time, longest idle first,
        // as long as the idle target stays covered.
        if desired < live {
            let idle_time = self.policy(now).idle_time_ms;
            let surplus = (live - desired) as usize;
            // The index is ordered by (idle_since, key): longest idle first.
            let candidates = self
                .index
                .idle
                .iter()
                .take_while(|(s, _)| now >= s + idle_time)
                .filter(|(_, k)| {
                    self.insts
                        .get(k)
                        .is_some_and(|i| i.state == InstState::Ready && i.used == 0)
                })
                .map(|&(_, k)| k);
            remove.extend(candidates.take(surplus));
        }
        let mut ids = Vec::new();
        for key in remove {
            let scaled_down = self
                .insts
                .get(&key)
                .is_some_and(|i| i.state == InstState::Ready);
            self.with_inst(key, |inst| {
                if inst.state != InstState::Failed {
                    inst.state = InstState::Deleting;
                }
                inst.delete_requested_at = Some(now);
                ids.push(inst.id.clone());
            });
            if scaled_down {
                self.counters.scale_down += 1;
            }
        }
        if !ids.is_empty() {
            actions.push(Action::Decrease(ids));
        }
        actions
    }

    // ---- results ------------------------------------------------------------------------

    fn provider_failed(&mut self, now: Millis, e: &CallError) {
        self.last_error = Some(e.to_string());
        match e.provider_error() {
            Some(ProviderError::InvalidConfig(_)) | Some(ProviderError::Unauthorized(_)) => {
                self.health = PoolHealth::Stopped(e.to_string());
                return;
            }
            _ => {}
        }
        let retry_after = match e.provider_error() {
            Some(ProviderError::Throttled { retry_after, .. }) => retry_after.as_millis() as Millis,
            _ => 0,
        };
        self.backoff_attempt = (self.backoff_attempt + 1).min(20);
        let base = 1000u64
            .saturating_mul(1 << self.backoff_attempt.min(9))
            .min(MAX_BACKOFF_MS);
        // Full jitter, derived from the clock so virtual-time runs stay deterministic.
        let jitter = (now
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 33)
            % (base / 2 + 1);
        self.backoff_until = now + (base / 2 + jitter).max(retry_after);
        self.health = PoolHealth::Degraded(e.to_string());
    }

    fn provider_ok(&mut self) {
        self.backoff_attempt = 0;
        if !matches!(self.health, PoolHealth::Stopped(_)) && self.first_update_done {
            self.health = PoolHealth::Ready;
        }
    }

    /// Learns the result of `update()`.
    pub fn on_update(&mut self, now: Millis, result: Result<Vec<Instance>, CallError>) {
        self.update_in_flight = false;
        self.last_update = Some(now);
        let list = match result {
            Ok(list) => list,
            Err(e) => {
                self.provider_failed(now, &e);
                return;
            }
        };
        let mut seen = HashSet::with_capacity(list.len());
        for reported in list {
            seen.insert(reported.id.clone());
            let key = match self.by_id.get(&reported.id) {
                Some(&k) => k,
                None => {
                    if matches!(
                        reported.state,
                        InstanceState::Deleted | InstanceState::Deleting
                    ) {
                        continue;
                    }
                    // New to us: one of ours coming up, or one to adopt.
                    self.pending.pop_front();
                    let key = self.next_key;
                    self.next_key += 1;
                    let inst = Inst {
                        id: reported.id.clone(),
                        state: InstState::Creating,
                        seen_at: now,
                        ready_at: None,
                        idle_since: None,
                        slots: vec![None; self.capacity() as usize],
                        used: 0,
                        uses: 0,
                        failures: 0,
                        readiness_in_flight: false,
                        heartbeat_in_flight: false,
                        last_heartbeat: now,
                        delete_requested_at: None,
                        failure: None,
                    };
                    self.add_inst(key, inst);
                    key
                }
            };
            match reported.state {
                InstanceState::Creating => {}
                InstanceState::Running => {
                    self.with_inst(key, |i| {
                        if i.state == InstState::Creating {
                            i.state = InstState::Running;
                        }
                    });
                }
                InstanceState::Deleting => {
                    self.mark_gone(now, key, "the cloud is deleting it", false);
                }
                InstanceState::Deleted => self.mark_gone(now, key, "the cloud deleted it", true),
                InstanceState::Failed(reason) => {
                    let cause = format!("instance failed: {reason}");
                    self.fail_instance(key, &cause);
                }
            }
        }
        let vanished: Vec<u64> = self
            .insts
            .iter()
            .filter(|(_, i)| !seen.contains(&i.id))
            .map(|(&k, _)| k)
            .collect();
        for key in vanished {
            self.mark_gone(now, key, "the instance vanished", true);
        }
        self.first_update_done = true;
        self.provider_ok();
    }

    fn fail_instance(&mut self, key: u64, cause: &str) {
        self.fail_leases(key, cause);
        self.with_inst(key, |i| {
            if i.state != InstState::Deleting {
                i.state = InstState::Failed;
                i.failure = Some(cause.to_string());
            }
        });
    }

    fn mark_gone(&mut self, now: Millis, key: u64, cause: &str, forget: bool) {
        self.fail_leases(key, cause);
        if forget {
            if let Some(inst) = self.forget_inst(key) {
                self.counters
                    .lifetimes
                    .push(now.saturating_sub(inst.seen_at));
            }
        } else {
            self.with_inst(key, |i| i.state = InstState::Deleting);
        }
    }

    /// Learns the result of `increase(asked)`.
    pub fn on_increase(&mut self, now: Millis, asked: u32, result: Result<u32, CallError>) {
        self.increase_in_flight = false;
        match result {
            Ok(n) => {
                let n = n.min(asked);
                self.pending.extend(std::iter::repeat_n(now, n as usize));
                self.counters.scale_up += u64::from(n);
                self.update_wanted = true;
                if n < asked && self.provider_max == 0 {
                    // The cloud granted less than asked (quota, group max): back off a little.
                    self.backoff_until = self.backoff_until.max(now + 5_000);
                }
                self.provider_ok();
            }
            Err(e) => self.provider_failed(now, &e),
        }
    }

    /// Learns the result of `decrease(asked)`; ids not accepted are retried later.
    pub fn on_decrease(
        &mut self,
        now: Millis,
        asked: &[String],
        result: Result<Vec<String>, CallError>,
    ) {
        match result {
            Ok(accepted) => {
                for id in &accepted {
                    if let Some(&key) = self.by_id.get(id) {
                        self.with_inst(key, |i| i.state = InstState::Deleting);
                    }
                }
                let _ = asked;
                self.update_wanted = true;
                self.provider_ok();
            }
            Err(e) => self.provider_failed(now, &e),
        }
    }

    /// Learns the result of a readiness check.
    pub fn on_ready(&mut self, now: Millis, id: &str, result: Result<(), String>) {
        let Some(&key) = self.by_id.get(id) else {
            return;
        };
        let threshold = self.cfg.failure_threshold.max(1);
        let mut failed = None;
        let mut became_ready = None;
        self.with_inst(key, |i| {
            i.readiness_in_flight = false;
            if i.state != InstState::Running {
                return;
            }
            match &result {
                Ok(()) => {
                    i.state = InstState::Ready;
                    i.ready_at = Some(now);
                    i.idle_since = Some(now);
                    i.failures = 0;
                    became_ready = Some(now.saturating_sub(i.seen_at));
                }
                Err(reason) => {
                    i.failures += 1;
                    if i.failures >= threshold {
                        failed = Some(format!("readiness failed {} times: {reason}", i.failures));
                    }
                }
            }
        });
        if let Some(latency) = became_ready {
            self.counters.ready_latencies.push(latency);
        }
        if let Some(cause) = failed {
            self.fail_instance(key, &cause);
        }
    }

    /// Learns the result of `heartbeat(id)`: `not-found` means gone; other errors count
    /// toward `failure_threshold`.
    pub fn on_heartbeat(&mut self, now: Millis, id: &str, result: Result<(), CallError>) {
        let Some(&key) = self.by_id.get(id) else {
            return;
        };
        let threshold = self.cfg.failure_threshold.max(1);
        let mut failed = None;
        let gone = matches!(
            result.as_ref().err().and_then(CallError::provider_error),
            Some(ProviderError::NotFound(_))
        );
        self.with_inst(key, |i| {
            i.heartbeat_in_flight = false;
            i.last_heartbeat = now;
            match &result {
                Ok(()) => i.failures = 0,
                Err(_) if gone => {}
                Err(e) => {
                    i.failures += 1;
                    if i.failures >= threshold {
                        failed = Some(format!("heartbeat failed {} times: {e}", i.failures));
                    }
                }
            }
        });
        if gone {
            self.fail_instance(key, "heartbeat: the cloud no longer knows the instance");
        } else if let Some(cause) = failed {
            self.fail_instance(key, &cause);
        }
    }

    /// Stops handing out leases and drains the pool (deleting empty instances when `delete`).
    pub fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        let leased: Vec<u64> = self
            .insts
            .iter()
            .filter(|(_, i)| i.used > 0)
            .map(|(&k, _)| k)
            .collect();
        for key in leased {
            self.with_inst(key, |i| {
                if i.state == InstState::Ready {
                    i.state = InstState::Draining;
                }
            });
        }
    }

    /// Leases still acquired or reserved.
    pub fn busy_leases(&self) -> u32 {
        self.reserved + self.acquired
    }

    /// Ids of every instance the pool knows.
    pub fn instance_ids(&self) -> Vec<String> {
        self.insts.values().map(|i| i.id.clone()).collect()
    }

    /// Health and counts for the API and metrics.
    pub fn snapshot(&self, now: Millis) -> PoolSnapshot {
        let mut instances = std::collections::BTreeMap::new();
        for s in InstState::ALL {
            instances.insert(s.name(), self.index.count(s));
        }
        let free = self.free_ready_slots();
        let total: u32 = (self.insts.len() as u32).saturating_mul(self.capacity());
        let idle = free.saturating_sub(self.reserved);
        let unavailable = total.saturating_sub(free).saturating_sub(self.acquired);
        PoolSnapshot {
            health: self.health.clone(),
            instances,
            slots: SlotCounts {
                idle,
                reserved: self.reserved,
                acquired: self.acquired,
                unavailable,
            },
            desired: self.desired(now),
            pending: self.pending.len() as u32,
            max_instances: self.max_instances(),
            last_error: self.last_error.clone(),
        }
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

    /// Checks internal invariants; tests call it after every step.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut reserved = 0;
        let mut acquired = 0;
        for l in self.leases.values() {
            match &l.state {
                LeaseState::Reserved => reserved += 1,
                LeaseState::Acquired { instance, slot } => {
                    acquired += 1;
                    let key = self
                        .by_id
                        .get(instance)
                        .ok_or(format!("lease {} on unknown instance", l.id))?;
                    let inst = self
                        .insts
                        .get(key)
                        .ok_or(format!("instance {instance} has no record"))?;
                    if inst.slots.get(*slot as usize) != Some(&Some(l.id)) {
                        return Err(format!("lease {} not in slot {slot} of {instance}", l.id));
                    }
                    if !matches!(inst.state, InstState::Ready | InstState::Draining) {
                        return Err(format!(
                            "lease {} on {instance} in state {:?}",
                            l.id, inst.state
                        ));
                    }
                }
                LeaseState::Failed { .. } => {}
            }
        }
        if reserved != self.reserved || acquired != self.acquired {
            return Err(format!(
                "counters {}/{} vs {reserved}/{acquired}",
                self.reserved, self.acquired
            ));
        }
        let live = self
            .insts
            .values()
            .filter(|i| i.state != InstState::Deleting)
            .count() as u32;
        if live > self.cfg.max_instances + self.pending.len() as u32
            && live > self.cfg.max_instances
        {
            return Err(format!("{live} instances > max {}", self.cfg.max_instances));
        }
        for (&k, i) in &self.insts {
            let used = i.slots.iter().flatten().count() as u32;
            if used != i.used || used > self.capacity() {
                return Err(format!("{}: used {} slots {used}", i.id, i.used));
            }
            if self.cfg.max_use_count > 0 && i.uses > self.cfg.max_use_count {
                return Err(format!("{} used {} times", i.id, i.uses));
            }
            if self.is_available(i) != self.index.available.contains(&(Reverse(i.used), k)) {
                return Err(format!("{} availability index out of step", i.id));
            }
        }
        self.check_index()
    }

    /// The indexes agree with a fresh build from the instances.
    fn check_index(&self) -> Result<(), String> {
        let mut fresh = Index::default();
        for (&k, i) in &self.insts {
            let entry = Indexed::of(i, &self.cfg);
            fresh.update(k, None, Some(entry), self.capacity());
        }
        let index = &self.index;
        if fresh.available != index.available || fresh.free_slots != index.free_slots {
            return Err("availability index out of step".to_string());
        }
        if fresh.by_state != index.by_state {
            return Err("state index out of step".to_string());
        }
        if fresh.idle != index.idle || fresh.delete_requested != index.delete_requested {
            return Err("idle or deletion index out of step".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> PoolCore {
        let cfg = ScalerConfig {
            update_interval_ms: 30_000,
            ..ScalerConfig::default()
        };
        PoolCore::new(cfg, Vec::new(), 0)
    }

    fn throttled() -> CallError {
        CallError::Provider {
            function: flotilla_provider::Function::Update,
            error: ProviderError::Throttled {
                retry_after: std::time::Duration::from_secs(60),
                message: "slow".into(),
            },
        }
    }

    #[test]
    fn an_update_in_flight_does_not_make_the_pool_poll_every_millisecond() {
        let mut c = core();
        assert_eq!(c.plan(0), [Action::Update]);
        // The update is overdue at 40 s but in flight: its answer wakes the pool, not a timer.
        assert_eq!(c.next_wakeup(40_000), 60_000, "the next minute boundary");
    }

    #[test]
    fn an_overdue_update_during_backoff_waits_for_the_end_of_the_backoff() {
        let mut c = core();
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(1_000, Err(throttled()));
        assert_eq!(c.backoff_until, 61_000, "retry-after is honoured");
        // Due at 31 s, but no update may be sent before 61 s.
        assert_eq!(c.next_wakeup(40_000), 60_000, "the next minute boundary");
        assert_eq!(c.next_wakeup(60_500), 61_000, "the end of the backoff");
    }

    #[test]
    fn a_stopped_pool_wakes_only_on_minute_boundaries() {
        let mut c = core();
        c.stop("bad credentials".into());
        assert_eq!(c.next_wakeup(90_000), 120_000);
    }
}
