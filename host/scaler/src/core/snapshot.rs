//! Looking at the pool from outside: counts by state, the snapshot for the API and metrics,
//! and the invariant checks the tests run after every step. Read-only; it must not change the
//! pool.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::{
    Index, Indexed, InstState, InstanceView, LeaseState, PoolCore, PoolSnapshot, RestartView,
    SlotCounts,
};
use crate::Millis;

impl PoolCore {
    /// Instances the pool knows in `state`.
    pub fn count_in(&self, state: InstState) -> u32 {
        self.index.count(state)
    }

    /// Slots bound to leases.
    pub fn acquired_slots(&self) -> u32 {
        self.acquired
    }

    /// Leases still acquired or reserved.
    pub fn busy_leases(&self) -> u32 {
        self.reserved + self.acquired
    }

    /// Ids of every instance the pool knows.
    pub fn instance_ids(&self) -> Vec<String> {
        self.insts.values().map(|i| i.id.clone()).collect()
    }

    /// Every instance the pool knows, ordered by id, for the instances API.
    pub fn instances(&self) -> Vec<InstanceView> {
        let mut out: Vec<InstanceView> = self
            .insts
            .values()
            .map(|i| InstanceView {
                id: i.id.clone(),
                state: i.state,
                seen_at: i.seen_at,
                ready_since: i
                    .ready_at
                    .filter(|_| matches!(i.state, InstState::Ready | InstState::Draining)),
                slots_used: i.used,
                use_count: i.uses,
                tenant: i.tenant.clone(),
                failures: i.failures,
                last_error: i.failure.clone().or_else(|| i.last_error.clone()),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Health and counts for the API and metrics.
    pub fn snapshot(&self, now: Millis) -> PoolSnapshot {
        let mut instances = BTreeMap::new();
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
            capacity_per_instance: self.capacity(),
            last_error: self.last_error.clone(),
            restart: RestartView {
                leases_restored: self.counters.leases_restored,
                leases_lost: self.counters.leases_lost,
                leases_expired: self.counters.leases_expired,
                instances_adopted: self.adopted.map_or(0, |(n, _)| n),
                adopted_after_ms: self.adopted.map(|(_, t)| t.saturating_sub(self.started_at)),
            },
            paused: self.paused(),
            acquires_waiting: 0,
        }
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
        self.leases.check()?;
        self.restoring.check()?;
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
