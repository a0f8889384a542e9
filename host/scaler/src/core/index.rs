//! Instance records and the indexes over them (by state, availability, idle time, deletion
//! requests), so no decision has to scan every instance. It owns how an instance is indexed;
//! it must not know when instances change or why (that is the rest of the core's business,
//! through `PoolCore::with_inst`).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::InstState;
use crate::policy::ActiveWindow;
use crate::{Millis, ScalerConfig};

/// One instance as the pool knows it.
#[derive(Debug, Clone)]
pub(super) struct Inst {
    pub(super) id: String,
    pub(super) state: InstState,
    pub(super) seen_at: Millis,
    pub(super) ready_at: Option<Millis>,
    /// When the last lease left (or it became ready); `None` while leased.
    pub(super) idle_since: Option<Millis>,
    pub(super) slots: Vec<Option<u64>>,
    pub(super) used: u32,
    pub(super) uses: u32,
    pub(super) failures: u32,
    pub(super) readiness_in_flight: bool,
    pub(super) heartbeat_in_flight: bool,
    pub(super) last_heartbeat: Millis,
    pub(super) delete_requested_at: Option<Millis>,
    pub(super) failure: Option<String>,
    /// When the last liveness ping of this ready instance was sent or answered.
    pub(super) last_ping: Millis,
    /// The last readiness or ping error, kept after recovery for the instances API.
    pub(super) last_error: Option<String>,
    /// No readiness check before this time (backoff after a failed one).
    pub(super) next_check: Millis,
    /// Failed readiness checks in a row, counted or not (drives the backoff).
    pub(super) failed_checks: u32,
    /// The last `update` that listed it (a count of updates), to find the vanished ones
    /// without a set of ids.
    pub(super) listed_in: u64,
    /// The tenant it is bound to: the first tenant whose lease it served.
    pub(super) tenant: Option<String>,
}

impl Inst {
    /// A newly seen instance, still being created.
    pub(super) fn new(id: String, now: Millis, capacity: u32) -> Inst {
        Inst {
            id,
            state: InstState::Creating,
            seen_at: now,
            ready_at: None,
            idle_since: None,
            slots: vec![None; capacity as usize],
            used: 0,
            uses: 0,
            failures: 0,
            readiness_in_flight: false,
            heartbeat_in_flight: false,
            last_heartbeat: now,
            delete_requested_at: None,
            failure: None,
            last_ping: now,
            last_error: None,
            next_check: 0,
            failed_checks: 0,
            listed_in: 0,
            tenant: None,
        }
    }
}

/// What the indexes of [`PoolCore`](super::PoolCore) record about one instance; recomputed around every change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Indexed {
    pub(super) state: InstState,
    /// Slots in use, when the instance can take a lease.
    pub(super) available: Option<u32>,
    pub(super) idle_since: Option<Millis>,
    pub(super) delete_requested_at: Option<Millis>,
}

impl Indexed {
    pub(super) fn of(inst: &Inst, cfg: &ScalerConfig) -> Indexed {
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
pub(super) struct Index {
    /// Ready, non-draining instances with a free slot, ordered fullest first.
    pub(super) available: BTreeSet<(Reverse<u32>, u64)>,
    /// Free slots on those instances.
    pub(super) free_slots: u32,
    /// Instances by state (indexed by `InstState as usize`).
    pub(super) by_state: [BTreeSet<u64>; 6],
    /// Instances with `idle_since`, oldest first.
    pub(super) idle: BTreeSet<(Millis, u64)>,
    /// Instances with `delete_requested_at`, oldest first.
    pub(super) delete_requested: BTreeSet<(Millis, u64)>,
}

impl Index {
    /// Moves `key` from what `old` recorded to what `new` records (`None`: not indexed).
    pub(super) fn update(
        &mut self,
        key: u64,
        old: Option<Indexed>,
        new: Option<Indexed>,
        capacity: u32,
    ) {
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

    pub(super) fn in_state(&self, state: InstState) -> impl Iterator<Item = u64> + '_ {
        self.by_state
            .get(state as usize)
            .into_iter()
            .flat_map(|set| set.iter().copied())
    }

    pub(super) fn count(&self, state: InstState) -> u32 {
        self.by_state
            .get(state as usize)
            .map_or(0, |set| set.len() as u32)
    }
}

/// The policy found for a span of time, so cron expressions are evaluated once per minute.
#[derive(Debug, Clone, Copy)]
pub(super) struct PolicyCache(pub(super) Option<ActiveWindow>);
