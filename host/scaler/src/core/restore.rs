//! Leases across restarts and over time: restoring the journal's leases at start (reserved
//! ones wait again; acquired ones are bound to their instances again at the first update, or
//! failed if the instance is gone), lease ids that never repeat, and the lease TTL and maximum
//! job duration. It must not know where the journal lives.

use std::collections::HashMap;

use super::{InstState, Lease, LeaseState, PoolCore};
use crate::Millis;

impl PoolCore {
    /// Lease ids start here: an epoch-derived base (`now_ms * 1024`), so ids of an earlier
    /// process never name a lease of this one, and above every restored id.
    pub fn set_first_lease_id(&mut self, first: u64) {
        self.next_lease.at_least(first);
    }

    /// Takes lease ids from `ids`, shared with the process's other pools, so ids are unique
    /// across pools too; ids this core already promised to skip stay skipped.
    pub fn share_lease_ids(&mut self, ids: super::LeaseIds) {
        ids.at_least(self.next_lease.take());
        self.next_lease = ids;
    }

    /// Restores the journal's leases and instance use counts, before the first update. With a
    /// lease TTL, each restored lease gets a fresh one: its holder could not renew while the
    /// host was down.
    pub fn restore(&mut self, now: Millis, leases: Vec<Lease>, uses: HashMap<String, u32>) {
        self.restore_with_tenants(now, leases, uses, HashMap::new());
    }

    /// [`PoolCore::restore`], with the instances' tenant bindings.
    pub fn restore_with_tenants(
        &mut self,
        now: Millis,
        leases: Vec<Lease>,
        uses: HashMap<String, u32>,
        tenants: HashMap<String, String>,
    ) {
        self.tenants_seen |= !tenants.is_empty() || leases.iter().any(|l| l.tenant.is_some());
        self.restored_tenants = tenants;
        for mut lease in leases {
            if let Some(ttl) = self.cfg.lease_ttl_ms {
                lease.expires_at = Some(now.saturating_add(ttl));
            }
            self.next_lease.at_least(lease.id.saturating_add(1));
            self.counters.leases_restored += 1;
            match lease.state {
                LeaseState::Reserved => {
                    self.reserved += 1;
                    self.leases.insert(lease);
                }
                LeaseState::Acquired { .. } => {
                    self.restoring.insert(lease);
                }
                // A failed lease was acknowledged as failed; nothing holds a slot for it.
                LeaseState::Failed { .. } => {
                    self.leases.insert(lease);
                }
            }
        }
        self.restored_uses = uses;
    }

    /// At the first update: binds each restored acquired lease to its instance again (the
    /// instance is serving a job, so it is ready), or fails it when the instance is gone.
    pub(super) fn rebind_restored(&mut self, now: Millis) {
        self.restored_uses.clear();
        self.restored_tenants.clear();
        let restoring: Vec<Lease> = self.restoring.drain();
        for mut lease in restoring {
            let LeaseState::Acquired { instance, slot } = lease.state.clone() else {
                continue;
            };
            let key = self.by_id.get(&instance).copied();
            let bound = key.and_then(|key| {
                self.with_inst(key, |inst| {
                    if matches!(inst.state, InstState::Deleting | InstState::Failed) {
                        return None;
                    }
                    let want = slot as usize;
                    let free = match inst.slots.get(want) {
                        Some(None) => Some(want),
                        _ => inst.slots.iter().position(Option::is_none),
                    }?;
                    if let Some(cell) = inst.slots.get_mut(free) {
                        *cell = Some(lease.id);
                    }
                    inst.used += 1;
                    inst.idle_since = None;
                    if inst.tenant.is_none() {
                        inst.tenant = lease.tenant.clone();
                    }
                    if matches!(inst.state, InstState::Creating | InstState::Running) {
                        inst.state = InstState::Ready;
                        inst.ready_at = Some(now);
                    }
                    Some(free as u32)
                })
                .flatten()
            });
            match bound {
                Some(slot) => {
                    lease.state = LeaseState::Acquired { instance, slot };
                    self.acquired += 1;
                }
                None => {
                    lease.state = LeaseState::Failed {
                        cause: format!("instance {instance} was gone after the restart"),
                    };
                    self.counters.leases_lost += 1;
                    self.counters.leases_failed += 1;
                }
            }
            self.leases.insert(lease);
        }
    }

    /// Renews a lease's TTL; `false` when there is no such live lease.
    pub fn renew(&mut self, now: Millis, id: u64) -> Option<Millis> {
        let ttl = self.cfg.lease_ttl_ms?;
        let live = self
            .leases
            .get(id)
            .is_some_and(|l| !matches!(l.state, LeaseState::Failed { .. }));
        if !live {
            return None;
        }
        let until = now.saturating_add(ttl);
        self.leases
            .update(id, |lease| lease.expires_at = Some(until));
        Some(until)
    }

    /// When the next lease expires or runs past the maximum job duration.
    pub(super) fn next_lease_deadline(&self) -> Option<Millis> {
        self.leases.next_deadline()
    }

    /// Fails the leases past their TTL or the maximum job duration, freeing their slots.
    pub(super) fn expire_leases(&mut self, now: Millis) {
        let due: Vec<(u64, String)> = self
            .leases
            .due(now)
            .map(|l| {
                let cause = if l.deadline_at.is_some_and(|d| d <= now) {
                    "the lease ran past the deadline its holder set at the reservation (a job past its own timeout whose cleanup never came)".to_string()
                } else if l.expires_at.is_none_or(|e| now < e) {
                    "the job ran past the pool's max_job_duration".to_string()
                } else {
                    "the lease was not renewed within the pool's lease_ttl".to_string()
                };
                (l.id, cause)
            })
            .collect();
        for (id, cause) in due {
            tracing::warn!(lease = id, "{cause}");
            self.fail_lease(now, id, &cause);
            self.counters.leases_expired += 1;
        }
    }

    /// Fails one lease, freeing its slot or reservation.
    fn fail_lease(&mut self, now: Millis, id: u64, cause: &str) {
        let Some(state) = self.leases.get(id).map(|l| l.state.clone()) else {
            return;
        };
        match state {
            LeaseState::Reserved => self.reserved -= 1,
            LeaseState::Acquired { instance, slot } => {
                self.acquired -= 1;
                if let Some(&key) = self.by_id.get(&instance) {
                    self.with_inst(key, |inst| {
                        if let Some(cell) = inst.slots.get_mut(slot as usize) {
                            *cell = None;
                        }
                        inst.used = inst.used.saturating_sub(1);
                        if inst.used == 0 {
                            inst.idle_since = Some(now);
                        }
                    });
                }
            }
            LeaseState::Failed { .. } => return,
        }
        self.leases.update(id, |lease| {
            lease.state = LeaseState::Failed {
                cause: cause.to_string(),
            };
        });
        self.counters.leases_failed += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::super::{Action, Lease, LeaseState, PoolCore};
    use crate::ScalerConfig;
    use flotilla_provider::{Instance, InstanceState};

    fn lease(id: u64, state: LeaseState) -> Lease {
        Lease {
            id,
            state,
            reserved_at: 1,
            acquired_at: Some(2),
            labels: BTreeMap::new(),
            expires_at: None,
            deadline_at: None,
            tenant: None,
            handed_from: None,
        }
    }

    fn running(id: &str) -> Instance {
        Instance {
            id: id.into(),
            state: InstanceState::Running,
        }
    }

    #[test]
    fn restored_leases_wait_or_bind_again_and_a_gone_instance_fails_its_lease() {
        let cfg = ScalerConfig {
            capacity_per_instance: 2,
            ..ScalerConfig::default()
        };
        let mut c = PoolCore::new(cfg, Vec::new(), 0);
        c.restore(
            0,
            vec![
                lease(7, LeaseState::Reserved),
                lease(
                    8,
                    LeaseState::Acquired {
                        instance: "i-1".into(),
                        slot: 1,
                    },
                ),
                lease(
                    9,
                    LeaseState::Acquired {
                        instance: "i-gone".into(),
                        slot: 0,
                    },
                ),
            ],
            HashMap::from([("i-1".to_string(), 5)]),
        );
        c.set_first_lease_id(3);
        assert!(c.lease(8).is_some(), "visible before the first update");
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(0, Ok(vec![running("i-1")].into()));
        assert_eq!(
            c.lease(8).map(|l| l.state.clone()),
            Some(LeaseState::Acquired {
                instance: "i-1".into(),
                slot: 1
            })
        );
        assert!(matches!(
            c.lease(9).map(|l| &l.state),
            Some(LeaseState::Failed { .. })
        ));
        let views = c.instances();
        assert_eq!(
            (views[0].state, views[0].use_count, views[0].slots_used),
            (crate::core::InstState::Ready, 5, 1)
        );
        assert!(
            c.reserve(1).expect("reserve") >= 10,
            "ids continue after the restored ones"
        );
        assert_eq!(c.counters.leases_lost, 1);
        assert_eq!(c.check_invariants(), Ok(()));
        // The instance with a restored job is not scaled down under it.
        assert!(
            !c.plan(10_000_000)
                .iter()
                .any(|a| matches!(a, Action::Decrease(_)))
        );
    }

    #[test]
    fn a_lease_that_is_not_renewed_fails_and_frees_its_slot() {
        let cfg = ScalerConfig {
            lease_ttl_ms: Some(1_000),
            max_job_duration_ms: Some(60_000),
            ..ScalerConfig::default()
        };
        let keep = crate::Policy::new(vec!["* * * * *".into()], "UTC", 1, 3_600_000, 0.0, 0, false)
            .expect("a policy");
        let mut c = PoolCore::new(cfg, vec![keep], 0);
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(0, Ok(vec![running("i-1")].into()));
        c.plan(0);
        c.on_ready(0, "i-1", Ok(()));
        let id = c.reserve(0).expect("reserve");
        c.acquire(0, id).expect("acquire").expect("bound");
        assert_eq!(c.renew(900, id), Some(1_900));
        c.plan(1_899);
        assert!(matches!(
            c.lease(id).map(|l| &l.state),
            Some(LeaseState::Acquired { .. })
        ));
        assert_eq!(c.next_wakeup(1_000), 1_900);
        c.plan(1_900);
        assert!(
            matches!(c.lease(id).map(|l| &l.state), Some(LeaseState::Failed { cause }) if cause.contains("lease_ttl"))
        );
        assert_eq!(c.acquired_slots(), 0);
        assert_eq!(c.check_invariants(), Ok(()));
        // A job that keeps renewing still ends at the maximum job duration.
        let id = c.reserve(2_000).expect("reserve");
        c.acquire(2_000, id).expect("acquire").expect("bound");
        let mut t = 2_000;
        while t < 62_000 {
            c.renew(t, id);
            c.plan(t);
            t += 500;
        }
        c.plan(62_000);
        assert!(
            matches!(c.lease(id).map(|l| &l.state), Some(LeaseState::Failed { cause }) if cause.contains("max_job_duration"))
        );
    }

    #[test]
    fn a_lease_past_its_holders_deadline_fails_whatever_its_state_and_across_a_restart() {
        let keep = crate::Policy::new(vec!["* * * * *".into()], "UTC", 1, 3_600_000, 0.0, 0, false)
            .expect("a policy");
        let mut c = PoolCore::new(ScalerConfig::default(), vec![keep.clone()], 0);
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(0, Ok(vec![running("i-1")].into()));
        c.plan(0);
        c.on_ready(0, "i-1", Ok(()));
        // Acquired: the deadline counts from the reservation.
        let id = c
            .reserve_within(0, BTreeMap::new(), Some(5_000))
            .expect("reserve");
        c.acquire(100, id).expect("acquire").expect("bound");
        assert_eq!(c.lease(id).and_then(|l| l.deadline_at), Some(5_000));
        assert_eq!(c.next_wakeup(1_000), 5_000);
        c.plan(4_999);
        assert_eq!(c.acquired_slots(), 1);
        c.plan(5_000);
        assert!(
            matches!(c.lease(id).map(|l| &l.state), Some(LeaseState::Failed { cause }) if cause.contains("deadline")),
            "{:?}",
            c.lease(id)
        );
        assert_eq!(c.acquired_slots(), 0);
        // Reserved: it frees its reservation too.
        let reserved = c
            .reserve_within(6_000, BTreeMap::new(), Some(1_000))
            .expect("reserve");
        c.plan(7_000);
        assert!(matches!(
            c.lease(reserved).map(|l| &l.state),
            Some(LeaseState::Failed { .. })
        ));
        assert_eq!(c.check_invariants(), Ok(()));
        // The deadline is kept across a restart, not restarted.
        let held = c
            .reserve_within(8_000, BTreeMap::new(), Some(10_000))
            .expect("reserve");
        c.acquire(8_000, held).expect("acquire").expect("bound");
        let journal: Vec<_> = c.lease(held).cloned().into_iter().collect();
        let mut again = PoolCore::new(ScalerConfig::default(), vec![keep], 0);
        again.restore(9_000, journal, HashMap::new());
        again.plan(9_000);
        again.on_update(9_000, Ok(vec![running("i-1")].into()));
        again.plan(17_999);
        assert!(matches!(
            again.lease(held).map(|l| &l.state),
            Some(LeaseState::Acquired { .. })
        ));
        again.plan(18_000);
        assert!(matches!(
            again.lease(held).map(|l| &l.state),
            Some(LeaseState::Failed { .. })
        ));
        assert_eq!(again.check_invariants(), Ok(()));
    }
}
