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
        self.reserve_for(now, labels, deadline_after, None)
    }

    /// Like [`PoolCore::reserve_within`], for `tenant`: the lease is bound only to an instance
    /// no other tenant has used, and binds that instance to `tenant` for good.
    pub fn reserve_for(
        &mut self,
        now: Millis,
        labels: BTreeMap<String, String>,
        deadline_after: Option<Millis>,
        tenant: Option<String>,
    ) -> Result<u64, LeaseError> {
        let change = self.plan_reserve(now, labels, deadline_after, tenant)?;
        Ok(self.commit(change).id)
    }

    /// Whether a reservation with `labels` may join the pool: no live lease holds one of its
    /// labels, the pool runs, and it has a slot left.
    pub(super) fn admissible(&self, labels: &BTreeMap<String, String>) -> Result<(), LeaseError> {
        for (key, value) in labels {
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
        Ok(())
    }

    /// Binds a reserved lease to a ready slot; `Ok(None)` means "wait and try again".
    pub fn acquire(&mut self, now: Millis, id: u64) -> Result<Option<Binding>, LeaseError> {
        let Some(change) = self.plan_acquire(now, id)? else {
            return Ok(None);
        };
        Ok(self.commit(change).binding)
    }

    /// The instance with a free slot a lease of `tenant` may take: the fullest first, among
    /// those bound to `tenant` or to nobody. Without a tenant, any.
    pub(super) fn available_for(&self, tenant: Option<&str>) -> Option<u64> {
        let mut available = self.index.available.iter().map(|&(_, key)| key);
        match tenant {
            None => available.next(),
            Some(t) => available.find(|key| {
                self.insts
                    .get(key)
                    .is_some_and(|inst| inst.tenant.as_deref().is_none_or(|bound| bound == t))
            }),
        }
    }

    /// Reserved leases of a tenant that no free slot they may take is waiting for: the
    /// instances that must be added for them, in slots. Free slots of instances bound to
    /// another tenant do not count; unbound ones (ready or coming) serve any tenant.
    pub(super) fn unplaced_tenant_slots(&self) -> u32 {
        if !self.tenants_seen {
            return 0;
        }
        let mut waiting: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        for lease in self.leases.values() {
            if let (LeaseState::Reserved, Some(t)) = (&lease.state, lease.tenant.as_deref()) {
                *waiting.entry(t).or_default() += 1;
            }
        }
        if waiting.is_empty() {
            return 0;
        }
        let capacity = self.capacity();
        let mut open = (self.pending.len() as u32).saturating_mul(capacity);
        for inst in self.insts.values() {
            if !matches!(
                inst.state,
                InstState::Creating | InstState::Running | InstState::Ready
            ) {
                continue;
            }
            let free = capacity.saturating_sub(inst.used);
            match inst.tenant.as_deref().and_then(|t| waiting.get_mut(t)) {
                Some(w) => *w = w.saturating_sub(free),
                None if inst.tenant.is_none() => open = open.saturating_add(free),
                None => {}
            }
        }
        waiting.values().sum::<u32>().saturating_sub(open)
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

    /// Drops a reservation that got no job (or a failed lease), by the rules of
    /// [`PoolCore::plan_unreserve`].
    pub fn unreserve(&mut self, id: u64) -> Result<(), LeaseError> {
        let change = self.plan_unreserve(id)?;
        self.commit(change);
        Ok(())
    }

    /// Frees an acquired slot (a failed lease is acknowledged and forgotten), by the rules of
    /// [`PoolCore::plan_release`].
    pub fn release(&mut self, now: Millis, id: u64) -> Result<(), LeaseError> {
        let change = self.plan_release(now, id, None)?;
        self.commit(change);
        Ok(())
    }

    /// Releases an acquired lease whose client found its instance broken (e.g. the job left
    /// Docker unreachable): the instance is failed with `cause`, so no other lease gets it and
    /// it is replaced.
    pub fn release_broken(&mut self, now: Millis, id: u64, cause: &str) -> Result<(), LeaseError> {
        let change = self.plan_release(now, id, Some(cause))?;
        self.commit(change);
        Ok(())
    }

    /// Jobs an instance has taken (for the journal).
    pub fn uses_of(&self, instance: &str) -> Option<u32> {
        let key = self.by_id.get(instance)?;
        self.insts.get(key).map(|i| i.uses)
    }

    /// Undoes a binding nobody received (the acquire's caller left between the grant and the
    /// answer): the lease is reserved again and its slot and use are given back.
    pub fn unacquire(&mut self, now: Millis, id: u64) {
        if let Some(change) = self.plan_unacquire(now, id) {
            self.commit(change);
        }
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::super::{Action, PoolCore};
    use crate::ScalerConfig;
    use flotilla_provider::{Instance, InstanceState};

    /// A pool of one ready instance `m1` (one slot), room for two more.
    fn one_ready() -> PoolCore {
        with_m1_ready(empty())
    }

    fn empty() -> PoolCore {
        let cfg = ScalerConfig {
            capacity_per_instance: 1,
            max_instances: 3,
            ..ScalerConfig::default()
        };
        PoolCore::new(cfg, Vec::new(), 0)
    }

    /// `c` after its first update lists `m1`, and `m1` is ready.
    fn with_m1_ready(mut c: PoolCore) -> PoolCore {
        let _ = c.plan(0);
        let m1 = [Instance {
            id: "m1".into(),
            state: InstanceState::Running,
        }];
        c.on_update(0, Ok(m1.to_vec().into()));
        c.on_ready(0, "m1", Ok(()));
        c
    }

    fn reserve(c: &mut PoolCore, tenant: Option<&str>) -> u64 {
        c.reserve_for(1, BTreeMap::new(), None, tenant.map(str::to_string))
            .expect("reserve")
    }

    fn increase(c: &mut PoolCore, now: u64) -> Option<u32> {
        c.plan(now).into_iter().find_map(|a| match a {
            Action::Increase(n) => Some(n),
            _ => None,
        })
    }

    #[test]
    fn an_instance_serves_only_the_first_tenant_it_served_and_another_gets_a_new_one() {
        let mut c = one_ready();
        let a = reserve(&mut c, Some("project-1"));
        let bound = c.acquire(1, a).expect("acquire").expect("a slot");
        assert_eq!(bound.instance, "m1");
        c.release(2, a).expect("release");
        assert_eq!(
            c.instances()[0].tenant.as_deref(),
            Some("project-1"),
            "bound for its life"
        );

        // m1 is free, but it served project 1: project 1's protected ref may not have it,
        // and the pool asks for an instance for it.
        let b = reserve(&mut c, Some("project-1-protected"));
        assert_eq!(c.acquire(3, b).expect("acquire"), None);
        assert_eq!(increase(&mut c, 3), Some(1));
        // Project 1 takes it again at once; a lease without a tenant may take any.
        let again = reserve(&mut c, Some("project-1"));
        assert_eq!(
            c.acquire(4, again).expect("acquire").map(|b| b.instance),
            Some("m1".to_string())
        );
        c.release(5, again).expect("release");
        let anyone = reserve(&mut c, None);
        assert_eq!(
            c.acquire(6, anyone).expect("acquire").map(|b| b.instance),
            Some("m1".to_string())
        );
    }

    #[test]
    fn a_binding_restored_from_the_journal_holds_for_an_idle_instance() {
        let mut c = empty();
        c.restore_with_tenants(
            0,
            Vec::new(),
            HashMap::new(),
            HashMap::from([("m1".to_string(), "project-7".to_string())]),
        );
        let mut c = with_m1_ready(c);
        let other = reserve(&mut c, Some("project-8"));
        assert_eq!(c.acquire(1, other).expect("acquire"), None);
        let own = reserve(&mut c, Some("project-7"));
        assert_eq!(
            c.acquire(2, own).expect("acquire").map(|b| b.instance),
            Some("m1".to_string())
        );
    }
}
