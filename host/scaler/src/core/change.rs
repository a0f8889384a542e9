//! Every lease change in two steps. The core checks it under its lock and says what the
//! journal must hold for it (`plan_*`, which change nothing and return a [`Change`]); only
//! [`PoolCore::commit`] makes it. The driver makes the change's [`Write`] durable between the
//! two (durable before acknowledged, `PoolHandle::durably`); the simulator and the core's own
//! one-step calls (`release`, `unreserve`, …) commit at once. The rules of each change (who
//! may release what, when a reservation is refused) live in its `plan_*` only, and what it
//! does to the pool in `commit` only.

use std::collections::BTreeMap;

use super::{Binding, InstState, Lease, LeaseError, LeaseState, PoolCore};
use crate::Millis;

/// What the journal must hold for a lease change before the change is made and acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write<'a> {
    /// The lease as it will be, with its instance's use count after the change when the
    /// change binds or unbinds it.
    Save(&'a Lease, Option<(&'a str, u32)>),
    /// The lease is gone.
    Remove(u64),
}

/// A lease change the core checked and has not made: what the journal must hold for it
/// ([`Change::write`]), and what [`PoolCore::commit`] will do. Plan and commit under one hold
/// of the core's lock, so nothing comes between the check and the change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a planned change does nothing until it is committed"]
pub struct Change {
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    /// A new reservation.
    Reserve(Lease),
    /// A reservation bound to a free slot of instance `key`; `uses`: its jobs once bound.
    Acquire {
        lease: Lease,
        binding: Binding,
        key: u64,
        uses: u32,
    },
    /// A binding nobody received, given back: the lease reserved again, and its instance's
    /// jobs once the use is given back.
    Unacquire {
        lease: Lease,
        freed: Binding,
        uses: u32,
        now: Millis,
    },
    /// An acquired lease freed (or a failed one acknowledged, or one still being restored),
    /// as it was; `broken`: its holder found its instance broken, which is failed.
    Release {
        lease: Lease,
        now: Millis,
        broken: Option<String>,
    },
    /// A reservation (or a failed lease) dropped, as it was.
    Unreserve(Lease),
    /// A reservation handed over by the pool this one is the fallback of; `held`: this pool
    /// holds it already, and taking it changes nothing.
    TakeOver { lease: Lease, held: bool },
}

/// What a committed change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The lease changed.
    pub id: u64,
    /// Where an acquire bound it.
    pub binding: Option<Binding>,
    /// The lease that ended (released or unreserved), as it was: for the lease history.
    pub ended: Option<Lease>,
}

impl Change {
    /// What the journal must hold before the change is made.
    pub fn write(&self) -> Write<'_> {
        match &self.op {
            Op::Reserve(lease) | Op::TakeOver { lease, .. } => Write::Save(lease, None),
            Op::Acquire {
                lease,
                binding,
                uses,
                ..
            } => Write::Save(lease, Some((&binding.instance, *uses))),
            Op::Unacquire {
                lease, freed, uses, ..
            } => Write::Save(lease, Some((&freed.instance, *uses))),
            Op::Release { lease, .. } | Op::Unreserve(lease) => Write::Remove(lease.id),
        }
    }

    /// The lease it changes: as it will be, or as it was when the change ends it.
    pub fn lease(&self) -> &Lease {
        match &self.op {
            Op::Reserve(lease)
            | Op::Unreserve(lease)
            | Op::Acquire { lease, .. }
            | Op::Unacquire { lease, .. }
            | Op::Release { lease, .. }
            | Op::TakeOver { lease, .. } => lease,
        }
    }
}

impl PoolCore {
    /// Makes a change [`plan_*`](PoolCore::plan_reserve) checked, under the same lock.
    pub fn commit(&mut self, change: Change) -> Committed {
        let id = change.lease().id;
        let mut done = Committed {
            id,
            binding: None,
            ended: None,
        };
        match change.op {
            Op::Reserve(lease) => self.insert_reserved(lease),
            Op::TakeOver { lease, held } => {
                if !held {
                    self.next_lease.at_least(id.saturating_add(1));
                    self.insert_reserved(lease);
                }
            }
            Op::Acquire {
                lease,
                binding,
                key,
                uses: _,
            } => {
                self.bind_slot(key, &lease, &binding);
                self.leases.update(id, |l| *l = lease);
                done.binding = Some(binding);
            }
            Op::Unacquire {
                lease, freed, now, ..
            } => {
                self.free_slot(&freed, now, true);
                self.leases.update(id, |l| *l = lease);
                self.acquired -= 1;
                self.reserved += 1;
            }
            Op::Release { lease, now, broken } => {
                self.commit_release(&lease, now, broken.as_deref());
                done.ended = Some(lease);
            }
            Op::Unreserve(lease) => {
                if self.leases.remove(id).map(|l| l.state) == Some(LeaseState::Reserved) {
                    self.reserved -= 1;
                }
                done.ended = Some(lease);
            }
        }
        done
    }

    /// Checks a reservation and returns the lease it makes, changing nothing but using up an
    /// id. Refused when a live lease holds one of its labels, the pool does not run, it is
    /// full, or (preemptive mode) no idle slot waits for it.
    pub fn plan_reserve(
        &self,
        now: Millis,
        labels: BTreeMap<String, String>,
        deadline_after: Option<Millis>,
        tenant: Option<String>,
    ) -> Result<Change, LeaseError> {
        self.admissible(&labels)?;
        if self.policy(now).preemptive_mode && self.free_ready_slots() <= self.reserved {
            return Err(LeaseError::NoIdleSlot);
        }
        let lease = Lease {
            id: self.next_lease.take(),
            state: LeaseState::Reserved,
            reserved_at: now,
            acquired_at: None,
            labels,
            expires_at: self.cfg.lease_ttl_ms.map(|ttl| now.saturating_add(ttl)),
            deadline_at: deadline_after.map(|after| now.saturating_add(after)),
            tenant,
            handed_from: None,
        };
        Ok(Change {
            op: Op::Reserve(lease),
        })
    }

    /// Checks an acquire and picks its slot, changing nothing; `Ok(None)`: no free slot it
    /// may take yet.
    pub fn plan_acquire(&self, now: Millis, id: u64) -> Result<Option<Change>, LeaseError> {
        self.acquirable(id)?;
        let Some(lease) = self.leases.get(id) else {
            return Err(LeaseError::UnknownLease(id));
        };
        let Some(key) = self.available_for(lease.tenant.as_deref()) else {
            return Ok(None);
        };
        let Some(inst) = self.insts.get(&key) else {
            return Ok(None);
        };
        let Some(slot) = inst.slots.iter().position(Option::is_none) else {
            return Ok(None);
        };
        let binding = Binding {
            instance: inst.id.clone(),
            slot: slot as u32,
        };
        let mut bound = lease.clone();
        bound.state = LeaseState::Acquired {
            instance: binding.instance.clone(),
            slot: binding.slot,
        };
        bound.acquired_at = Some(now);
        Ok(Some(Change {
            op: Op::Acquire {
                lease: bound,
                binding,
                key,
                uses: inst.uses + 1,
            },
        }))
    }

    /// Plans undoing a binding nobody received (the acquire's caller left between the grant
    /// and the answer): the lease reserved again, its slot and use given back. `None`: the
    /// lease is not bound.
    pub fn plan_unacquire(&self, now: Millis, id: u64) -> Option<Change> {
        let lease = self.leases.get(id)?;
        let LeaseState::Acquired { instance, slot } = &lease.state else {
            return None;
        };
        let uses = self.uses_of(instance).unwrap_or(1).saturating_sub(1);
        let freed = Binding {
            instance: instance.clone(),
            slot: *slot,
        };
        let mut reserved = lease.clone();
        reserved.state = LeaseState::Reserved;
        reserved.acquired_at = None;
        Some(Change {
            op: Op::Unacquire {
                lease: reserved,
                freed,
                uses,
                now,
            },
        })
    }

    /// Checks a release: an acquired lease frees its slot, a failed one is acknowledged, and
    /// one still being restored is forgotten; a reservation is not released (it is
    /// unreserved). With `broken`, the holder found the instance broken: it is failed and
    /// replaced, so no other lease gets it.
    pub fn plan_release(
        &self,
        now: Millis,
        id: u64,
        broken: Option<&str>,
    ) -> Result<Change, LeaseError> {
        let lease = match self.restoring.get(id) {
            Some(restoring) => restoring,
            None => match self.leases.get(id) {
                None => return Err(LeaseError::UnknownLease(id)),
                Some(l) if l.state == LeaseState::Reserved => {
                    return Err(LeaseError::NotAcquired(id));
                }
                Some(l) => l,
            },
        };
        Ok(Change {
            op: Op::Release {
                lease: lease.clone(),
                now,
                broken: broken.map(str::to_string),
            },
        })
    }

    /// Checks dropping a reservation that got no job, or a failed lease; an acquired lease
    /// (or one still being restored) is released instead.
    pub fn plan_unreserve(&self, id: u64) -> Result<Change, LeaseError> {
        if self.restoring.contains(id) {
            return Err(LeaseError::Acquired(id));
        }
        match self.leases.get(id) {
            None => Err(LeaseError::UnknownLease(id)),
            Some(l) if matches!(l.state, LeaseState::Acquired { .. }) => {
                Err(LeaseError::Acquired(id))
            }
            Some(l) => Ok(Change {
                op: Op::Unreserve(l.clone()),
            }),
        }
    }

    /// Checks taking a reservation handed over by the pool this one is the fallback of: same
    /// id, labels, tenant and deadlines, refused as a reservation of its own would be.
    /// Taking one it already holds changes nothing.
    pub fn plan_take_over(&self, lease: Lease) -> Result<Change, LeaseError> {
        if lease.state != LeaseState::Reserved {
            return Err(LeaseError::Acquired(lease.id));
        }
        let held = self.leases.contains(lease.id);
        if !held {
            self.admissible(&lease.labels)?;
        }
        Ok(Change {
            op: Op::TakeOver { lease, held },
        })
    }

    fn insert_reserved(&mut self, lease: Lease) {
        self.tenants_seen |= lease.tenant.is_some();
        self.leases.insert(lease);
        self.reserved += 1;
    }

    /// Puts a lease in a slot of instance `key`: the instance serves its tenant for good, and
    /// one that reached its max use count drains.
    fn bind_slot(&mut self, key: u64, lease: &Lease, binding: &Binding) {
        let max_use = self.cfg.max_use_count;
        let exhausted = self.with_inst(key, |inst| {
            if inst.tenant.is_none() {
                inst.tenant.clone_from(&lease.tenant);
            }
            if let Some(cell) = inst.slots.get_mut(binding.slot as usize) {
                *cell = Some(lease.id);
            }
            inst.used += 1;
            inst.uses += 1;
            inst.idle_since = None;
            max_use > 0 && inst.uses >= max_use
        });
        if exhausted == Some(true) {
            // Max use count reached: no new jobs; deleted once its leases are released.
            self.with_inst(key, |inst| inst.state = InstState::Draining);
        }
        self.reserved -= 1;
        self.acquired += 1;
    }

    /// Empties a slot; `unused`: the job never ran there, so its use is given back too (and a
    /// drain that use started ends).
    fn free_slot(&mut self, freed: &Binding, now: Millis, unused: bool) {
        let Some(&key) = self.by_id.get(&freed.instance) else {
            return;
        };
        self.with_inst(key, |inst| {
            if let Some(cell) = inst.slots.get_mut(freed.slot as usize) {
                *cell = None;
            }
            inst.used = inst.used.saturating_sub(1);
            if inst.used == 0 {
                inst.idle_since = Some(now);
            }
            if unused {
                inst.uses = inst.uses.saturating_sub(1);
                if inst.state == InstState::Draining && inst.used == 0 {
                    inst.state = InstState::Ready;
                }
            }
        });
    }

    fn commit_release(&mut self, lease: &Lease, now: Millis, broken: Option<&str>) {
        if self.restoring.remove(lease.id).is_some() {
            // Restored, not yet bound again (the first update has not come back).
            return;
        }
        let Some(LeaseState::Acquired { instance, slot }) =
            self.leases.remove(lease.id).map(|l| l.state)
        else {
            // A failed lease: acknowledged, and nothing of it is held.
            return;
        };
        self.acquired -= 1;
        let freed = Binding { instance, slot };
        self.free_slot(&freed, now, false);
        if let Some(cause) = broken
            && let Some(&key) = self.by_id.get(&freed.instance)
        {
            self.fail_instance(key, &format!("reported broken by a lease holder: {cause}"));
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::{Change, PoolCore, Write};
    use crate::{Lease, LeaseState, ScalerConfig};
    use flotilla_provider::{Instance, InstanceState};

    /// Two ready instances of two slots each.
    fn two_ready() -> PoolCore {
        let cfg = ScalerConfig {
            capacity_per_instance: 2,
            max_instances: 2,
            ..ScalerConfig::default()
        };
        let mut c = PoolCore::new(cfg, Vec::new(), 0);
        let _ = c.plan(0);
        let running = |id: &str| Instance {
            id: id.into(),
            state: InstanceState::Running,
        };
        c.on_update(0, Ok(vec![running("m1"), running("m2")].into()));
        c.on_ready(0, "m1", Ok(()));
        c.on_ready(0, "m2", Ok(()));
        c
    }

    /// Everything the pool knows, to compare before and after.
    fn view(c: &PoolCore) -> String {
        let leases: Vec<&Lease> = c.leases().collect();
        format!("{:?} {:?} {leases:?}", c.snapshot(0), c.instances())
    }

    /// Checks that planning changed nothing, commits, and checks that the pool then holds
    /// what the change's write said the journal must hold: the same lease (or none), and the
    /// same use count for its instance.
    fn commit_as_written(c: &mut PoolCore, before: &str, change: Change) -> u64 {
        assert_eq!(view(c), before, "planning changed the pool");
        let (id, lease, uses) = match change.write() {
            Write::Save(lease, uses) => (
                lease.id,
                Some(lease.clone()),
                uses.map(|(i, n)| (i.to_string(), n)),
            ),
            Write::Remove(id) => (id, None, None),
        };
        let done = c.commit(change);
        assert_eq!(done.id, id);
        assert_eq!(c.lease(id), lease.as_ref(), "memory and the write disagree");
        if let Some((instance, n)) = uses {
            assert_eq!(c.uses_of(&instance), Some(n), "use counts disagree");
        }
        id
    }

    #[test]
    fn a_plan_changes_nothing_and_its_commit_makes_what_its_write_says() {
        let mut c = two_ready();
        let before = view(&c);
        let plan = c.plan_reserve(1, BTreeMap::new(), None, None);
        let a = commit_as_written(&mut c, &before, plan.expect("reserve"));

        let before = view(&c);
        let plan = c.plan_acquire(2, a).expect("acquire").expect("a free slot");
        commit_as_written(&mut c, &before, plan);
        let bound = c.lease(a).map(|l| l.state.clone());
        assert!(
            matches!(bound, Some(LeaseState::Acquired { .. })),
            "{bound:?}"
        );

        // Given back unused: reserved again, and its instance's use with it.
        let before = view(&c);
        let plan = c.plan_unacquire(3, a).expect("bound");
        commit_as_written(&mut c, &before, plan);
        assert_eq!(c.lease(a).map(|l| &l.state), Some(&LeaseState::Reserved));
        assert_eq!(c.instances().iter().map(|i| i.use_count).sum::<u32>(), 0);

        let before = view(&c);
        let plan = c.plan_acquire(4, a).expect("acquire").expect("a free slot");
        commit_as_written(&mut c, &before, plan);
        let before = view(&c);
        let plan = c.plan_release(5, a, Some("docker is gone"));
        commit_as_written(&mut c, &before, plan.expect("release"));
        assert_eq!(c.snapshot(5).instances.get("failed"), Some(&1));

        let before = view(&c);
        let plan = c.plan_reserve(6, BTreeMap::new(), None, None);
        let b = commit_as_written(&mut c, &before, plan.expect("reserve"));
        let before = view(&c);
        let plan = c.plan_unreserve(b).expect("unreserve");
        commit_as_written(&mut c, &before, plan);

        // A reservation handed over by another pool keeps its id, and new ids follow it.
        let plan = c
            .plan_reserve(7, BTreeMap::new(), None, None)
            .expect("reserve");
        let mut handed = plan.lease().clone();
        handed.id = 40;
        let before = view(&c);
        let plan = c.plan_take_over(handed).expect("take over");
        commit_as_written(&mut c, &before, plan);
        let next = c.plan_reserve(8, BTreeMap::new(), None, None);
        assert_eq!(next.expect("reserve").lease().id, 41);
    }

    #[test]
    fn each_refusal_is_made_while_planning() {
        let mut c = two_ready();
        let a = c.reserve(1).expect("reserve");
        assert!(
            c.plan_release(2, a, None).is_err(),
            "a reservation released"
        );
        assert!(
            c.plan_release(2, 99, None).is_err(),
            "an unknown lease released"
        );
        assert!(c.plan_unreserve(99).is_err(), "an unknown lease unreserved");
        assert_eq!(c.plan_unacquire(2, a), None, "a reservation unbound");
        c.acquire(2, a).expect("acquire").expect("a free slot");
        assert!(c.plan_unreserve(a).is_err(), "an acquired lease unreserved");
        assert!(c.plan_acquire(3, a).is_err(), "acquired twice");
        let held = c.lease(a).cloned().expect("held");
        assert!(
            c.plan_take_over(held).is_err(),
            "an acquired lease taken over"
        );
    }
}
