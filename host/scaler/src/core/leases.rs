//! Leases: reserve a slot before a job is fetched, bind it to a ready instance (acquire), and
//! give it back (release, unreserve); failing the leases of a broken instance. It owns the lease
//! table and the reserved/acquired counters; it must not know about providers or planning.

use std::collections::BTreeMap;

use super::{Binding, InstState, Lease, LeaseError, LeaseState, PoolCore, PoolHealth};
use crate::Millis;

impl PoolCore {
    /// Slots that could ever exist at the current limits, or on the instances that exist
    /// (a group's maximum lowered below them does not take them away).
    fn max_slots(&self) -> u32 {
        self.max_instances()
            .max(self.insts.len() as u32)
            .saturating_mul(self.capacity())
    }

    pub(super) fn free_ready_slots(&self) -> u32 {
        self.index.free_slots
    }

    /// Promises a slot before a job is fetched.
    pub fn reserve(&mut self, now: Millis) -> Result<u64, LeaseError> {
        self.reserve_labelled(now, BTreeMap::new())
    }

    /// The live lease carrying the label `key=value`, if any.
    pub fn lease_by_label(&self, key: &str, value: &str) -> Option<&Lease> {
        self.leases
            .by_label(key, value)
            .or_else(|| self.restoring.by_label(key, value))
    }

    /// Promises a slot for a client that tags it with `labels`; a label already on a live
    /// lease is refused, so a retried reservation cannot take a second slot.
    pub fn reserve_labelled(
        &mut self,
        now: Millis,
        labels: BTreeMap<String, String>,
    ) -> Result<u64, LeaseError> {
        self.reserve_within(now, labels, None)
    }

    /// Like [`PoolCore::reserve_labelled`], and the lease fails `deadline_after` ms from now
    /// whatever its state (the holder's own bound, e.g. a CI job's timeout plus a grace).
    pub fn reserve_within(
        &mut self,
        now: Millis,
        labels: BTreeMap<String, String>,
        deadline_after: Option<Millis>,
    ) -> Result<u64, LeaseError> {
        for (key, value) in &labels {
            if let Some(held) = self.lease_by_label(key, value) {
                return Err(LeaseError::LabelInUse {
                    key: key.clone(),
                    value: value.clone(),
                    lease: held.id,
                });
            }
        }
        if self.phase.shutting_down() {
            return Err(LeaseError::ShuttingDown);
        }
        if let PoolHealth::Stopped(reason) = &self.health {
            return Err(LeaseError::Stopped(reason.clone()));
        }
        if self.reserved + self.acquired + self.restoring.len() as u32 >= self.max_slots() {
            return Err(LeaseError::AtCapacity(self.max_slots()));
        }
        if self.policy(now).preemptive_mode && self.free_ready_slots() <= self.reserved {
            return Err(LeaseError::NoIdleSlot);
        }
        let id = self.next_lease.take();
        self.leases.insert(Lease {
            id,
            state: LeaseState::Reserved,
            reserved_at: now,
            acquired_at: None,
            labels,
            expires_at: self.cfg.lease_ttl_ms.map(|ttl| now.saturating_add(ttl)),
            deadline_at: deadline_after.map(|after| now.saturating_add(after)),
        });
        self.reserved += 1;
        Ok(id)
    }

    /// Binds a reserved lease to a ready slot; `Ok(None)` means "wait and try again".
    pub fn acquire(&mut self, now: Millis, id: u64) -> Result<Option<Binding>, LeaseError> {
        self.acquirable(id)?;
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
        self.leases.update(id, |lease| {
            lease.state = LeaseState::Acquired {
                instance: instance.clone(),
                slot,
            };
            lease.acquired_at = Some(now);
        });
        self.reserved -= 1;
        self.acquired += 1;
        Ok(Some(Binding { instance, slot }))
    }

    /// Whether `acquire` could bind this lease once a slot is free (it is reserved).
    pub fn acquirable(&self, id: u64) -> Result<(), LeaseError> {
        match self.leases.get(id).map(|l| &l.state) {
            None => Err(LeaseError::UnknownLease(id)),
            Some(LeaseState::Acquired { .. }) => Err(LeaseError::AlreadyAcquired(id)),
            Some(LeaseState::Failed { cause }) => Err(LeaseError::Failed {
                id,
                cause: cause.clone(),
            }),
            Some(LeaseState::Reserved) => Ok(()),
        }
    }

    /// Drops a reservation that got no job.
    pub fn unreserve(&mut self, id: u64) -> Result<(), LeaseError> {
        if self.restoring.contains(id) {
            return Err(LeaseError::Acquired(id));
        }
        match self.leases.get(id).map(|l| l.state.clone()) {
            None => Err(LeaseError::UnknownLease(id)),
            Some(LeaseState::Acquired { .. }) => Err(LeaseError::Acquired(id)),
            Some(LeaseState::Failed { .. }) => {
                self.leases.remove(id);
                Ok(())
            }
            Some(LeaseState::Reserved) => {
                self.leases.remove(id);
                self.reserved -= 1;
                Ok(())
            }
        }
    }

    /// Frees an acquired slot (a failed lease is acknowledged and forgotten).
    pub fn release(&mut self, now: Millis, id: u64) -> Result<(), LeaseError> {
        if self.restoring.remove(id).is_some() {
            // Restored, not yet bound again (the first update has not come back).
            return Ok(());
        }
        let state = match self.leases.get(id) {
            None => return Err(LeaseError::UnknownLease(id)),
            Some(l) => l.state.clone(),
        };
        match state {
            LeaseState::Reserved => Err(LeaseError::NotAcquired(id)),
            LeaseState::Failed { .. } => {
                self.leases.remove(id);
                Ok(())
            }
            LeaseState::Acquired { instance, slot } => {
                self.leases.remove(id);
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

    /// Releases an acquired lease whose client found its instance broken (e.g. the job left
    /// Docker unreachable): the instance is failed with `cause`, so no other lease gets it and
    /// it is replaced.
    pub fn release_broken(&mut self, now: Millis, id: u64, cause: &str) -> Result<(), LeaseError> {
        let instance = match self.leases.get(id).map(|l| &l.state) {
            Some(LeaseState::Acquired { instance, .. }) => Some(instance.clone()),
            _ => None,
        };
        self.release(now, id)?;
        if let Some(key) = instance.and_then(|i| self.by_id.get(&i).copied()) {
            self.fail_instance(key, &format!("reported broken by a lease holder: {cause}"));
        }
        Ok(())
    }

    /// Jobs an instance has taken (for the journal).
    pub fn uses_of(&self, instance: &str) -> Option<u32> {
        let key = self.by_id.get(instance)?;
        self.insts.get(key).map(|i| i.uses)
    }

    /// Undoes an acquire whose journal write failed: the lease is reserved again and its slot
    /// and use are given back.
    pub fn unacquire(&mut self, now: Millis, id: u64) {
        let Some(LeaseState::Acquired { instance, slot }) =
            self.leases.get(id).map(|l| l.state.clone())
        else {
            return;
        };
        if let Some(&key) = self.by_id.get(&instance) {
            self.with_inst(key, |inst| {
                if let Some(cell) = inst.slots.get_mut(slot as usize) {
                    *cell = None;
                }
                inst.used = inst.used.saturating_sub(1);
                inst.uses = inst.uses.saturating_sub(1);
                if inst.used == 0 {
                    inst.idle_since = Some(now);
                }
                if inst.state == InstState::Draining && inst.used == 0 {
                    inst.state = InstState::Ready;
                }
            });
        }
        self.leases.update(id, |lease| {
            lease.state = LeaseState::Reserved;
            lease.acquired_at = None;
        });
        self.acquired -= 1;
        self.reserved += 1;
    }

    /// A lease by id.
    pub fn lease(&self, id: u64) -> Option<&Lease> {
        self.leases.get(id).or_else(|| self.restoring.get(id))
    }

    /// Every lease.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values().chain(self.restoring.values())
    }

    /// Connection lookups need the instance id of an acquired lease.
    pub fn instance_of(&self, id: u64) -> Option<&str> {
        match &self.leases.get(id)?.state {
            LeaseState::Acquired { instance, .. } => Some(instance),
            _ => None,
        }
    }

    pub(super) fn fail_leases(&mut self, key: u64, cause: &str) {
        let Some(inst) = self.insts.get(&key) else {
            return;
        };
        let ids: Vec<u64> = inst.slots.iter().flatten().copied().collect();
        for id in ids {
            let failed = self.leases.update(id, |lease| {
                let acquired = matches!(lease.state, LeaseState::Acquired { .. });
                if acquired {
                    lease.state = LeaseState::Failed {
                        cause: cause.to_string(),
                    };
                }
                acquired
            });
            if failed == Some(true) {
                self.acquired -= 1;
                self.counters.leases_failed += 1;
            }
        }
        self.with_inst(key, |inst| {
            inst.slots.iter_mut().for_each(|s| *s = None);
            inst.used = 0;
        });
    }
}
